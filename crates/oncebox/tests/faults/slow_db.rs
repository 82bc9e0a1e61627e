//! PostgreSQL slow, its latency swept up through the store's deadline (5 s): each chunk on the
//! wire waits longer and longer, so some transactions finish in time, some are given up, and
//! some commit at the server after the gateway gave up on them and answered 503. None of those
//! may be acknowledged; each answer is a 2xx or a 503; and the senders' retries, once the
//! latency is back, find each late commit and answer it as a replay, applying nothing twice.

use std::time::Duration;

use oncebox_testkit::history::Outcome;
use oncebox_testkit::proxy::{Mode, Stats};

use crate::network::{Behind, Seen, burst, seen};
use crate::table::{Report, Scenario};
use crate::world::block_on;

pub const POSTGRES_SLOW: Scenario = Scenario {
    name: "net: PostgreSQL slow past the deadline",
    backend: "postgres",
    run: || block_on(Duration::from_secs(180), slow()),
};

/// The delays of each chunk, each way, one burst of events at each: a transaction makes a few
/// round trips, so the deadline falls inside the sweep.
const SWEEP_MS: [u64; 6] = [100, 200, 350, 500, 750, 1000];

async fn slow() -> Option<Report> {
    let mut b = Behind::start(None).await?;
    let first = b.history.ops().len();
    for ms in SWEEP_MS {
        b.proxy.set(Mode::Delay(Duration::from_millis(ms)));
        burst(&b.history, &b.base, &format!("slow{ms}-"), 10).await;
    }
    b.proxy.set(Mode::Pass);
    let healed = b.history.ops().len();
    let Seen {
        acked,
        refused,
        other,
    } = seen(&b.history.ops()[first..healed]);
    let figures = b.finish().await;
    // Given up (503) while slow, yet committed: the retry after it healed was a replay.
    let late = b.history.ops()[healed..]
        .iter()
        .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { replayed: true })))
        .filter(|o| !acked.contains(&o.key.1))
        .count();
    assert!(
        other.is_empty(),
        "while slow, answers other than 2xx or 503: {other:?}"
    );
    let held = Stats::get(&b.proxy.stats.held);
    Some(Report {
        figures,
        // The sweep crossed the deadline only if something was given up and later found
        // committed.
        exercised: late as u64,
        what: format!(
            "{held} chunks delayed {SWEEP_MS:?} ms: {} acked, {refused} answered 503, {late} \
             of those committed after the gateway gave up (replays on retry)",
            acked.len()
        ),
        expected_unresolved: 0,
    })
}
