//! `oncebox consume`: the configured `[consumers]` read RabbitMQ queues and NATS JetStream
//! streams into the store — each message stored once, with one delivery per matching route,
//! exactly as the gateway stores a webhook — and reconnect after broker failures until SIGINT
//! or SIGTERM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use oncebox_core::consume::Counts;
use oncebox_core::retention::DEFAULT_RETENTION;
use tokio::sync::watch;

use crate::config::{Broker, ConsumerSpec, Settings};
use crate::serve::{Stop, wait_for};
use crate::store::Store;

mod ingesting;
mod supervise;
mod urls;

use ingesting::Ingesting;
use supervise::watch_consumers;
use urls::{amqp_url, nats_url};

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs every configured consumer whose broker was given a URL.
pub async fn run(settings: Settings, amqp: Option<String>, nats: Option<String>) -> Result<()> {
    if amqp.is_none() && nats.is_none() {
        return Err(crate::exit::usage(
            "give --amqp URL and/or --nats URL (or ONCEBOX_AMQP_URL / ONCEBOX_NATS_URL)",
        ));
    }
    let amqp_uri = amqp.as_deref().map(amqp_url).transpose()?;
    if let Some(url) = &nats {
        nats_url(url)?;
    }
    // What `check` says, said where the consumers run apart (a loop, a source nobody routes).
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let shutdown = Stop::listen();
    // Which consumers run is settled before the store opens: with none, no database is touched.
    let mut runs = Vec::new();
    for spec in settings.consumers {
        let url = match &spec.broker {
            Broker::Amqp { .. } => amqp.clone(),
            Broker::Nats { .. } => nats.clone(),
        };
        match url {
            Some(url) => runs.push((spec, url)),
            None => tracing::warn!(consumer = %spec.name, "skipped: no URL given for its broker"),
        }
    }
    if runs.is_empty() {
        return Err(crate::exit::usage(
            "no [consumers] to run with the brokers given",
        ));
    }
    // Not created: started in another directory, or on a mistyped path, the consumers would
    // acknowledge messages into a database that no gateway or relay reads.
    let opening = Store::open_existing(
        &settings.database,
        crate::store::Schema::Migrate,
        &settings.storage,
    );
    let Some(store) = shutdown.before(opening).await else {
        tracing::info!("stopped before the consumers started");
        return Ok(());
    };
    let store = store?;
    let config = Arc::new(settings.gateway);
    let (stop, stopped) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for (spec, url) in runs {
        let apply = Ingesting {
            store: store.clone(),
            config: config.clone(),
        };
        let stopped = stopped.clone();
        match &spec.broker {
            Broker::Amqp { .. } => {
                // Read at the start above whenever an AMQP URL was given.
                if let Some(uri) = amqp_uri.clone() {
                    tasks.spawn(amqp_forever(spec, uri, apply, stopped));
                }
            }
            Broker::Nats { .. } => {
                tasks.spawn(nats_forever(spec, url, apply, stopped));
            }
        }
    }
    tracing::info!(consumers = tasks.len(), "consuming");
    watch_consumers(tasks, shutdown.requested(), stop)
        .await
        .map_err(anyhow::Error::msg)?;
    tracing::info!("consumers stopped");
    Ok(())
}

