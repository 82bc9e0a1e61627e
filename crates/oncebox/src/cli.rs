//! The command line: every subcommand, its flags, and the examples its `--help` ends with.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{bench, redeliver};

/// Make the effect of an at-least-once event happen once.
///
/// Configuration comes from `oncebox.toml` (or --config / ONCEBOX_CONFIG), then ONCEBOX_*
/// environment variables, then flags. With no configuration, `serve` accepts any source on
/// 127.0.0.1:8080 without signature checks and stores in ./oncebox.db.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None, after_help = crate::exit::TABLE)]
pub struct Cli {
    /// Configuration file (default ./oncebox.toml when it exists).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Where events are kept: sqlite://PATH or postgres://USER@HOST/DB [default:
    /// sqlite://oncebox.db]
    #[arg(long, global = true)]
    pub database: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Text,
    /// One JSON document on stdout; field names are stable.
    Json,
}

/// `--output text|json`, shared by every command that prints a listing or a result.
#[derive(Debug, Clone, Copy, Args)]
pub struct OutputArg {
    /// Print as `text` or as one `json` document (stable field names, for scripts).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// The delivery states a listing can ask for.
const STATES: [&str; 6] = oncebox_core::delivery::DeliveryState::NAMES;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (and the relay, unless --no-relay).
    #[command(after_help = "\
Examples:
  oncebox serve                                    # zero-config: any source, ./oncebox.db
  oncebox serve --config oncebox.toml --listen 0.0.0.0:8080
  ONCEBOX_ADMIN_TOKEN=$(openssl rand -hex 32) oncebox serve --no-relay")]
    Serve {
        /// Address to listen on [default: 127.0.0.1:8080]
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Bearer token of the admin API and the dashboard (or ONCEBOX_ADMIN_TOKEN).
        #[arg(long)]
        admin_token: Option<String>,
        /// Do not run the relay in this process (run `oncebox relay` elsewhere).
        #[arg(long)]
        no_relay: bool,
    },
    /// Read the configured [consumers] from RabbitMQ and NATS JetStream into the store (which
    /// `serve` or `migrate` creates): each message stored once and acknowledged after the
    /// commit; poison goes to the quarantine.
    #[command(after_help = "\
Examples:
  ONCEBOX_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f oncebox consume
  oncebox consume --nats nats://127.0.0.1:4222")]
    Consume {
        /// RabbitMQ URL for the consumers with a `queue`.
        #[arg(long, env = "ONCEBOX_AMQP_URL", hide_env_values = true)]
        amqp: Option<String>,
        /// NATS URL for the consumers with a `stream`.
        #[arg(long, env = "ONCEBOX_NATS_URL", hide_env_values = true)]
        nats: Option<String>,
    },
    /// Run the relay alone: deliver accepted events to the configured routes.
    #[command(after_help = "\
Examples:
  oncebox migrate                                  # relay creates no database
  oncebox serve --no-relay & oncebox relay         # gateway and relay as two processes
  oncebox relay --database postgres://oncebox@db/oncebox")]
    Relay,
    /// Inspect and settle deliveries.
    #[command(after_help = "\
Examples:
  oncebox deliveries list --state uncertain
  oncebox deliveries resolve 42 --delivered --note \"confirmed with the receiver\"
  oncebox deliveries retry 42")]
    Deliveries {
        #[command(subcommand)]
        action: DeliveriesCommand,
    },
    /// Deliver events to their routes again, with the same idempotency key and fresh caps on
    /// attempts and age: one event (SOURCE EVENT_ID) or every event of a source (--source, with
    /// a progress bar).
    #[command(after_help = "\
Examples:
  oncebox redeliver stripe evt_1MqqbYLkdIwHu7ix
  oncebox redeliver --source stripe --since 2h --dry-run
  oncebox redeliver --source shop --since 2024-05-01T00:00:00Z --output json")]
    Redeliver(redeliver::RedeliverArgs),
    /// Validate the configuration and describe it; names the bad field if any (exit code 2).
    #[command(after_help = "\
Examples:
  oncebox check
  oncebox check --config prod.toml --output json | jq '.sources[].name'
  oncebox check --listen 0.0.0.0:8080              # as `serve --listen 0.0.0.0:8080` will run")]
    Check {
        #[command(flatten)]
        output: OutputArg,
        /// The address `serve` will be given with --listen, checked as `serve` checks it.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// The admin token `serve` will be given with --admin-token (or ONCEBOX_ADMIN_TOKEN),
        /// checked as `serve` checks it.
        #[arg(long)]
        admin_token: Option<String>,
    },
    /// Sign a test event with a source's scheme and send it to the running gateway.
    #[command(after_help = "\
Examples:
  oncebox send demo --id evt_1                     # zero-config gateway, any source name
  oncebox send stripe --id evt_1 --body '{\"id\":\"evt_1\",\"type\":\"charge.succeeded\"}'
  oncebox send shop --url http://gateway.internal:8080
Exit code 5 when the gateway answers anything but 2xx.")]
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
    /// then check that every accepted key is stored exactly once (exit code 5 if not).
    #[command(after_help = "\
Examples:
  oncebox serve & oncebox bench --events 20000 --connections 64
  oncebox bench --source stripe --duplicates 0.2   # signed with the source's first secret
  oncebox bench --url http://127.0.0.1:8090 --no-check   # another server, figures only
  oncebox bench --rate 4000 --events 240000 --p99-max 10s   # open loop: p99 at 4000/s within 10 s?")]
    Bench(bench::BenchArgs),
    /// List stored events in arrival order.
    #[command(after_help = "\
Examples:
  oncebox events --source stripe --limit 20
  oncebox events --after 1200                      # the next page, from the `more:` line
  oncebox events --output json | jq -r '.items[].event_id'")]
    Events {
        #[arg(long, value_parser = source_name)]
        source: Option<String>,
        /// Only events after this cursor (the `seq` column).
        #[arg(long)]
        after: Option<i64>,
        /// Events per page, from 1 to 500.
        #[arg(long, default_value_t = 50, value_parser = page_limit)]
        limit: usize,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Show one key's record: state, first response, fingerprint (exit code 3 if unknown).
    #[command(after_help = "\
Examples:
  oncebox inspect stripe evt_1MqqbYLkdIwHu7ix
  oncebox inspect shop order-42 --output json")]
    Inspect {
        source: String,
        event_id: String,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Count records by state, conflicts and outbox messages.
    #[command(after_help = "\
Examples:
  oncebox stats
  oncebox stats --output json | jq .events.completed")]
    Stats(OutputArg),
    /// Delete terminal records older than each source's retention (never processing or
    /// uncertain ones, nor one whose delivery is still owed), with their finished deliveries.
    #[command(after_help = "\
Examples:
  oncebox --config oncebox.toml purge              # each named source's retention; others kept
  oncebox purge --retention 30d --output json      # required where no [sources] are configured")]
    Purge {
        /// Retention for sources the configuration does not name in `[sources]`, e.g. `30d`
        /// (unless given they are kept, a consumer's source 7 days; must be given when the
        /// configuration names no sources; warned of under the 3 days Stripe, GitHub and
        /// Standard Webhooks senders may redeliver for).
        #[arg(long, value_parser = retention)]
        retention: Option<Duration>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Create the database or bring its schema up to date.
    #[command(after_help = "\
Examples:
  oncebox migrate --database sqlite://oncebox.db
  oncebox migrate --database postgres://oncebox@db/oncebox")]
    Migrate,
}

impl Command {
    /// Whether the command was asked for one JSON document on stdout (`--output json`).
    pub fn json_output(&self) -> bool {
        let output = match self {
            Command::Events { output, .. }
            | Command::Inspect { output, .. }
            | Command::Purge { output, .. }
            | Command::Check { output, .. }
            | Command::Stats(output)
            | Command::Deliveries {
                action: DeliveriesCommand::List { output, .. },
            } => output.output,
            Command::Redeliver(args) => args.output(),
            _ => return false,
        };
        output == Output::Json
    }
}

#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// Deliveries oldest first, by state and route.
    #[command(after_help = "\
Examples:
  oncebox deliveries list --state dead --route orders
  oncebox deliveries list --state uncertain --output json | jq -r '.items[].id'")]
    List {
        #[arg(long, value_parser = STATES)]
        state: Option<String>,
        #[arg(long)]
        route: Option<String>,
        /// Only deliveries after this id.
        #[arg(long)]
        after: Option<i64>,
        /// Deliveries per page, from 1 to 500.
        #[arg(long, default_value_t = 50, value_parser = page_limit)]
        limit: usize,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Make a dead, uncertain or retrying delivery due now (same key, fresh caps on attempts
    /// and age).
    #[command(after_help = "\
Examples:
  oncebox deliveries retry 42
Exit code 3 when there is no delivery 42, 5 when its state refuses a retry.")]
    Retry { id: i64 },
    /// Settle a delivery by hand.
    #[command(after_help = "\
Examples:
  oncebox deliveries resolve 42 --delivered --note \"receiver shows order 1001 paid\"
  oncebox deliveries resolve 42 --dead --note \"customer cancelled\"
Exit code 3 when there is no delivery 42, 5 when its state refuses it (e.g. delivered).")]
    // One of the two, named together when neither is given.
    #[command(group = clap::ArgGroup::new("outcome").required(true).args(["delivered", "dead"]))]
    Resolve {
        id: i64,
        /// The receiver did apply it.
        #[arg(long)]
        delivered: bool,
        /// Give up on it.
        #[arg(long)]
        dead: bool,
        #[arg(long, default_value = "")]
        note: String,
    },
}

/// A source name, refused as the flag's value (clap then names the flag) rather than later.
fn source_name(v: &str) -> Result<String, String> {
    oncebox_core::Source::new(v)
        .map(|s| s.as_str().to_owned())
        .map_err(|e| e.to_string())
}

/// The largest page the stores return (both backends': PostgreSQL's constant names it); more
/// was cut to it without a word, and 0 read as 1.
const MAX_PAGE: usize = oncebox_postgres::MAX_PAGE;

/// A listing's `--limit`, refused outside what the store returns rather than changed quietly.
fn page_limit(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        _ => Err(format!(
            "must be a number from 1 to {MAX_PAGE} (the largest page; --after reads the next)"
        )),
    }
}

/// A retention for `purge`: more than zero, as a source's own `retention` must be, since zero
/// would delete every completed record, including those whose senders still retry.
fn retention(v: &str) -> Result<Duration, String> {
    let d = crate::config::parse_duration(v)?;
    if d.is_zero() {
        return Err("must be more than 0".to_owned());
    }
    Ok(d)
}
