//! Overload: senders at twice what the gateway can take get their answers within the
//! strictest sender's timeout (GitHub's 10 s), because the gateway sheds what it cannot take
//! at once (`503` with `Retry-After`) instead of queueing it; and overload changes nothing of
//! the guarantees: every answer goes into the history and the checker reads the figures.
//!
//! A load generator on the same two cores cannot outrun a gateway bound by its CPU (measured:
//! at 1.5 times such a capacity the senders fell a second behind their own schedule). So the
//! gateway is made slow where real ones are: every `fsync` takes [`SYNC_DELAY`] longer (a
//! slow disk, injected by `strace`), and its capacity is what [`CONCURRENCY`] requests at
//! once commit through that disk, measured first by as many closed-loop senders. The phase
//! then sends on an open-loop schedule at twice that rate: a gateway that queued would see its
//! latency grow with every second of the phase. The expected load is taken at its harshest,
//! the capacity itself, and the run is inconclusive unless the senders kept their schedule.
//! On PostgreSQL the database is made slow the same way from the outside: every chunk between
//! the gateway and the server waits [`PG_DELAY`] in the fault proxy (a database far away or
//! busy), and the same phases run against it. The capacity is the limit's: with no limit
//! (measured, one run each) neither store shed at that rate, their batches grew, and the p99
//! stayed near what it is here (SQLite 91 ms, PostgreSQL 415 ms).

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncebox_testkit::checker::{Figures, check};
use oncebox_testkit::history::{History, Outcome};
use oncebox_testkit::proxy::{Mode, Proxy, Stats};

use crate::fsync::{kill_traced, strace_or_skip, syncs_faulted};
use crate::table::{Report, Scenario, scale};
use crate::world::{self, block_on, final_pg, final_sqlite};

pub const OVERLOAD_SQLITE: Scenario = Scenario {
    name: "load: twice the capacity",
    backend: "sqlite",
    run: overload_sqlite,
};

pub const OVERLOAD_POSTGRES: Scenario = Scenario {
    name: "load: twice the capacity",
    backend: "postgres",
    run: || block_on(Duration::from_secs(300), overload_postgres()),
};

/// The strictest sender timeout the catalogue names (GitHub's).
const STRICTEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer each `fsync` takes: a slow disk.
/// 40 ms: the capacity stays near 300 events/s, so a debug-built load generator sharing the
/// gateway's cores can send twice that on schedule.
const SYNC_DELAY: Duration = Duration::from_millis(40);

/// How long each chunk between the gateway and PostgreSQL waits, each way. A batch makes
/// several round trips, so [`CONCURRENCY`] requests at once commit about 80 events/s (one
/// run: 79/s), twice which a debug-built load generator on the same cores sends on schedule.
const PG_DELAY: Duration = Duration::from_millis(20);

/// Requests the gateway handles at once; past them it answers `503` at once.
const CONCURRENCY: usize = 32;

/// How late a request may fall due and still count as sent on schedule: past it the senders,
/// not the gateway, set the pace.
const SCHEDULE_SLACK: Duration = Duration::from_millis(250);

/// The gateway's configuration: a source the senders' ids are read from and the concurrency
/// past which it sheds.
fn config(dir: &std::path::Path) {
    let config = format!(
        "[limits]\nconcurrency = {CONCURRENCY}\n\
         [sources.load]\nsignature = \"none\"\nevent_id = {{ pointer = \"/id\" }}\n"
    );
    std::fs::write(dir.join("oncebox.toml"), config).unwrap();
}

fn overload_sqlite() -> Option<Report> {
    let strace = strace_or_skip("this scenario slows fsync down with it")?;
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let sqlite = dir.path().join("load.db");
    let database = format!("sqlite://{}", sqlite.display());
    let spec = world::serve(dir.path(), &database, "127.0.0.1:0", &[]);
    let delay = format!("delay_exit={}", SYNC_DELAY.as_micros());
    let mut server = syncs_faulted(&strace, spec, &delay).start();
    let base = world::url(&server);
    let history = Arc::new(History::new());
    let run = block_on(Duration::from_secs(240), async {
        let run = phases(&history, &base).await;
        // The senders' side afterwards: everything not acknowledged is sent until it is.
        world::drain(&history, &base, CONCURRENCY).await;
        run
    });
    // Every acknowledged commit is durable: killed, the gateway loses none of them.
    kill_traced(&mut server);
    let figures = check(&history.ops(), &final_sqlite(&sqlite, false));
    Some(run.report(figures, "every fsync slower"))
}

async fn overload_postgres() -> Option<Report> {
    let schema = world::pg_schema().await?;
    let proxy = Proxy::start(schema.server_addr()).await;
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let database = schema.url_via(proxy.addr());
    let mut server = world::serve(dir.path(), &database, "127.0.0.1:0", &[]).start();
    let base = world::url(&server);
    let history = Arc::new(History::new());
    proxy.set(Mode::Delay(PG_DELAY));
    let run = phases(&history, &base).await;
    proxy.set(Mode::Pass);
    let held = Stats::get(&proxy.stats.held);
    world::drain(&history, &base, CONCURRENCY).await;
    // Every acknowledged commit is PostgreSQL's: killed, the gateway loses none of them.
    server.kill();
    let figures = check(&history.ops(), &final_pg(&schema.pool().await, false).await);
    Some(run.report(figures, &format!("{held} chunks delayed {PG_DELAY:?}")))
}

