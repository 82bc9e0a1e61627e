//! The crash-point matrix: a child process (this test binary, re-run) SIGKILLs itself at a named
//! point of the ingest path (`oncebox_gateway::crash::POINTS` before the store, then
//! `oncebox_sqlite::crash::POINTS`, on PostgreSQL
//! `oncebox_postgres::crash::POINTS`) or of the relay
//! (`relay-before-record`); the parent restarts it without the point, drains, and checks the
//! figures. "After the answer" is the parent's SIGKILL once answers came back.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::SystemClock;
use oncebox_gateway::policy::{GatewayConfig, Limits};
use oncebox_gateway::{Gateway, router, serve};
use oncebox_testkit::checker::check;
use oncebox_testkit::child::{Ready, Spec, killed, until_async};
use oncebox_testkit::history::{History, Outcome, key};
use oncebox_testkit::receiver::Receiver;
use oncebox_testkit::seed::Seed;
use rand::Rng;

use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, PgSchema, block_on, deliver, drain, final_pg, final_sqlite};

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
ingest_pg!(INGEST_BEFORE_COMMIT_POSTGRES, "before-commit");
ingest_pg!(INGEST_AFTER_COMMIT_POSTGRES, "after-commit");

pub const RELAY_BEFORE_RECORD_SQLITE: Scenario = Scenario {
    name: "crash: relay-before-record",
    backend: "sqlite",
    run: || Some(relay_crash(None)),
};

pub const RELAY_BEFORE_RECORD_POSTGRES: Scenario = Scenario {
    name: "crash: relay-before-record",
    backend: "postgres",
    run: || {
        let schema = block_on(PATIENCE, world::pg_schema())?;
        Some(relay_crash(Some(&schema)))
    },
};

/// In a child process: runs its role and exits. Returns at once in the parent.
pub fn child_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let skip: usize = parts[3].parse().expect("hits to pass");
    match parts[0] {
        "gateway" => {
            if parts[2] != "none" {
                fail::cfg(parts[2], &format!("{skip}*off->return")).expect("arm the point");
            }
            gateway_child(parts[1]);
        }
        "relay" => {
            fail::cfg("relay-before-record", &format!("{skip}*off->return")).expect("arm");
            relay_child(parts[1], parts[2]);
        }
        other => panic!("unknown child role {other}"),
    }
    std::process::exit(0);
}

/// The gateway on SQLite or PostgreSQL (a `postgres` URL) in this process, zero-configuration,
/// printing its address.
fn gateway_child(database: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        if database.starts_with("postgres") {
            let opts = oncebox_postgres::Options::new(database);
            let store = oncebox_postgres::Inbox::open(opts).await.expect("open");
            gateway_serve(store).await;
        } else {
            let opts = oncebox_sqlite::Options::new(database);
            gateway_serve(oncebox_sqlite::Inbox::open(opts).expect("open")).await;
        }
    });
}

async fn gateway_serve<S>(store: S)
where
    S: oncebox_core::store::EventStore + oncebox_core::relay_store::DeliveryStore,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gw = Arc::new(Gateway {
        store,
        config: GatewayConfig {
            open_sources: true,
            ..GatewayConfig::default()
        },
        clock: Arc::new(SystemClock),
        metrics: None,
        loopback_only: true,
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

fn child(role: &str) -> Spec {
    Spec::new(std::env::current_exe().expect("this binary"))
        .env(CHILD, role)
        .ready(Ready::Stdout("listening on ".into()))
}

/// Events sent once each by [`SENDERS`] senders while the child may die at `point`; then the
/// child comes back without it and every event is retried until acknowledged. On PostgreSQL
/// (`schema`) the gateway batches, so the commit points are passed once per batch there too.
fn ingest_crash(point: &'static str, schema: Option<&PgSchema>) -> Report {
    let backend = if schema.is_some() { " postgres" } else { "" };
    let seed = Seed::from_env(&format!("crash {point}{backend}"));
    let mut rng = seed.rng(1);
    let events = scale(400);
    // Per-event points are passed once per event, the commit points once per batch.
    let skip = match point {
        "after-inbox-insert" | "after-effect" => rng.random_range(0..events / 2),
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
                        let o = deliver(&c, &history, &base, SOURCE, &format!("e{i}"), "v1").await;
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
        let before = history.ops();
        let mut proc = child(&format!("gateway|{db}|none|0")).start();
        drain(&history, &proc.ready, SENDERS).await;
        proc.kill();
        let fin = match schema {
            Some(s) => final_pg(&s.pool().await, false).await,
            None => final_sqlite(&sqlite, false),
        };
        let figures = check(&history.ops(), &fin);
        let unanswered = before
            .iter()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Info(_))))
            .count();
        let acked_before = before
            .iter()
            .filter(|o| matches!(o.outcome(), Some(Outcome::Ok { .. })))
            .count();
        // Committed before the crash but never answered: the retry got a replay.
        let committed_unanswered = history
            .ops()
            .iter()
            .filter(|o| {
                o.id >= before.len() && matches!(o.outcome(), Some(Outcome::Ok { replayed: true }))
            })
            .filter(|o| {
                !before
                    .iter()
                    .any(|b| b.key == o.key && matches!(b.outcome(), Some(Outcome::Ok { .. })))
            })
            .count();
        // Killed between its COMMIT and its answers, the run left a committed batch nobody was
        // told of: those senders' retries must be replays of it. A retry answered as new would
        // mean the commit was lost and the key applied again, which the final store alone
        // (one record either way) cannot show.
        if died && point == "after-commit" {
            assert!(
                committed_unanswered > 0,
                "killed after a COMMIT, yet no retry was answered as a replay of it"
            );
        }
        Report {
            figures,
            exercised: u64::from(died),
            what: format!(
                "killed at {point} after {skip} hits: {acked_before} acked, {unanswered} unanswered, \
                 {committed_unanswered} committed unanswered"
            ),
            expected_u: 0,
        }
    })
}