async fn amqp_forever(
    spec: ConsumerSpec,
    uri: lapin::uri::AMQPUri,
    apply: Ingesting,
    stopped: watch::Receiver<bool>,
) {
    let Broker::Amqp {
        queue,
        quarantine,
        prefetch,
    } = &spec.broker
    else {
        return;
    };
    let mut options = oncebox_amqp::ConsumerOptions::new(queue, spec.rules.clone(), quarantine);
    options.prefetch = *prefetch;
    options.retry = spec.retry;
    let consumer = oncebox_amqp::Consumer::new(apply, options);
    let _tally = Tally::start(&spec.name, consumer.counts());
    let mut backoff = Duration::from_secs(1);
    while !*stopped.borrow() {
        // A broker that accepts TCP and never answers holds the handshake: lapin has no
        // deadline of its own, so a stop request must not wait behind it, and the handshake
        // is given up after the URL's `connection_timeout` (which lapin applies to the TCP
        // connect only), or 30 s. Without one, a broker host gone silently mid-handshake (no
        // reset: a power loss, a partition) held the consumer for good, consuming nothing,
        // saying nothing. What is given up is only dropped: lapin's I/O loop for it ends when
        // the peer closes or the system gives up on the connection, not before.
        let wait = uri
            .query
            .connection_timeout
            .map_or(HANDSHAKE_WAIT, Duration::from_millis);
        let connect = || {
            let props = lapin::ConnectionProperties::default();
            tokio::time::timeout(wait, lapin::Connection::connect_uri(uri.clone(), props))
        };
        // Two connections: one reading and acknowledging, one publishing the quarantine's
        // copies, which a broker alarm blocks alone (`Consumer::run_apart`).
        let both = async { (connect().await, connect().await) };
        let (conn, publishing) = tokio::select! {
            both = both => both,
            () = wait_for(stopped.clone()) => break,
        };
        let conn = conn.and_then(|c| publishing.map(|p| c.and_then(|c| p.map(|p| (c, p)))));
        let ended = match conn {
            Err(_) => Err(format!(
                "no AMQP handshake within {wait:?}: the broker took the connection and did \
                 not answer"
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok((conn, publishing))) => {
                tracing::info!(consumer = %spec.name, %queue, "consuming from RabbitMQ");
                let started = Instant::now();
                let r = consumer
                    .run_apart(&conn, &publishing, wait_for(stopped.clone()))
                    .await;
                if r.as_ref()
                    .is_err_and(oncebox_amqp::ConsumeError::unreadable_message)
                {
                    tracing::error!(
                        consumer = %spec.name, %queue,
                        "a message in the queue cannot be read by this client (text that is no \
                         UTF-8 in its properties, such as message_id, content_type or a header's \
                         name, or in its exchange or routing key); \
                         the broker hands it back at each connection and it blocks the queue: \
                         move it aside (a quorum queue's x-delivery-limit with a dead-letter \
                         exchange does, with the messages prefetched beside it)"
                    );
                }
                if let Err(e @ oncebox_amqp::ConsumeError::QuarantineMissing(_)) = &r {
                    // Only the broker's setup ends this: said loudly, and tried again in case
                    // the operator declares the exchange meanwhile.
                    tracing::error!(consumer = %spec.name, error = %e, "RabbitMQ consumer refused to start");
                }
                earned_a_fresh_start(started, &mut backoff);
                // A broker that stopped reading (a memory alarm blocks a publishing
                // connection) would hold the close's reply until its heartbeat gives up.
                let closes = async {
                    tokio::join!(
                        conn.close(200, "shutdown".into()),
                        publishing.close(200, "shutdown".into())
                    )
                };
                let _ = tokio::time::timeout(CLOSE_WAIT, closes).await;
                r.map_err(|e| e.to_string())
            }
        };
        if let Err(e) = ended {
            tracing::warn!(consumer = %spec.name, error = %e, retry_in = ?backoff, "RabbitMQ consumer stopped; reconnecting");
            pause(&mut backoff, &stopped).await;
        }
    }
}

async fn nats_forever(
    spec: ConsumerSpec,
    url: String,
    apply: Ingesting,
    stopped: watch::Receiver<bool>,
) {
    let Broker::Nats {
        stream,
        subject,
        durable,
        quarantine,
        batch,
        ack_wait,
    } = &spec.broker
    else {
        return;
    };
    let mut options =
        oncebox_nats::ConsumerOptions::new(stream, durable, spec.rules.clone(), quarantine);
    options.filter_subject = subject.clone();
    options.batch = *batch;
    options.ack_wait = *ack_wait;
    options.retry = spec.retry;
    options.deliver_from = oncebox_nats::DeliverFrom::Retention(new_durable_horizon(
        apply
            .config
            .source(&spec.rules.source)
            .map_or(DEFAULT_RETENTION, |p| p.retention),
    ));
    let consumer = oncebox_nats::Consumer::new(apply, options);
    let _tally = Tally::start(&spec.name, consumer.counts());
    let mut backoff = Duration::from_secs(1);
    while !*stopped.borrow() {
        let connected = tokio::select! {
            c = connect_nats(&url) => c,
            () = wait_for(stopped.clone()) => break,
        };
        let ended = match connected {
            Ok(client) => {
                tracing::info!(consumer = %spec.name, %stream, "consuming from NATS JetStream");
                let started = Instant::now();
                let js = async_nats::jetstream::new(client);
                let r = consumer.run(&js, wait_for(stopped.clone())).await;
                earned_a_fresh_start(started, &mut backoff);
                match r {
                    // Only a change of the configuration or of the durable ends these: said
                    // loudly, and tried again in case the operator fixed it meanwhile.
                    Err(
                        e @ (oncebox_nats::ConsumeError::QuarantineReadBack { .. }
                        | oncebox_nats::ConsumeError::QuarantineUnstored { .. }
                        | oncebox_nats::ConsumeError::UnsafeDurable { .. }
                        | oncebox_nats::ConsumeError::Unordered { .. }
                        | oncebox_nats::ConsumeError::Retry(_)),
                    ) => {
                        tracing::error!(consumer = %spec.name, error = %e, "NATS consumer refused to start");
                        Err(e.to_string())
                    }
                    r => r.map(drop).map_err(|e| e.to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = ended {
            tracing::warn!(consumer = %spec.name, error = %e, retry_in = ?backoff, "NATS consumer stopped; reconnecting");
            pause(&mut backoff, &stopped).await;
        }
    }
}

/// How often a consumer's counts are logged while they change.
const TALLY_EVERY: Duration = Duration::from_secs(60);

/// A consumer's counts in the log: once a minute while they change, and its totals when it is
/// dropped (the consumer stopped). `consume` serves no metrics, so this is how an operator sees
/// what it applied, skipped and quarantined.
struct Tally {
    name: String,
    counts: watch::Receiver<Counts>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Tally {
    fn start(name: &str, counts: watch::Receiver<Counts>) -> Tally {
        let (name, watched) = (name.to_owned(), counts.clone());
        let ticker = tokio::spawn({
            let name = name.clone();
            async move {
                let mut logged = Counts::default();
                let mut every = tokio::time::interval(TALLY_EVERY);
                every.tick().await;
                loop {
                    every.tick().await;
                    let now = *watched.borrow();
                    if now != logged {
                        log_counts(&name, &now, "consumer counts");
                        logged = now;
                    }
                }
            }
        });
        Tally {
            name,
            counts,
            ticker,
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.ticker.abort();
        log_counts(&self.name, &self.counts.borrow(), "consumer totals");
    }
}

/// A client of the NATS server at `url`, with the credentials the URL names (which the client
/// would not send by itself).
async fn connect_nats(url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    let (options, server) = oncebox_nats::with_credentials(async_nats::ConnectOptions::new(), url);
    options.connect(server).await
}

fn log_counts(name: &str, c: &Counts, what: &str) {
    tracing::info!(
        consumer = %name,
        applied = c.applied,
        duplicates = c.duplicates,
        stale = c.stale,
        quarantined = c.quarantined,
        requeued = c.requeued,
        ack_failures = c.ack_failures,
        in_progress = c.in_progress,
        "{what}"
    );
}

/// How far back a NATS durable the consumer creates starts: the source's retention, less the
/// time a new durable may take to catch up (a tenth, at most an hour). A message older than the
/// retention may have been applied and had its record purged, so reading it would apply it
/// again; one near the edge may lose its record while the durable is still catching up.
fn new_durable_horizon(retention: Duration) -> Duration {
    retention.saturating_sub((retention / 10).min(Duration::from_secs(3600)))
}

/// A consumer that ran this long before it stopped starts its reconnection waits afresh; one
/// that stops at once (refused, or a broker that drops it) keeps doubling them.
const FRESH_START_AFTER: Duration = Duration::from_secs(30);

/// The longest wait for a broker to confirm a connection's close on the way out.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// The longest wait for a broker's AMQP handshake when the URL names no `connection_timeout`.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(30);

fn earned_a_fresh_start(started: Instant, backoff: &mut Duration) {
    if started.elapsed() >= FRESH_START_AFTER {
        *backoff = Duration::from_secs(1);
    }
}

/// Waits `backoff` (or until shutdown), then doubles it up to `MAX_BACKOFF`.
async fn pause(backoff: &mut Duration, stopped: &watch::Receiver<bool>) {
    let _ = tokio::time::timeout(*backoff, wait_for(stopped.clone())).await;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_durable_starts_inside_the_retention_by_its_catch_up_margin() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            new_durable_horizon(DEFAULT_RETENTION),
            DEFAULT_RETENTION - hour
        );
        assert_eq!(new_durable_horizon(hour), hour - hour / 10);
        assert_eq!(new_durable_horizon(Duration::ZERO), Duration::ZERO);
    }
}
