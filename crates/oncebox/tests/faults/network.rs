//! Faults on the wire between the gateway and PostgreSQL, through the testkit's TCP proxy:
//! replies to `COMMIT` lost, PostgreSQL frozen (a black hole) and its connections reset under
//! load (the receiver's side is `reply.rs`, a slow database `slow_db.rs`). Every event is
//! routed, with no relay (`outbox.rs`): each stored event must hold its one delivery.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncebox_testkit::checker::Figures;
use oncebox_testkit::child::{Proc, until_async};
use oncebox_testkit::history::{History, Op, Outcome, Refusal};
use oncebox_testkit::proxy::{Mode, Proxy, Stats};

use crate::outbox;
use crate::table::{Report, Scenario};
use crate::world::{self, PATIENCE, PgSchema, StoreCounts, block_on};

/// The senders' source.
const SOURCE: &str = "pg";

pub const COMMIT_REPLY_LOST_POSTGRES: Scenario = Scenario {
    name: "net: COMMIT reply lost",
    backend: "postgres",
    run: || block_on(Duration::from_secs(120), commit_reply_lost()),
};

pub const POSTGRES_FROZEN: Scenario = Scenario {
    name: "net: PostgreSQL frozen (black hole)",
    backend: "postgres",
    run: || block_on(Duration::from_secs(120), frozen()),
};

pub const POSTGRES_RESET: Scenario = Scenario {
    name: "net: PostgreSQL connections reset",
    backend: "postgres",
    run: || block_on(Duration::from_secs(120), reset()),
};

/// A gateway on a PostgreSQL schema of its own, reaching it through a fault proxy (which, with
/// a marker, drops only answers to bytes holding it), after 20 events went through.
pub(crate) struct Behind {
    pub schema: PgSchema,
    pub proxy: Proxy,
    pub dir: tempfile::TempDir,
    pub gw: Proc,
    pub base: String,
    pub history: Arc<History>,
}

impl Behind {
    pub(crate) async fn start(marker: Option<Vec<u8>>) -> Option<Behind> {
        let schema = world::pg_schema().await?;
        let proxy = Proxy::start_with_marker(schema.server_addr(), marker).await;
        let dir = tempfile::tempdir().unwrap();
        outbox::configure(dir.path(), SOURCE);
        let database = schema.url_via(proxy.addr());
        let gw = world::serve(dir.path(), &database, "127.0.0.1:0", outbox::NO_RELAY).start();
        let base = world::url(&gw);
        let history = Arc::new(History::new());
        burst(&history, &base, "warm", 20).await;
        Some(Behind {
            schema,
            proxy,
            dir,
            gw,
            base,
            history,
        })
    }

    /// Once the fault is healed: every key sent again until it is resolved, the gateway
    /// stopped, and the figures of the history against what PostgreSQL holds, its outbox
    /// included.
    pub(crate) async fn finish(&mut self) -> Figures {
        world::drain(&self.history, &self.base, 8).await;
        self.gw.terminate();
        let store = StoreCounts::new(self.dir.path(), Some(&self.schema)).await;
        let ops = self.history.ops();
        let mut figures = outbox::figures(&ops, &store).await.0;
        // Every refusal as a conflict has its audit row, whatever the network did to the
        // transaction that kept it.
        crate::conflicts::check(&mut figures, &ops, store.conflicts(SOURCE).await);
        figures
    }
}

/// What the senders saw: the keys acknowledged, how many were answered 503, and every other
/// answer, named. A request still waiting for its answer is none of them.
pub(crate) struct Seen {
    pub acked: Vec<String>,
    pub refused: usize,
    pub other: Vec<String>,
}

