//! `oncebox serve`: the gateway on the configured database, with retention purges and a
//! graceful shutdown on SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use metrics_exporter_prometheus::PrometheusBuilder;
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, Retention, SystemClock};
use oncebox_gateway::policy::GatewayConfig;
use oncebox_gateway::{Gateway, router, serve};
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::open_store;

/// How often terminal records past their retention are purged.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

pub async fn run(settings: Settings) -> Result<()> {
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let (inbox, path) = open_store(&settings.database)?;
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("binding {}", settings.listen))?;
    let local = listener.local_addr()?;
    let config = settings.gateway;
    let limits = config.limits.clone();
    let retention = retention(&config);
    if config.open_sources {
        tracing::warn!(
            "no sources configured: accepting any source name WITHOUT signature checks (loopback only)"
        );
    }
    announce(&local, &path, &config);
    let gw = Arc::new(Gateway {
        store: inbox.clone(),
        config,
        clock: Arc::new(SystemClock),
        metrics: Some(metrics),
        loopback_only: local.ip().is_loopback(),
    });
    let purger = tokio::spawn(purge_forever(inbox.clone(), retention));
    serve(listener, router(gw), limits, shutdown_signal()).await?;
    purger.abort();
    tracing::info!("stopped");
    Ok(())
}

fn retention(config: &GatewayConfig) -> Retention {
    let mut r = Retention::default();
    for (source, policy) in &config.sources {
        // Already checked against the redelivery horizon when the configuration was loaded.
        let _ = r.set(source.clone(), policy.retention, None);
    }
    r
}

async fn purge_forever(store: oncebox_sqlite::Inbox, retention: Retention) {
    let mut tick = tokio::time::interval(PURGE_EVERY);
    loop {
        tick.tick().await;
        match EventStore::purge(&store, SystemClock.now(), &retention).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(purged = n, "retention purge"),
            Err(e) => tracing::warn!(error = %e, "retention purge failed; will retry"),
        }
    }
}

fn announce(local: &std::net::SocketAddr, path: &std::path::Path, config: &GatewayConfig) {
    use std::io::Write;
    let source = config.sources.keys().next().map_or("demo", |s| s.as_str());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "oncebox listening on http://{local} (SQLite {})",
        path.display()
    );
    if config.open_sources {
        let _ = writeln!(
            out,
            "try:  curl -i -X POST http://{local}/v1/sources/{source}/events \\\n        -H 'content-type: application/json' -d '{{\"id\":\"evt_1\",\"amount\":100}}'"
        );
    } else {
        let _ = writeln!(out, "send a signed test event:  oncebox send {source}");
    }
    let _ = writeln!(
        out,
        "events:  curl -s http://{local}/v1/events   (admin API)"
    );
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        () = terminate => {}
    }
    tracing::info!("shutdown requested");
}