/// The relay of the relay crash scenario: `ROUTE` to the receiver, idempotent, a 1 s lease.
fn route(receiver: &str) -> oncebox_core::route::Route {
    use oncebox_core::delivery::{Backoff, RetryPolicy};
    oncebox_core::route::Route {
        name: "hooks".into(),
        sources: vec![oncebox_core::Source::new("shop").unwrap()],
        filter: None,
        url: format!("http://{receiver}/hook"),
        // Shorter than the lease, as configuration validation demands of `oncebox relay`.
        timeout: Duration::from_millis(500),
        signing_secret: None,
        idempotent: true,
        status_url: None,
        retry: RetryPolicy {
            max_attempts: 50,
            max_age: Duration::from_secs(3600),
            backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_millis(500),
            },
        },
        concurrency: 4,
    }
}

const LEASE: Duration = Duration::from_secs(1);

fn relay_child(database: &str, receiver: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let options = oncebox_relay::RelayOptions {
            lease: LEASE,
            ..oncebox_relay::RelayOptions::default()
        };
        let routes = vec![route(receiver)];
        let clock = Arc::new(SystemClock);
        if database.starts_with("postgres") {
            let opts = oncebox_postgres::Options::new(database);
            let store = oncebox_postgres::Inbox::open(opts).await.expect("open");
            oncebox_relay::Relay::new(store, routes, clock, options)
                .run(std::future::pending())
                .await;
        } else {
            let store =
                oncebox_sqlite::Inbox::open(oncebox_sqlite::Options::new(database)).expect("open");
            oncebox_relay::Relay::new(store, routes, clock, options)
                .run(std::future::pending())
                .await;
        }
    });
}

fn relay_config(receiver: std::net::SocketAddr) -> String {
    format!(
        r#"
[sources.shop]
signature = "none"
event_id = {{ pointer = "/id" }}
[routes.hooks]
sources = ["shop"]
url = "http://{receiver}/hook"
idempotent = true
timeout = "500ms"
backoff = {{ base = "100ms", cap = "500ms" }}
[relay]
lease = "1s"
poll = "20ms"
"#
    )
}

/// Events accepted with one delivery each; a relay process dies between the receiver's 2xx
/// and its record; a healthy relay then delivers everything, the dead one's claims after its
/// lease, with the same idempotency key.
fn relay_crash(schema: Option<&PgSchema>) -> Report {
    let seed = Seed::from_env("crash relay-before-record");
    let events = scale(60);
    let skip = seed.rng(1).random_range(0..events / 2);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("relay.db");
    let database = schema.map_or_else(|| sqlite.to_str().unwrap().to_owned(), |s| s.url.clone());
    block_on(Duration::from_secs(120), async {
        let (receiver, at) = Receiver::start().await;
        std::fs::write(dir.path().join("oncebox.toml"), relay_config(at)).unwrap();
        let history = Arc::new(History::new());
        let mut gw = world::serve(dir.path(), &database, "127.0.0.1:0", &["--no-relay"]).start();
        let base = world::url(&gw);
        let c = world::client();
        for i in 0..events {
            world::deliver_until_done(&c, &history, &base, "shop", &format!("r{i}"), "v1").await;
        }
        gw.terminate();
        let mut relay = Spec::new(std::env::current_exe().unwrap())
            .env(CHILD, format!("relay|{database}|{at}|{skip}"))
            .start();
        let died = killed(tokio::task::block_in_place(|| relay.wait()));
        let before = receiver.per_key();
        let mut healthy = Spec::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["--database", &database, "relay"])
            .dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env("RUST_LOG", "info")
            .ready(Ready::Stderr("relay running".into()))
            .start();
        let delivered = || receiver.per_key().len() >= events;
        until_async("every event reaches the receiver", PATIENCE, delivered).await;
        let mut fin = match schema {
            Some(s) => {
                let pool = s.pool().await;
                let all = async || {
                    let n: i64 = oncebox_postgres::sqlx::query_scalar(
                        "SELECT count(*) FROM oncebox_outbox WHERE state = 'delivered'",
                    )
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                    n as usize >= events
                };
                let deadline = std::time::Instant::now() + PATIENCE;
                while !all().await {
                    assert!(std::time::Instant::now() < deadline, "outbox not drained");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                final_pg(&pool, true).await
            }
            None => {
                until_async("every delivery recorded", PATIENCE, || {
                    outbox_delivered(&sqlite) >= events
                })
                .await;
                final_sqlite(&sqlite, true)
            }
        };
        healthy.terminate();
        // The effect is the receiver's: it honours the key, so its first application counts.
        fin.effects = receiver
            .applied()
            .into_iter()
            .map(|(k, bodies)| {
                let (source, id) = k.split_once(':').unwrap_or(("?", &k));
                (key(source, id), vec![world::tag_of(&bodies[0])])
            })
            .collect();
        let resent = receiver
            .per_key()
            .iter()
            .filter(|(k, n)| **n > 1 && before.get(*k).is_some_and(|b| *b >= 1))
            .count();
        Report {
            figures: check(&history.ops(), &fin),
            exercised: u64::from(died) * resent as u64,
            what: format!(
                "relay SIGKILLed after {skip} records; {resent} keys re-sent with the same key"
            ),
            expected_u: 0,
        }
    })
}

fn outbox_delivered(db: &std::path::Path) -> usize {
    let c = oncebox_sqlite::rusqlite::Connection::open(db).unwrap();
    c.query_row(
        "SELECT count(*) FROM oncebox_outbox WHERE state = 'delivered'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as usize
}
