//! The `oncebox` binary: command line, database selection and wiring of the backends.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use oncebox_core::{Clock, Key, Retention, SystemClock};
use oncebox_sqlite::{Inbox, Options, RecordState};

/// Make the effect of an at-least-once event happen once.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Where events are kept: `sqlite://PATH` (or a plain path).
    #[arg(
        long,
        global = true,
        env = "ONCEBOX_DATABASE",
        default_value = "sqlite://oncebox.db"
    )]
    database: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the database or bring its schema up to date.
    Migrate,
    /// Count inbox records by state, and the other tables.
    Stats,
    /// Show one key's record: state, response, timestamps.
    Inspect { source: String, event_id: String },
    /// Delete terminal records older than the retention (processing and uncertain keys stay).
    Purge {
        /// e.g. `7d`. Shorter than a sender's redelivery window turns old events into new ones.
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        retention: Duration,
    },
}

fn sqlite_path(database: &str) -> Result<PathBuf> {
    if let Some(rest) = database.strip_prefix("sqlite://") {
        return Ok(PathBuf::from(rest));
    }
    if database.contains("://") {
        bail!("database {database:?}: only sqlite:// is supported by this build");
    }
    Ok(PathBuf::from(database))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let path = sqlite_path(&cli.database)?;
    let inbox =
        Inbox::open(Options::new(&path)).with_context(|| format!("opening {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Migrate => Ok(writeln!(out, "{}: schema up to date", path.display())?),
        Command::Stats => {
            let rows = inbox
                .read(|c| {
                    let mut q = c.prepare(
                        "SELECT state, count(*) FROM oncebox_inbox GROUP BY state
                         UNION ALL SELECT 'conflicts', count(*) FROM oncebox_conflicts
                         UNION ALL SELECT 'outbox', count(*) FROM oncebox_outbox",
                    )?;
                    q.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?;
            for (name, n) in rows {
                writeln!(out, "{name:<12} {n}")?;
            }
            Ok(())
        }
        Command::Inspect { source, event_id } => {
            let key = Key::parse(&source, &event_id)?;
            let Some(record) = inbox.record(&key).await? else {
                bail!("no record for {key}");
            };
            let state = match &record.state {
                RecordState::Done(r) => {
                    format!("{} {}", r.kind.as_str(), String::from_utf8_lossy(&r.body))
                }
                other => format!("{other:?}"),
            };
            writeln!(out, "key         {key}\nstate       {state}")?;
            writeln!(out, "received_at {}", record.received_at)?;
            let fp = record.fingerprint.map(|f| f.to_hex()).unwrap_or_default();
            Ok(writeln!(out, "fingerprint {fp}")?)
        }
        Command::Purge { retention } => {
            let deleted = inbox
                .purge(SystemClock.now(), &Retention::new(retention))
                .await?;
            Ok(writeln!(out, "purged {deleted} records")?)
        }
    }
}
