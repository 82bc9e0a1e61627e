//! The `oncebox` binary: command line, configuration, and the wiring of the backends.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::{EventFilter, EventStore};
use oncebox_core::{Clock, Key, RecordState, Retention, SystemClock};

mod bench;
mod config;
mod consume;
mod deliveries;
mod send;
mod serve;
mod store;

use store::Store;

/// Make the effect of an at-least-once event happen once.
///
/// Configuration comes from `oncebox.toml` (or --config / ONCEBOX_CONFIG), then ONCEBOX_*
/// environment variables, then flags. With no configuration, `serve` accepts any source on
/// 127.0.0.1:8080 without signature checks and stores in ./oncebox.db.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Configuration file (default ./oncebox.toml when it exists).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Where events are kept: sqlite://PATH or postgres://USER@HOST/DB [default:
    /// sqlite://oncebox.db]
    #[arg(long, global = true)]
    database: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway.
    ///
    /// Example: `oncebox serve` then
    /// `curl -X POST localhost:8080/v1/sources/demo/events -d '{"id":"evt_1"}'`
    Serve {
        /// Address to listen on [default: 127.0.0.1:8080]
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Bearer token of the admin API (or ONCEBOX_ADMIN_TOKEN).
        #[arg(long)]
        admin_token: Option<String>,
        /// Do not run the relay in this process (run `oncebox relay` elsewhere).
        #[arg(long)]
        no_relay: bool,
    },
    /// Read the configured [consumers] from RabbitMQ and NATS JetStream into the store: each
    /// message stored once and acknowledged after the commit; poison goes to the quarantine.
    ///
    /// Example: `oncebox consume --amqp amqp://guest:guest@127.0.0.1:5672/%2f`
    Consume {
        /// RabbitMQ URL for the consumers with a `queue`.
        #[arg(long, env = "ONCEBOX_AMQP_URL", hide_env_values = true)]
        amqp: Option<String>,
        /// NATS URL for the consumers with a `stream`.
        #[arg(long, env = "ONCEBOX_NATS_URL", hide_env_values = true)]
        nats: Option<String>,
    },
    /// Run the relay alone: deliver accepted events to the configured routes.
    Relay,
    /// Inspect and settle deliveries.
    ///
    /// Example: `oncebox deliveries list --state uncertain` then
    /// `oncebox deliveries resolve 42 --delivered --note "confirmed with the receiver"`
    Deliveries {
        #[command(subcommand)]
        action: DeliveriesCommand,
    },
    /// Deliver an event to its routes again, with the same idempotency key.
    Redeliver { source: String, event_id: String },
    /// Validate the configuration and describe it; names the bad field if any.
    Check,
    /// Sign a test event with a source's scheme and send it to the running gateway.
    ///
    /// Example: `oncebox send stripe --id evt_123`
    Send {
        source: String,
        /// Event id [default: evt_test_<millis>]
        #[arg(long)]
        id: Option<String>,
        /// JSON body [default: a small test event carrying the id]
        #[arg(long)]
        body: Option<String>,
        /// Gateway base URL [default: http://<listen>]
        #[arg(long)]
        url: Option<String>,
    },
    /// Load the running gateway with new and duplicate events, report requests/s and latency,
    /// then check that every accepted key is stored exactly once (exit code 3 if not).
    ///
    /// Example: `oncebox serve` then `oncebox bench --events 20000 --connections 64`
    Bench(bench::BenchArgs),
    /// List stored events in arrival order.
    Events {
        #[arg(long)]
        source: Option<String>,
        /// Only events after this cursor (the `seq` column).
        #[arg(long)]
        after: Option<i64>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// `text` or `json`.
        #[arg(long, default_value = "text")]
        output: String,
    },
    /// Show one key's record: state, first response, fingerprint.
    Inspect { source: String, event_id: String },
    /// Count records by state, conflicts and outbox messages.
    Stats,
    /// Delete terminal records older than each source's retention (never processing or
    /// uncertain ones).
    Purge {
        /// Retention for sources without their own, e.g. `7d`.
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        retention: Duration,
    },
    /// Create the database or bring its schema up to date.
    Migrate,
}

