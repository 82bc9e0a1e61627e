//! `oncebox serve`: the gateway on the configured database, with retention purges and a
//! graceful shutdown on SIGINT, SIGTERM or SIGHUP (a second one stops at once).

mod background;
#[cfg(unix)]
mod files;
mod signals;

pub(crate) use background::ended_how as ended;
pub(crate) use signals::{Stop, wait_for};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, Retention, SystemClock};
use oncebox_gateway::policy::GatewayConfig;
use oncebox_gateway::{Gateway, meter, router, serve};
use oncebox_relay::Relay;
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::store::{Store, describe};
use background::Background;

/// How often terminal records past their retention are purged.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Runs the gateway, and the relay in the same process when `with_relay` and routes exist.
pub async fn run(settings: Settings, with_relay: bool) -> Result<()> {
    let shutdown = Stop::listen();
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    #[cfg(unix)]
    files::raise_open_files(settings.gateway.limits.connections);
    let starting = async {
        // The port first: a start that cannot listen (another gateway has the port) must leave
        // the database as it found it, neither created nor migrated under the gateway that
        // keeps it. Connections that arrive while the store opens wait in the listen backlog.
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("binding {}", settings.listen))?;
        let inbox = Store::open_with(&settings.database, &settings.storage).await?;
        anyhow::Ok((inbox, listener))
    };
    let Some(started) = shutdown.before(starting).await else {
        tracing::info!("stopped before the gateway started");
        return Ok(());
    };
    let (inbox, listener) = started?;
    let database = describe(&settings.database);
    let metrics = oncebox_gateway::meter::recorder()
        .install_recorder()
        .context("installing the metrics recorder")?;
    let local = listener.local_addr()?;
    // As `purge` without `--retention`: a source the configuration does not name is kept
    // (another gateway's in a shared database), unless it names no `[sources]` at all.
    let retention = crate::events::retention(&settings, None);
    let config = settings.gateway;
    let limits = config.limits.clone();
    let routes = config.routes.clone();
    let relay_options = settings.relay;
    announce(&local, &database, &config);
    if config.admin_token.is_none() && local.ip().to_canonical().is_loopback() {
        // A reverse proxy on this machine that names the gateway by its loopback address and
        // adds no forwarding header (nginx's `proxy_pass` without `proxy_set_header`) cannot
        // be told from a local browser.
        tracing::warn!(
            "no admin_token: the admin API and the dashboard answer any request that reaches \
             this port addressed to a loopback name without a forwarding header; set \
             admin_token before putting a reverse proxy in front of it"
        );
    }
    let gw = Arc::new(Gateway {
        store: inbox.clone(),
        config,
        clock: Arc::new(SystemClock),
        metrics: Some(metrics.clone()),
        // `[::ffff:127.0.0.1]` is loopback too, as the configuration's check of `listen` says.
        loopback_only: local.ip().to_canonical().is_loopback(),
        logouts: Default::default(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relay = (with_relay && !routes.is_empty()).then(|| {
        let relay = Relay::new(inbox.clone(), routes, Arc::new(SystemClock), relay_options);
        let stopped = stopped.clone();
        tokio::spawn(async move { relay.run(wait_for(stopped)).await })
    });
    let background = Background {
        relay,
        purge: tokio::spawn(purge_forever(inbox.clone(), retention)),
        // The recorder keeps histogram samples until they are folded in: without this, memory
        // grows with every request while nobody scrapes `/metrics`.
        upkeep: tokio::spawn(meter::upkeep(metrics, meter::UPKEEP_EVERY)),
    };
    let app = router(gw);
    watched(
        listener,
        app,
        limits,
        shutdown.requested(),
        background,
        stop,
    )
    .await?;
    tracing::info!("stopped");
    Ok(())
}

/// Serves `app` until `shutdown` or until a task of `background` ends before it (an error,
/// then, once in-flight requests are done), telling the relay to stop through `stop`.
async fn watched(
    listener: TcpListener,
    app: axum::Router,
    limits: oncebox_gateway::policy::Limits,
    shutdown: impl Future<Output = ()> + Send,
    mut background: Background,
    stop: tokio::sync::watch::Sender<bool>,
) -> Result<()> {
    let grace = limits.shutdown_grace;
    let mut died = None;
    serve(listener, app, limits, async {
        died = background.watch(shutdown).await;
        match &died {
            Some(what) => tracing::error!(
                "{what}: stopping the gateway, up to {} for requests in progress \
                 (limits.shutdown_grace), to exit with an error",
                humantime::format_duration(grace)
            ),
            None => tracing::info!(
                "waiting for requests in progress, up to {} (limits.shutdown_grace); signal \
                 again to stop now",
                humantime::format_duration(grace)
            ),
        }
        // The relay says what it waits for once it sees the stop.
        let _ = stop.send(true);
    })
    .await?;
    let finished = background.finish().await;
    if let Some(what) = died {
        bail!("{what}");
    }
    // A relay that did not end well leaves its deliveries queued in the store; the exit status
    // says they were not served.
    if let Err(what) = finished {
        tracing::error!("{what}");
        bail!("{what}");
    }
    Ok(())
}

/// `oncebox relay`: the relay alone, for deployments that run it apart from the gateway.
pub async fn relay_only(settings: Settings) -> Result<()> {
    let shutdown = Stop::listen();
    // What `check` says, said where the relay runs apart (a loop, a lease too short).
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let routes = settings.gateway.routes;
    // Before the store opens: a relay with nothing to deliver touches no database.
    if routes.is_empty() {
        return Err(crate::exit::usage(
            "no [routes] configured: nothing to deliver",
        ));
    }
    // Not created: started in another directory, or on a mistyped path, the relay would poll
    // an empty database of its own while the gateway's deliveries wait.
    let opening = Store::open_existing(
        &settings.database,
        crate::store::Schema::Migrate,
        &settings.storage,
    );
    let Some(inbox) = shutdown.before(opening).await else {
        tracing::info!("stopped before the relay started");
        return Ok(());
    };
    let inbox = inbox?;
    tracing::info!(routes = routes.len(), database = %describe(&settings.database), "relay running");
    let relay = Relay::new(inbox, routes, Arc::new(SystemClock), settings.relay);
    let stop = shutdown.requested();
    // On a task of its own, as `serve` runs it: a panic in it is then an error (exit 1, said in
    // the log), not an unwinding out of the runtime (exit 101, on stderr alone).
    if let Err(e) = tokio::spawn(async move { relay.run(stop).await }).await {
        return Err(anyhow::anyhow!(ended("the relay", Err(e))));
    }
    tracing::info!("relay stopped");
    Ok(())
}

async fn purge_forever(store: Store, retention: Retention) {
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

fn announce(local: &std::net::SocketAddr, database: &str, config: &GatewayConfig) {
    use std::io::Write;
    let source = config.sources.keys().next().map_or("demo", |s| s.as_str());
    let mut out = crate::out::stdout();
    let _ = writeln!(out, "oncebox listening on http://{local} ({database})");
    if config.open_sources {
        // Not the README's `evt_1`: its next step sends that id with another payload, which
        // this example, run first, would turn into a 422.
        let _ = writeln!(
            out,
            "try:  curl -i -X POST http://{local}/v1/sources/{source}/events \\\n        -H 'content-type: application/json' -d '{{\"id\":\"evt_curl_1\",\"amount\":100}}'"
        );
    } else {
        let _ = writeln!(out, "send a signed test event:  oncebox send {source}");
    }
    // With a token the admin API answers nothing else. Named by the variable when it came
    // from one (the shell fills it in, if it is the shell's), else only pointed to: the value
    // is never printed.
    let from_variable = |token: &String| {
        std::env::var_os("ONCEBOX_ADMIN_TOKEN")
            .is_some_and(|v| v.as_encoded_bytes() == token.as_bytes())
    };
    let token = match &config.admin_token {
        None => "",
        // The variable's own value, not one a flag set over it.
        Some(token) if from_variable(token) => " -H \"authorization: Bearer $ONCEBOX_ADMIN_TOKEN\"",
        Some(_) => " -H 'authorization: Bearer <your admin_token>'",
    };
    let _ = writeln!(
        out,
        "events:  curl -s{token} http://{local}/v1/events   (admin API)"
    );
}

#[cfg(test)]
mod tests {
    use oncebox_core::Source;
    use oncebox_core::retention::DEFAULT_RETENTION;

    use crate::config::tests::ok;

    /// The hourly purge keeps a source the configuration does not name (another gateway's in
    /// a shared database), but not a consumer's source it does not name in `[sources]`: its
    /// messages are this configuration's. Zero-config, every source keeps the default.
    #[test]
    fn the_hourly_purge_keeps_unnamed_sources_unless_they_are_its_own() {
        let source = |name| Source::new(name).unwrap();
        let settings = ok(r#"
[sources.shop]
signature = "none"
retention = "30d"

[consumers.orders]
source = "orders"
queue = "orders"
key = "message-id"
quarantine = "oncebox.quarantine"
"#);
        let named = crate::events::retention(&settings, None);
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(named.for_source(&source("shop")), 30 * day);
        assert_eq!(named.for_source(&source("orders")), DEFAULT_RETENTION);
        assert_eq!(
            named.for_source(&source("elsewhere")),
            crate::events::UNNAMED_KEPT
        );
        // Given a retention, a purge keeps a consumer's unnamed source for it, as any other.
        let month = crate::events::retention(&settings, Some(30 * day));
        assert_eq!(month.for_source(&source("orders")), 30 * day);
        // Never shorter than the 7 days a new NATS durable starts back at, nor taken for no
        // retention given when it is as long as the unnamed are kept.
        let short = crate::events::retention(&settings, Some(3 * day));
        assert_eq!(short.for_source(&source("orders")), DEFAULT_RETENTION);
        assert_eq!(short.for_source(&source("elsewhere")), 3 * day);
        let ever = crate::events::UNNAMED_KEPT;
        let century = crate::events::retention(&settings, Some(ever));
        assert_eq!(century.for_source(&source("orders")), ever);
        let open = crate::events::retention(&ok(""), None);
        assert_eq!(open.for_source(&source("elsewhere")), DEFAULT_RETENTION);
    }
}
