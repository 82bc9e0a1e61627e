//! The crash-point matrix: a child process (this test binary, re-run) SIGKILLs itself at a named
//! point of the ingest path (`oncebox_gateway::crash::POINTS` before the store, then
//! `oncebox_sqlite::crash::POINTS`, on PostgreSQL
//! `oncebox_postgres::crash::POINTS`) or of the relay
//! (`relay-before-record`); the parent restarts it without the point, drains, and checks the
//! figures, and that every stored event holds its one delivery (`outbox.rs`). "After the answer"
//! is the parent's SIGKILL once answers came back.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::SystemClock;
use oncebox_gateway::policy::{GatewayConfig, Limits};
use oncebox_gateway::{Gateway, router, serve};
use oncebox_testkit::child::{Ready, Spec, killed};
use oncebox_testkit::history::{History, Outcome};
use oncebox_testkit::seed::Seed;
use rand::Rng;

mod relay;

use relay::relay_child;
pub use relay::{RELAY_BEFORE_RECORD_POSTGRES, RELAY_BEFORE_RECORD_SQLITE};

use crate::outbox;
use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, PgSchema, StoreCounts, block_on, deliver, drain};

/// The variable that makes this binary a child: `gateway|<database>|<point>|<hits to pass>` or
/// `relay|<database>|<receiver addr>|<hits to pass>`.
const CHILD: &str = "ONCEBOX_FAULTS_CHILD";
const SOURCE: &str = "crash";
const SENDERS: usize = 8;

macro_rules! ingest {
    ($name:ident, $point:literal) => {
        pub const $name: Scenario = Scenario {
            name: concat!("crash: ingest ", $point),
            backend: "sqlite",
            run: || Some(ingest_crash($point, None)),
        };
    };
}
macro_rules! ingest_pg {
    ($name:ident, $point:literal) => {
        pub const $name: Scenario = Scenario {
            name: concat!("crash: ingest ", $point),
            backend: "postgres",
            run: || {
                let schema = block_on(PATIENCE, world::pg_schema())?;
                Some(ingest_crash($point, Some(&schema)))
            },
        };
    };
}
ingest!(INGEST_AFTER_BODY_READ, "after-body-read");
ingest!(INGEST_AFTER_SIGNATURE_CHECK, "after-signature-check");
ingest!(INGEST_AFTER_BEGIN, "after-begin");
ingest!(INGEST_AFTER_INBOX_INSERT, "after-inbox-insert");
ingest!(INGEST_AFTER_EFFECT, "after-effect");
ingest!(INGEST_BEFORE_COMMIT, "before-commit");
ingest!(INGEST_AFTER_COMMIT, "after-commit");
ingest!(INGEST_AFTER_ANSWER, "after-answer");
ingest_pg!(INGEST_AFTER_BODY_READ_POSTGRES, "after-body-read");
ingest_pg!(
    INGEST_AFTER_SIGNATURE_CHECK_POSTGRES,
    "after-signature-check"
);
ingest_pg!(INGEST_AFTER_BEGIN_POSTGRES, "after-begin");
ingest_pg!(INGEST_AFTER_INBOX_INSERT_POSTGRES, "after-inbox-insert");
ingest_pg!(INGEST_AFTER_EFFECT_POSTGRES, "after-effect");
ingest_pg!(INGEST_BEFORE_COMMIT_POSTGRES, "before-commit");
ingest_pg!(INGEST_AFTER_COMMIT_POSTGRES, "after-commit");
ingest_pg!(INGEST_AFTER_ANSWER_POSTGRES, "after-answer");

/// In a child process: runs its role and exits. Returns at once in the parent.
pub fn child_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let skip = || -> usize { parts[3].parse().expect("hits to pass") };
    match parts[0] {
        "gateway" => {
            if parts[2] != "none" {
                fail::cfg(parts[2], &format!("{}*off->return", skip())).expect("arm the point");
            }
            gateway_child(parts[1], "127.0.0.1:0", oncebox_sqlite::Durability::Full);
        }
        // The gateway on SQLite through the power-loss VFS, listening on `parts[2]`: a SIGKILL
        // then leaves on disk only what was synced (`kills.rs`). `parts[3]` is `normal` for
        // the control run at `Durability::Normal`.
        "power" => {
            assert!(
                oncebox_sqlite::powerloss::install(),
                "the power-loss VFS installs"
            );
            let durability = match parts[3] {
                "normal" => oncebox_sqlite::Durability::Normal,
                _ => oncebox_sqlite::Durability::Full,
            };
            gateway_child(parts[1], parts[2], durability);
        }
        "relay" => {
            fail::cfg("relay-before-record", &format!("{}*off->return", skip())).expect("arm");
            relay_child(parts[1], parts[2]);
        }
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

/// The gateway on SQLite (at `durability`) or PostgreSQL (a `postgres` URL) in this process,
/// zero-configuration, printing its address.
fn gateway_child(database: &str, listen: &str, durability: oncebox_sqlite::Durability) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        if database.starts_with("postgres") {
            let opts = oncebox_postgres::Options::new(database);
            let store = oncebox_postgres::Inbox::open(opts).await.expect("open");
            gateway_serve(store, listen).await;
        } else {
            let opts = oncebox_sqlite::Options::new(database).durability(durability);
            gateway_serve(oncebox_sqlite::Inbox::open(opts).expect("open"), listen).await;
        }
    });
}