#[derive(Debug, Subcommand)]
enum DeliveriesCommand {
    /// Deliveries oldest first, by state and route.
    List {
        /// pending, in_flight, delivered, retrying, uncertain or dead.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        route: Option<String>,
        #[arg(long)]
        after: Option<i64>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// `text` or `json`.
        #[arg(long, default_value = "text")]
        output: String,
    },
    /// Make a dead, uncertain or retrying delivery due now (same key).
    Retry { id: i64 },
    /// Settle a delivery by hand.
    Resolve {
        id: i64,
        /// The receiver did apply it.
        #[arg(long, conflicts_with = "dead", required_unless_present = "dead")]
        delivered: bool,
        /// Give up on it.
        #[arg(long)]
        dead: bool,
        #[arg(long, default_value = "")]
        note: String,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        // The command ran and reports a negative result (e.g. `send` got a non-2xx).
        Ok(false) => ExitCode::from(3),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<bool> {
    let (listen, admin_token) = match &cli.command {
        Command::Serve {
            listen,
            admin_token,
            ..
        } => (*listen, admin_token.clone()),
        _ => (None, None),
    };
    let overrides = config::Overrides {
        config: cli.config,
        listen,
        database: cli.database,
        admin_token,
    };
    let settings = config::load(&overrides)?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Serve { no_relay, .. } => {
            drop(out);
            serve::run(settings, !no_relay).await?;
        }
        Command::Relay => {
            drop(out);
            serve::relay_only(settings).await?;
        }
        Command::Consume { amqp, nats } => {
            drop(out);
            consume::run(settings, amqp, nats).await?;
        }
        Command::Deliveries { action } => {
            let inbox = Store::open(&settings.database).await?;
            return deliveries::run(&mut out, &inbox, action).await;
        }
        Command::Redeliver { source, event_id } => {
            let inbox = Store::open(&settings.database).await?;
            let key = Key::parse(&source, &event_id)?;
            let n = DeliveryStore::redeliver(&inbox, &key, SystemClock.now()).await?;
            if n == 0 {
                bail!("{key} has no deliveries to redeliver");
            }
            writeln!(out, "{n} deliveries of {key} are due again (same key)")?;
        }
        Command::Check => {
            for w in &settings.warnings {
                writeln!(out, "warning: {w}")?;
            }
            write!(out, "{}", config::describe(&settings))?;
            writeln!(out, "configuration ok")?;
        }
        Command::Send {
            source,
            id,
            body,
            url,
        } => {
            drop(out);
            return send::run(
                &settings,
                send::SendArgs {
                    source,
                    id,
                    body,
                    url,
                },
            )
            .await;
        }
        Command::Bench(args) => {
            drop(out);
            return bench::run(&settings, args).await;
        }
        Command::Events {
            source,
            after,
            limit,
            output,
        } => {
            let inbox = Store::open(&settings.database).await?;
            let source = source.map(oncebox_core::Source::new).transpose()?;
            let page = EventStore::events(
                &inbox,
                EventFilter {
                    source,
                    after,
                    limit,
                },
            )
            .await?;
            print_events(&mut out, &page, &output)?;
        }
        Command::Inspect { source, event_id } => {
            let inbox = Store::open(&settings.database).await?;
            inspect(&mut out, &inbox, &Key::parse(&source, &event_id)?).await?;
        }
        Command::Stats => {
            let inbox = Store::open(&settings.database).await?;
            let stats = EventStore::stats(&inbox).await?;
            for (state, n) in &stats.states {
                writeln!(out, "{state:<12} {n}")?;
            }
            writeln!(out, "{:<12} {}", "conflicts", stats.conflicts)?;
            writeln!(out, "{:<12} {}", "outbox", stats.outbox)?;
        }
        Command::Purge { retention } => {
            let inbox = Store::open(&settings.database).await?;
            let mut r = Retention::new(retention);
            for (source, policy) in &settings.gateway.sources {
                let _ = r.set(source.clone(), policy.retention, None);
            }
            let deleted = EventStore::purge(&inbox, SystemClock.now(), &r).await?;
            writeln!(out, "purged {deleted} records")?;
        }
        Command::Migrate => {
            Store::open(&settings.database).await?;
            let database = store::describe(&settings.database);
            writeln!(out, "{database}: schema up to date")?;
        }
    }
    Ok(true)
}

fn print_events(
    out: &mut impl Write,
    page: &oncebox_core::store::Page<oncebox_core::store::StoredEvent>,
    output: &str,
) -> Result<()> {
    if output == "json" {
        let items: Vec<_> = page
            .items
            .iter()
            .map(|e| {
                serde_json::json!({
                    "seq": e.seq, "source": e.key.source.as_str(), "event_id": e.key.event_id.as_str(),
                    "state": e.state, "received_at": oncebox_gateway::rfc3339(e.received_at),
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({ "items": items, "next": page.next.map(|n| n.to_string()) })
        )?;
        return Ok(());
    }
    for e in &page.items {
        writeln!(
            out,
            "{:>8}  {:<24} {:<12} {}  {}",
            e.seq,
            oncebox_gateway::rfc3339(e.received_at),
            e.state,
            e.key.source,
            e.key.event_id
        )?;
    }
    if let Some(next) = page.next {
        writeln!(out, "more: --after {next}")?;
    }
    Ok(())
}

async fn inspect(out: &mut impl Write, inbox: &Store, key: &Key) -> Result<()> {
    let Some(record) = inbox.record(key).await? else {
        bail!("no record for {key}");
    };
    let state = match &record.state {
        RecordState::Done(r) => format!("{} {}", r.kind.as_str(), String::from_utf8_lossy(&r.body)),
        other => format!("{other:?}"),
    };
    writeln!(out, "key         {key}\nstate       {state}")?;
    writeln!(
        out,
        "received_at {}",
        oncebox_gateway::rfc3339(record.received_at)
    )?;
    let fp = record.fingerprint.map(|f| f.to_hex()).unwrap_or_default();
    writeln!(out, "fingerprint {fp}")?;
    Ok(())
}