pub(crate) fn seen(ops: &[Op]) -> Seen {
    let mut s = Seen {
        acked: Vec::new(),
        refused: 0,
        other: Vec::new(),
    };
    for o in ops {
        match o.outcome() {
            None => {}
            Some(Outcome::Ok { .. }) => s.acked.push(o.key.1.clone()),
            Some(Outcome::Info(why)) if why == "HTTP 503" => s.refused += 1,
            // A burst's reused id with another payload (`burst`): judged by C, not here.
            Some(Outcome::Fail(Refusal::Conflict)) => {}
            Some(answered) => s.other.push(format!("{}: {answered:?}", o.key.1)),
        }
    }
    s
}

/// Arms `mode` (`DropReply` or `Reset`) and sends bursts of 10 new events (ids starting with
/// `prefix`), at least one, until the proxy did it 5 times, then heals; returns what the
/// senders saw meanwhile. (The pool's own idle connections can take 5 resets before any
/// request is sent: with no burst the scenario would have judged nothing.)
async fn armed(
    proxy: &Proxy,
    history: &Arc<History>,
    base: &str,
    mode: Mode,
    prefix: &str,
) -> Vec<Op> {
    let count = |s: &Stats| match mode {
        Mode::DropReply => Stats::get(&s.dropped_replies),
        _ => Stats::get(&s.resets),
    };
    let first = history.ops().len();
    proxy.set(mode.clone());
    let mut round = 0;
    loop {
        burst(history, base, &format!("{prefix}{round}-"), 10).await;
        round += 1;
        if count(&proxy.stats) >= 5 {
            break;
        }
        assert!(round < 50, "{mode:?}: the proxy never did it");
    }
    proxy.set(Mode::Pass);
    history.ops()[first..].to_vec()
}

