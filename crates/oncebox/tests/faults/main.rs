//! The fault tier: every scenario of TESTING.md this binary covers, run against the real
//! `oncebox` (as child processes where crashes matter), each ending in one row of figures
//! (TESTING.md's D L F P C U, C as conflicts detected/injected; beside them what the run left
//! unresolved against what the scenario parks on purpose; see `oncebox_testkit::checker`) and
//! an "exercised" count proving its fault happened. The rows are printed as one table at the
//! end, and also written, one line each with the prefix `FAULTS|`, to `faults-table.txt` under
//! the cargo target's temporary directory.
//!
//! Runs with `cargo test --workspace` (or `cargo test -p oncebox --test faults`); arguments
//! filter scenarios by name, `--skip` words exclude them. A scenario on a service needs its
//! URL (`ONCEBOX_POSTGRES_URL`, `ONCEBOX_REDIS_URL`, `ONCEBOX_NATS_URL`) and skips without it;
//! the fsync scenario needs `strace` and skips without it (both fail under
//! `ONCEBOX_REQUIRE_SERVICES=1`). The soak tier runs the same scenarios with ten times the
//! iterations:
//!
//!     ONCEBOX_SOAK=1 cargo test --release -p oncebox --test faults
//!
//! A randomized scenario prints its seed; `ONCEBOX_SEED=N` replays it.

mod authenticity;
mod broker;
mod clock;
mod conflicts;
mod crash;
mod flood;
mod fsync;
mod hostile;
mod kills;
mod lease;
mod load;
mod network;
mod outbox;
mod relay_kills;
mod reply;
#[path = "../shared/schema.rs"]
mod schema;
mod slow_db;
mod standins;
mod storage;
mod table;
mod world;

use table::{Row, Scenario};

/// Every scenario, in the order the table lists them.
const SCENARIOS: &[Scenario] = &[
    crash::INGEST_AFTER_BODY_READ,
    crash::INGEST_AFTER_SIGNATURE_CHECK,
    crash::INGEST_AFTER_BEGIN,
    crash::INGEST_AFTER_INBOX_INSERT,
    crash::INGEST_AFTER_EFFECT,
    crash::INGEST_BEFORE_COMMIT,
    crash::INGEST_AFTER_COMMIT,
    crash::INGEST_AFTER_ANSWER,
    crash::INGEST_AFTER_BODY_READ_POSTGRES,
    crash::INGEST_AFTER_SIGNATURE_CHECK_POSTGRES,
    crash::INGEST_AFTER_BEGIN_POSTGRES,
    crash::INGEST_AFTER_INBOX_INSERT_POSTGRES,
    crash::INGEST_AFTER_EFFECT_POSTGRES,
    crash::INGEST_BEFORE_COMMIT_POSTGRES,
    crash::INGEST_AFTER_COMMIT_POSTGRES,
    crash::INGEST_AFTER_ANSWER_POSTGRES,
    crash::RELAY_BEFORE_RECORD_SQLITE,
    crash::RELAY_BEFORE_RECORD_POSTGRES,
    kills::RANDOM_KILLS_SQLITE,
    kills::RANDOM_POWER_CUTS_SQLITE,
    kills::RANDOM_TERMS_SQLITE,
    kills::RANDOM_KILLS_POSTGRES,
    kills::RANDOM_TERMS_POSTGRES,
    relay_kills::RANDOM_RELAY_KILLS_SQLITE,
    relay_kills::RANDOM_RELAY_KILLS_POSTGRES,
    reply::RECEIVER_REPLY_DROPPED_IDEMPOTENT,
    reply::RECEIVER_REPLY_DROPPED_PLAIN,
    reply::RECEIVER_TOO_SLOW_IDEMPOTENT,
    reply::RECEIVER_TOO_SLOW_PLAIN,
    network::COMMIT_REPLY_LOST_POSTGRES,
    network::POSTGRES_FROZEN,
    network::POSTGRES_RESET,
    slow_db::POSTGRES_SLOW,
    storage::SQLITE_LOCKED,
    storage::DISK_FULL,
    fsync::SQLITE_FSYNC_EIO,
    authenticity::AUTHENTICITY,
    hostile::BAD_INPUT,
    flood::SLOWLORIS_AND_FLOODS,
    load::OVERLOAD_SQLITE,
    load::OVERLOAD_POSTGRES,
    clock::RETENTION_AND_CLOCK_JUMPS_SQLITE,
    lease::REDIS_HOLDER_PAUSED,
    broker::NATS_BEFORE_ACK,
    broker::NATS_RANDOM_KILLS,
    standins::BROKEN_STANDINS,
];

fn main() {
    // A child process of a scenario (crash, broker, lease): it runs its part and never returns.
    crash::child_role();
    broker::child_role();
    lease::child_role();
    let args = table::Args::parse();
    if args.list {
        for s in SCENARIOS.iter().filter(|s| args.selects(s.name)) {
            println_list(s.name);
        }
        return;
    }
    let chosen: Vec<&Scenario> = SCENARIOS.iter().filter(|s| args.selects(s.name)).collect();
    let started = std::time::Instant::now();
    let rows: Vec<Row> = chosen.iter().map(|s| table::run(s)).collect();
    table::print(&rows, started.elapsed());
    if rows.iter().any(Row::failed) {
        std::process::exit(1);
    }
}

/// `--list` output in libtest's format, for tools that enumerate tests.
fn println_list(name: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{name}: test");
}