async fn gateway_serve<S>(store: S, listen: &str)
where
    S: oncebox_core::store::EventStore + oncebox_core::relay_store::DeliveryStore,
{
    // A fixed port just freed by a killed process may be held for a moment by a sender's
    // outgoing connection: retried until it is free.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let listener = loop {
        match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{listen} stays in use"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("bind {listen}: {e}"),
        }
    };
    let addr = listener.local_addr().unwrap();
    let gw = Arc::new(Gateway {
        store,
        config: GatewayConfig {
            open_sources: true,
            // Every event gets a delivery on this route, committed with its record: the scenarios
            // check that a crash never leaves one without the other.
            routes: vec![outbox::route(&[SOURCE, crate::kills::SOURCE])],
            ..GatewayConfig::default()
        },
        clock: Arc::new(SystemClock),
        metrics: None,
        loopback_only: true,
        logouts: Default::default(),
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{addr}").unwrap();
    out.flush().unwrap();
    drop(out);
    let _ = serve(
        listener,
        router(gw),
        Limits::default(),
        std::future::pending(),
    )
    .await;
}

pub(crate) fn child(role: &str) -> Spec {
    Spec::new(std::env::current_exe().expect("this binary"))
        .env(CHILD, role)
        .ready(Ready::Stdout("listening on ".into()))
}

/// A lone request whose gateway dies at the first pass of `point` ([`first_request`]); then
/// events sent once each by [`SENDERS`] senders while the child may die at `point`; then the
/// child comes back without it and every event is retried until acknowledged. On PostgreSQL
/// (`schema`) the gateway batches, so the commit points are passed once per batch there too.
fn ingest_crash(point: &'static str, schema: Option<&PgSchema>) -> Report {
    let backend = if schema.is_some() { " postgres" } else { "" };
    let seed = Seed::from_env(&format!("crash {point}{backend}"));
    let mut rng = seed.rng(1);
    let events = scale(400);
    // On SQLite the inbox and effect points are passed once per event, on PostgreSQL once per
    // batch, as the commit points are on both: a skip past the batches the run makes would
    // never die, so it stays within what eight senders batched eight at a time still pass.
    let per_event = if schema.is_some() { 8 } else { 2 };
    let skip = match point {
        "after-inbox-insert" | "after-effect" => rng.random_range(0..events / per_event),
        "after-answer" => rng.random_range(events / 8..events / 2),
        _ => rng.random_range(0..6),
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("crash.db");
    let db = schema.map_or_else(|| sqlite.to_str().unwrap().to_owned(), |s| s.url.clone());
    let armed = if point == "after-answer" {
        "none"
    } else {
        point
    };
    let history = Arc::new(History::new());
    block_on(Duration::from_secs(120), async {
        // Nothing is committed in a run that dies before its first COMMIT, so the retry of the
        // first request must be stored afresh; after the COMMIT it must be a replay. (After the
        // answer there is no first request to lose: the parent kills once answers came back.)
        let lone = if armed == "none" {
            "no lone first request".to_owned()
        } else {
            let replayed = first_request(&history, &db, point).await;
            assert_eq!(
                replayed,
                point == "after-commit",
                "the first request's gateway died at {point}, yet its retry was answered {}",
                if replayed { "as a replay" } else { "afresh" }
            );
            format!(
                "a lone first request killed at {point} retried {}",
                if replayed { "as a replay" } else { "afresh" }
            )
        };
        // The main run's operations, after the first request's.
        let probe = history.ops().len();
        let mut first = child(&format!("gateway|{db}|{armed}|{skip}")).start();
        let base = first.ready.clone();
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let acked = Arc::new(tokio::sync::watch::Sender::new(0usize));
        let senders: Vec<_> = (0..SENDERS)
            .map(|_| {
                let (history, base, next, acked) =
                    (history.clone(), base.clone(), next.clone(), acked.clone());
                tokio::spawn(async move {
                    let c = world::client();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= events {
                            return;
                        }
                        // One in eight sends an earlier event's id with another payload: a
                        // conflict (or, sent first, the winner), refused across the crash as
                        // without it.
                        // (`& !4`: an earlier id that was itself sent with v1.)
                        let (id, tag) = if i % 8 == 7 {
                            ((i / 2) & !4, "v2")
                        } else {
                            (i, "v1")
                        };
                        let o = deliver(&c, &history, &base, SOURCE, &format!("e{id}"), tag).await;
                        if matches!(o, Outcome::Ok { .. }) {
                            acked.send_modify(|n| *n += 1);
                        }
                    }
                })
            })
            .collect();
        if point == "after-answer" {
            let mut acks = acked.subscribe();
            let _ = acks.wait_for(|n| *n >= skip).await;
            first.kill();
        }
        for s in senders {
            s.await.unwrap();
        }
        // The first run must have died at its point; if it still runs once every event was
        // sent, the point was never reached and the run is inconclusive.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while first.running() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let died = !first.running() && killed(first.wait());
        let before: Vec<_> = history.ops().into_iter().skip(probe).collect();
        // What the dead process left on disk, read before anything opens the store again.
        let on_disk = if died {
            let store = StoreCounts::new(&sqlite, schema).await;
            store.fin(false).await.records.into_keys().collect()
        } else {
            std::collections::BTreeSet::new()
        };
        let mut proc = child(&format!("gateway|{db}|none|0")).start();
        drain(&history, &proc.ready, SENDERS).await;
        proc.kill();
        let store = StoreCounts::new(&sqlite, schema).await;
        let ops = history.ops();
        let (mut figures, queued) = outbox::figures(&ops, &store).await;
        // Refusals kept beyond those answered: conflicts committed but never answered.
        let refused_unanswered =
            crate::conflicts::check(&mut figures, &ops, store.conflicts(SOURCE).await);
        let unanswered = before
            .iter()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Info(_))))
            .count();
        let acked_before = before
            .iter()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { .. })))
            .count();
        // Operations up to the kill, and those after it (the retries against the restarted
        // gateway); the keys acknowledged before it (the lone first request's included).
        let after_kill = probe + before.len();
        let acked: std::collections::BTreeSet<_> = ops
            .iter()
            .filter(|o| o.id < after_kill && matches!(o.outcome(), Some(Outcome::Ok { .. })))
            .map(|o| &o.key)
            .collect();
        let retries = || ops.iter().filter(|o| o.id >= after_kill);
        // Committed before the crash but never answered: the retry got a replay.
        let committed_unanswered = retries()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { replayed: true })))
            .filter(|o| !acked.contains(&o.key))
            .count();
        // A key on disk when the process died was committed, answered or not: a retry of it
        // answered as new would have applied it again (the final store, one record either way,
        // cannot show that).
        let afresh: Vec<_> = retries()
            .filter(|o| on_disk.contains(&o.key))
            .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { replayed: false })))
            .map(|o| format!("{}/{}", o.key.0, o.key.1))
            .collect();
        let stored_unanswered = on_disk.iter().filter(|k| !acked.contains(k)).count();
        assert!(
            afresh.is_empty(),
            "stored before the kill at {point}, yet answered as new after it: {afresh:?}"
        );
        // Killed between its COMMIT and its answers, the run left committed work nobody was
        // told of: some retry must be a replay of it, or, where all it held were refusals
        // (refused again on retry whether or not the commit survived), a refusal must be kept
        // beyond those answered. Without either, the run never reached the state it is for.
        if died && point == "after-commit" {
            assert!(
                committed_unanswered + refused_unanswered > 0,
                "killed after a COMMIT, yet no retry was answered as a replay of it and no \
                 refusal of it was kept"
            );
        }
        // Killed by its first pass of a point before COMMIT: nothing of this run was durable,
        // so no retry may be answered as a replay.
        if died && skip == 0 && !matches!(point, "after-commit" | "after-answer") {
            assert_eq!(
                committed_unanswered, 0,
                "killed at the first pass of {point}, before any COMMIT, yet retries were \
                 answered as replays"
            );
        }
        let refused = figures.conflicts_detected;
        Report {
            figures,
            exercised: u64::from(died),
            what: format!(
                "{lone}; killed at {point} after {skip} hits: {acked_before} acked, \
                 {unanswered} unanswered, {stored_unanswered} stored unanswered at the kill \
                 ({committed_unanswered} replayed), \
                 {refused} conflicts refused ({refused_unanswered} unanswered); {queued} \
                 deliveries queued"
            ),
            expected_unresolved: 0,
        }
    })
}

/// One request to a gateway on `db` armed to die the first time it passes `point`; then the
/// same request to the gateway back without the point, until it is answered. Returns whether
/// that answer was a replay. Fails unless the armed gateway died on the request unanswered.
async fn first_request(history: &History, db: &str, point: &str) -> bool {
    let mut armed = child(&format!("gateway|{db}|{point}|0")).start();
    let c = world::client();
    let o = deliver(&c, history, &armed.ready, SOURCE, "first", "v1").await;
    assert!(
        matches!(o, Outcome::Info(_)),
        "the first request to a gateway armed at {point} was answered: {o:?}"
    );
    let deadline = std::time::Instant::now() + PATIENCE;
    while armed.running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway armed at {point} outlived its request"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        killed(armed.wait()),
        "the gateway armed at {point} ended otherwise than by SIGKILL"
    );
    let mut again = child(&format!("gateway|{db}|none|0")).start();
    let o = world::deliver_until_done(&c, history, &again.ready, SOURCE, "first", "v1").await;
    again.kill();
    match o {
        Outcome::Ok { replayed } => replayed,
        other => panic!("the retry of the first request ended {other:?}"),
    }
}