/// Senders deliver new events, each once, `SENDERS` at a time.
pub(crate) async fn burst(history: &Arc<History>, base: &str, prefix: &str, n: usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            // One in eight sends an earlier id of the burst with another payload: a conflict
            // (or, arriving first, the winner), so G4 is judged through the fault too (C).
            // (`& !4`: an earlier id that was itself sent with v1.)
            let (n, tag) = if i % 8 == 7 {
                ((i / 2) & !4, "v2")
            } else {
                (i, "v1")
            };
            let (history, base, id) = (history.clone(), base.to_owned(), format!("{prefix}{n}"));
            tokio::spawn(async move {
                world::deliver(&world::client(), &history, &base, SOURCE, &id, tag).await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// The gateway talks to PostgreSQL through a proxy that, while armed, forwards each `COMMIT`
/// and drops the server's answer: the commit happened, the gateway cannot know. Every such
/// request must be answered 503 (never 2xx, never a replay), and the senders' retries after
/// the network healed resolve each key once.
async fn commit_reply_lost() -> Option<Report> {
    // The statement itself, NUL-terminated as the protocol sends a query's text: the bare
    // word is also in `BEGIN ISOLATION LEVEL READ COMMITTED`, whose answer would be dropped.
    let mut b = Behind::start(Some(b"COMMIT\0".to_vec())).await?;
    // Each burst drops at least the first COMMIT's answer.
    let during = armed(&b.proxy, &b.history, &b.base, Mode::DropReply, "lost").await;
    let healed = b.history.ops().len();
    // TESTING.md: a COMMIT whose reply is lost is answered 503 (not a 500, not silence).
    let Seen {
        acked,
        refused,
        other,
    } = seen(&during);
    let figures = b.finish().await;
    // Keys whose commit happened although its answer was lost: the retry was a replay.
    let resolved = b
        .history
        .ops()
        .iter()
        .filter(|o| o.id >= healed && matches!(o.outcome(), Some(Outcome::Ok { replayed: true })))
        .count();
    let dropped = Stats::get(&b.proxy.stats.dropped_replies);
    // Every COMMIT's answer was dropped while armed, so no new key could be acknowledged then;
    // the figures alone would not show a gateway that guessed success, as its guesses came
    // true. And the commits must really have happened: some retries are replays of them.
    assert!(
        acked.is_empty(),
        "{acked:?} were acknowledged though every COMMIT answer was lost"
    );
    assert!(
        other.is_empty(),
        "while COMMIT replies were lost, answers other than 503: {other:?}"
    );
    assert!(
        resolved > 0,
        "no retry was a replay: the lost COMMITs did not commit"
    );
    Some(Report {
        figures,
        exercised: dropped,
        what: format!(
            "{dropped} COMMIT replies lost, {refused} answered 503 and {} acked while armed, \
             {resolved} resolved as replays on retry",
            acked.len()
        ),
        expected_unresolved: 0,
    })
}

/// PostgreSQL frozen: the proxy holds every byte, both ways, for longer than the store's
/// deadline (5 s) while events keep arriving. Requests made and answered while it is frozen
/// end 503, never 2xx; when it thaws the held statements run, and retries apply each key once.
async fn frozen() -> Option<Report> {
    const FREEZE: Duration = Duration::from_millis(6500);
    let mut b = Behind::start(None).await?;
    b.proxy.set(Mode::BlackHole);
    let (frozen_at, first) = (Instant::now(), b.history.ops().len());
    let arrivals = {
        let (history, base) = (b.history.clone(), b.base.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut i = 0;
            while frozen_at.elapsed() < FREEZE - Duration::from_secs(1) {
                tick.tick().await;
                let (history, base, id) = (history.clone(), base.clone(), format!("cold{i}"));
                tokio::spawn(async move {
                    world::deliver(&world::client(), &history, &base, SOURCE, &id, "v1").await
                });
                i += 1;
            }
        })
    };
    // The fault itself: the database stays frozen this long.
    tokio::time::sleep(FREEZE).await;
    // What the senders saw while it was frozen, read before it thaws. Answered while frozen
    // means answered by the gateway's deadline: a 503 (retry later), never a 2xx, a 500, a 4xx,
    // or a connection the sender had to give up on.
    let Seen {
        acked,
        refused,
        other,
    } = seen(&b.history.ops()[first..]);
    b.proxy.set(Mode::Pass);
    arrivals.await.unwrap();
    until_async(
        "every request made while frozen has its answer",
        PATIENCE,
        || b.history.ops().iter().all(|o| o.completed.is_some()),
    )
    .await;
    let figures = b.finish().await;
    assert!(
        acked.is_empty(),
        "2xx while PostgreSQL was frozen: {acked:?}"
    );
    assert!(
        other.is_empty(),
        "while frozen, answers other than 503: {other:?}"
    );
    let held = Stats::get(&b.proxy.stats.held);
    Some(Report {
        figures,
        exercised: refused as u64,
        what: format!(
            "{refused} answered 503 while frozen {} ms, {held} exchanges held",
            FREEZE.as_millis()
        ),
        expected_unresolved: 0,
    })
}

/// PostgreSQL's connections reset under load: while armed, the proxy cuts every connection
/// with a RST at its next exchange (mid-transaction, mid-`COMMIT`, or as it opens). Nothing can
/// commit then, so every request made meanwhile ends 503, never 2xx; once it heals the pool
/// connects again, and the senders' retries apply each key once.
async fn reset() -> Option<Report> {
    let mut b = Behind::start(None).await?;
    let during = armed(&b.proxy, &b.history, &b.base, Mode::Reset, "cut").await;
    let Seen {
        acked,
        refused,
        other,
    } = seen(&during);
    let figures = b.finish().await;
    // Every request while armed was answered, and only with a 503: a 2xx would claim a commit
    // no connection could make.
    assert!(
        acked.is_empty() && other.is_empty(),
        "while reset, answers other than 503: {acked:?} acknowledged, {other:?}"
    );
    assert!(refused > 0, "no request met a reset connection");
    let resets = Stats::get(&b.proxy.stats.resets);
    Some(Report {
        figures,
        exercised: resets,
        what: format!("{resets} connections reset, {refused} requests answered 503 meanwhile"),
        expected_unresolved: 0,
    })
}