/// What the two phases measured.
struct Run {
    capacity: f64,
    phase: Duration,
    sent: Vec<Sent>,
}

/// The capacity, measured closed-loop, then twice that open-loop.
async fn phases(history: &Arc<History>, base: &str) -> Run {
    let phase = Duration::from_secs(scale(4) as u64);
    let capacity = closed_loop(history, base, Duration::from_secs(2)).await;
    let sent = open_loop(history, base, 2.0 * capacity, phase).await;
    Run {
        capacity,
        phase,
        sent,
    }
}

impl Run {
    /// The row: the checker's `figures`, and the overload judged on the latencies.
    fn report(self, figures: Figures, fault: &str) -> Report {
        let Run {
            capacity,
            phase,
            sent,
        } = self;
        let latency: Vec<Duration> = sent.iter().map(|s| s.latency).collect();
        let late = percentile(&sent.iter().map(|s| s.late).collect::<Vec<_>>(), 0.99);
        let shed = sent
            .iter()
            .filter(|s| s.outcome == Outcome::Info("HTTP 503".into()))
            .count();
        let p99 = percentile(&latency, 0.99);
        // A gateway that queued what it cannot take would answer, by the end of the phase,
        // half a phase late: the bound is the strictest timeout, or a quarter of the phase if
        // shorter, so a queue is caught in a short phase too.
        let bound = STRICTEST_TIMEOUT.min(phase / 4);
        // Judged only when the senders kept their schedule: otherwise their own lag is in the
        // latencies, and the run is inconclusive instead (which fails too, saying so).
        let on_schedule = late <= SCHEDULE_SLACK;
        assert!(
            !on_schedule || p99 <= bound,
            "p99 {p99:?} at twice the capacity ({capacity:.0}/s) is past {bound:?}"
        );
        Report {
            figures,
            // The overload happened only if the senders kept their schedule and the gateway
            // shed.
            exercised: if on_schedule { shed as u64 } else { 0 },
            what: format!(
                "{fault}: capacity {capacity:.0}/s; {} requests at {:.0}/s for {phase:?} (p99 \
                 {late:?} behind schedule): {shed} shed, latency p50 {:?} p99 {p99:?} max {:?}",
                sent.len(),
                2.0 * capacity,
                percentile(&latency, 0.5),
                percentile(&latency, 1.0),
            ),
            expected_unresolved: 0,
        }
    }
}

/// New events from [`CONCURRENCY`] senders, each sending its next as its last is answered,
/// for `phase`: the events accepted per second. No more are in flight than the gateway takes,
/// so none is shed.
async fn closed_loop(history: &Arc<History>, base: &str, phase: Duration) -> f64 {
    let start = Instant::now();
    let senders: Vec<_> = (0..CONCURRENCY)
        .map(|s| {
            let (history, base) = (history.clone(), base.to_owned());
            tokio::spawn(async move {
                let c = world::client();
                let mut accepted = 0u32;
                let mut i = 0;
                while start.elapsed() < phase {
                    let id = format!("c{s}-{i}");
                    let o = world::deliver(&c, &history, &base, "load", &id, "v1").await;
                    accepted += u32::from(matches!(o, Outcome::Ok { .. }));
                    i += 1;
                }
                accepted
            })
        })
        .collect();
    let mut accepted = 0;
    for s in senders {
        accepted += s.await.unwrap();
    }
    f64::from(accepted.max(1)) / start.elapsed().as_secs_f64()
}

/// One request of the open loop.
struct Sent {
    /// From the moment it fell due to its answer.
    latency: Duration,
    /// From the moment it fell due to the moment its sender began.
    late: Duration,
    outcome: Outcome,
}

/// Requests falling due at `rate` per second for `phase`, each sent at its time whatever is
/// still in flight; one in ten resends an earlier event.
async fn open_loop(history: &Arc<History>, base: &str, rate: f64, phase: Duration) -> Vec<Sent> {
    let c = world::client();
    let start = tokio::time::Instant::now();
    let total = (rate * phase.as_secs_f64()) as usize;
    let mut sending = Vec::with_capacity(total);
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        let id = if i % 10 == 9 {
            format!("o{}", i / 2)
        } else {
            format!("o{i}")
        };
        let (c, history, base) = (c.clone(), history.clone(), base.to_owned());
        sending.push(tokio::spawn(async move {
            let late = due.elapsed();
            let outcome = world::deliver(&c, &history, &base, "load", &id, "v1").await;
            Sent {
                latency: due.elapsed(),
                late,
                outcome,
            }
        }));
    }
    let mut sent = Vec::with_capacity(total);
    for s in sending {
        sent.push(s.await.unwrap());
    }
    sent
}

/// The `q` quantile of `values` (nearest rank); zero for none.
fn percentile(values: &[Duration], q: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied().unwrap_or_default()
}
