//! Random kills under load: `oncebox serve` SIGKILLed at seeded random moments (counted in
//! acknowledgements, not time) while senders keep delivering, restarted on the same port each
//! time; every sender retries until its event is acknowledged. The same with power cuts: the
//! gateway on SQLite through the power-loss VFS (`oncebox_sqlite::powerloss`), so each kill
//! leaves on disk only what was synced, as a power cut would; a control run at
//! `Durability::Normal` first shows that the cuts bite. The gateway queues every event to one
//! route with no relay, and each stored event must hold its one delivery (`outbox.rs`). A kill
//! counts as exercised only if it left a request under way unanswered. And graceful stops: the
//! gateway sent SIGTERM at such moments must let what it is doing finish or fail, never
//! answer 2xx for what it did not commit; a stop counts if requests were under way at it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncebox_testkit::child::killed;
use oncebox_testkit::history::{History, Outcome, Refusal};
use oncebox_testkit::seed::Seed;
use rand::Rng;

use crate::outbox;
use crate::table::{Report, Scenario, scale};
use crate::world::{self, PgSchema, StoreCounts, block_on};

pub const RANDOM_KILLS_SQLITE: Scenario = Scenario {
    name: "kills: random SIGKILL under load",
    backend: "sqlite",
    run: || Some(random_kills(None, Death::Kill)),
};

pub const RANDOM_POWER_CUTS_SQLITE: Scenario = Scenario {
    name: "kills: random power cut under load",
    backend: "sqlite",
    run: || Some(power_cuts()),
};

pub const RANDOM_TERMS_SQLITE: Scenario = Scenario {
    name: "kills: random SIGTERM under load",
    backend: "sqlite",
    run: || Some(random_kills(None, Death::Term)),
};

pub const RANDOM_KILLS_POSTGRES: Scenario = Scenario {
    name: "kills: random SIGKILL under load",
    backend: "postgres",
    run: || {
        let schema = block_on(world::PATIENCE, world::pg_schema())?;
        Some(random_kills(Some(&schema), Death::Kill))
    },
};

/// Graceful stops on PostgreSQL: batches in flight on the server and the pool closing as the
/// stop comes, where SQLite's stop ends at its own writer thread.
pub const RANDOM_TERMS_POSTGRES: Scenario = Scenario {
    name: "kills: random SIGTERM under load",
    backend: "postgres",
    run: || {
        let schema = block_on(world::PATIENCE, world::pg_schema())?;
        Some(random_kills(Some(&schema), Death::Term))
    },
};

const SENDERS: usize = 12;
/// The senders' source, which the gateway routes to [`outbox::ROUTE`].
pub const SOURCE: &str = "load";

/// How the gateway dies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Death {
    /// SIGKILL: what the gateway wrote stays in the page cache.
    Kill,
    /// SIGTERM: a graceful stop, which must exit cleanly.
    Term,
    /// A power cut, with the store at `Durability::Full` or, as a control, `Normal`.
    Power { normal: bool },
}

/// The power-cut run, and before it the same run at `Durability::Normal`, which must lose
/// acknowledged events (L or P): otherwise the cuts did not bite, and the run proves nothing.
fn power_cuts() -> Report {
    let control = random_kills(None, Death::Power { normal: true });
    let bitten = control.figures.l.len() + control.figures.p.len();
    let mut report = random_kills(None, Death::Power { normal: false });
    if bitten == 0 {
        report.exercised = 0;
    }
    report.what += &format!(
        "; control at Durability::Normal: L = {}, P = {}",
        control.figures.l.len(),
        control.figures.p.len()
    );
    report
}

/// With power cuts the gateway runs in a child of this binary writing through the power-loss
/// VFS (SQLite only), instead of `oncebox serve`.
fn random_kills(schema: Option<&PgSchema>, death: Death) -> Report {
    let seed = Seed::from_env(match death {
        Death::Kill => "random kills",
        Death::Term => "random graceful stops",
        Death::Power { normal: false } => "random power cuts",
        Death::Power { normal: true } => "random power cuts, control at Durability::Normal",
    });
    let mut rng = seed.rng(7);
    let events = scale(1500);
    let kills = scale(3);
    // Kill after these many acknowledgements: spread over the run.
    let mut at: Vec<usize> = (0..kills)
        .map(|_| rng.random_range(events / 10..events * 9 / 10))
        .collect();
    at.sort_unstable();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("kills.db");
    let database = schema.as_ref().map_or_else(
        || format!("sqlite://{}", sqlite.display()),
        |s| s.url.clone(),
    );
    let listen = world::free_addr();
    let base = format!("http://{listen}");
    let history = Arc::new(History::new());
    block_on(Duration::from_secs(200), async {
        let spec = match death {
            Death::Power { normal } => crate::crash::child(&format!(
                "power|{}|{listen}|{}",
                sqlite.display(),
                if normal { "normal" } else { "full" }
            )),
            Death::Kill | Death::Term => {
                outbox::configure(dir.path(), SOURCE);
                world::serve(dir.path(), &database, &listen, outbox::NO_RELAY)
            }
        };
        let mut server = spec.start();
        let (next, acked) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(tokio::sync::watch::Sender::new(0)),
        );
        let senders: Vec<_> = (0..SENDERS as u64)
            .map(|s| {
                let (history, base, next, acked) =
                    (history.clone(), base.clone(), next.clone(), acked.clone());
                let mut rng = seed.rng(100 + s);
                tokio::spawn(async move {
                    let c = world::client();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= events {
                            return;
                        }
                        // A fifth of the deliveries repeat an earlier event, and one in four
                        // of those with another payload: a conflict, which must be refused
                        // across the kills as it is without them.
                        let (id, tag) = if i > 10 && rng.random_range(0..5) == 0 {
                            let tag = if rng.random_range(0..4) == 0 {
                                "v2"
                            } else {
                                "v1"
                            };
                            (rng.random_range(0..i), tag)
                        } else {
                            (i, "v1")
                        };
                        let deadline = std::time::Instant::now() + world::PATIENCE;
                        loop {
                            let o =
                                world::deliver(&c, &history, &base, SOURCE, &format!("k{id}"), tag)
                                    .await;
                            if matches!(o, Outcome::Ok { .. }) {
                                acked.send_modify(|n| *n += 1);
                                break;
                            }
                            // Refused for good: the other payload was committed first.
                            if matches!(o, Outcome::Fail(Refusal::Conflict)) {
                                break;
                            }
                            assert!(
                                std::time::Instant::now() < deadline,
                                "k{id} never accepted: {o:?}"
                            );
                            // The sender's retry pace while the server is away.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        let mut done = 0;
        // Per kill, the requests under way around it: unanswered just before it, and just after
        // (sent in between, or cut and not yet told).
        let pending = || {
            let ops = history.ops().into_iter();
            ops.filter(|o| o.completed.is_none()).map(|o| o.id)
        };
        let mut in_flight: Vec<BTreeSet<usize>> = Vec::new();
        // Per graceful stop, how many requests were under way when the signal came.
        let mut under_way = Vec::new();
        for threshold in &at {
            let mut acks = acked.subscribe();
            let _ = acks.wait_for(|n| *n >= *threshold).await;
            let mut ids: BTreeSet<usize> = pending().collect();
            under_way.push(ids.len());
            let died = if death == Death::Term {
                // A graceful stop that fails is a fault of its own, not a stop to leave out.
                let status = server.terminate();
                assert!(
                    status.success(),
                    "the gateway's graceful stop ended {status}"
                );
                true
            } else {
                killed(server.kill())
            };
            if died {
                done += 1;
            }
            ids.extend(pending());
            in_flight.push(ids);
            server = spec.start();
        }
        for s in senders {
            s.await.unwrap();
        }
        // A kill interrupted work if a request under way when it fell never got an answer; one
        // that only met an idle server, or requests not yet sent, proves nothing.
        let ops = history.ops();
        let cut = |ids: &BTreeSet<usize>| {
            ids.iter()
                .any(|i| matches!(ops[*i].outcome(), Some(Outcome::Info(_))))
        };
        let interrupting = if death == Death::Term {
            under_way.iter().filter(|n| **n > 0).count()
        } else {
            in_flight.iter().filter(|ids| cut(ids)).count()
        };
        server.terminate();
        let store = StoreCounts::new(&sqlite, schema).await;
        let (mut figures, queued) = outbox::figures(&ops, &store).await;
        crate::conflicts::check(&mut figures, &ops, store.conflicts(SOURCE).await);
        let unanswered = history.count(|o| matches!(o, Outcome::Info(_)));
        let refused = history.count(|o| matches!(o, Outcome::Fail(Refusal::Conflict)));
        Report {
            figures,
            exercised: if done > 0 { interrupting as u64 } else { 0 },
            what: format!(
                "{done} {} at acks {at:?}, {interrupting} {}, {unanswered} requests \
                 unanswered, {refused} conflicts refused, {queued} deliveries queued",
                match death {
                    Death::Kill => "kills",
                    Death::Term => "clean graceful stops",
                    Death::Power { .. } => "power cuts",
                },
                if death == Death::Term {
                    format!("with requests under way ({under_way:?})")
                } else {
                    "with requests under way left unanswered".to_owned()
                }
            ),
            expected_unresolved: 0,
        }
    })
}
