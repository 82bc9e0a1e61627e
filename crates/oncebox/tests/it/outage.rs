//! PostgreSQL stopped, and PostgreSQL frozen, for 10 s under load: the gateway stays up and
//! answers every request made while the database is away `503` with `Retry-After` (never a
//! 2xx, never a replay); after the database is back, every event its sender retried is applied
//! exactly once. Stopped, the server is gone and connections are refused; frozen (every server
//! process SIGSTOPped), connections stay open and statements already sent hang, then run when
//! it thaws. The database is a private cluster, so the outage touches no other test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oncebox_postgres::sqlx::{self, Connection, PgConnection};
use oncebox_testkit::pg::Cluster;

use crate::nodes::{gateway, run_within, until};

/// A new event arrives this often, each from a sender of its own that retries it until a 2xx:
/// requests keep starting all through the outage, although each one made while the database is
/// away waits for the store's deadline before its 503.
const ARRIVAL: Duration = Duration::from_millis(25);
/// Events accepted before the outage starts, and after it ends before new events stop: the
/// load runs on both sides of it.
const WARM: usize = 100;
/// The outage, unless `ONCEBOX_OUTAGE_SECS` says otherwise (shorter for local runs).
const OUTAGE: Duration = Duration::from_secs(10);
const PATIENCE: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
listen = "127.0.0.1:0"
[sources.out]
signature = "none"
event_id = { pointer = "/id" }
"#;

/// One request and its answer: a status (with whether it said replayed and carried
/// `Retry-After`), or no answer at all.
struct Attempt {
    id: String,
    first: bool,
    start: Instant,
    end: Instant,
    /// The end on the system clock, to compare with the record's commit stamp.
    end_ms: i64,
    answer: Result<(u16, bool, bool), String>,
}

#[derive(Default)]
struct Load {
    attempts: Mutex<Vec<Attempt>>,
    accepted: AtomicUsize,
    stop: AtomicBool,
}

/// New events at a steady rate until `stop`; returns once every one of them was accepted.
async fn arrivals(url: String, load: Arc<Load>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut tick = tokio::time::interval(ARRIVAL);
    let mut senders = Vec::new();
    while !load.stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let id = format!("e{}", senders.len());
        senders.push(tokio::spawn(send(
            client.clone(),
            url.clone(),
            id,
            load.clone(),
        )));
    }
    for s in senders {
        s.await.unwrap();
    }
}

/// One event, sent until a 2xx; every request and its answer is recorded.
async fn send(client: reqwest::Client, url: String, id: String, load: Arc<Load>) {
    let mut first = true;
    loop {
        let start = Instant::now();
        let sent = client
            .post(format!("{url}/v1/sources/out/events"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"id":"{id}"}}"#))
            .send()
            .await;
        let answer = match sent {
            Ok(r) => Ok((
                r.status().as_u16(),
                r.headers().contains_key("idempotent-replayed"),
                r.headers().contains_key("retry-after"),
            )),
            Err(e) => Err(e.to_string()),
        };
        let accepted = matches!(answer, Ok((200..=299, _, _)));
        load.attempts.lock().unwrap().push(Attempt {
            id: id.clone(),
            first,
            start,
            end: Instant::now(),
            end_ms: now_ms(),
            answer,
        });
        if accepted {
            load.accepted.fetch_add(1, Ordering::SeqCst);
            return;
        }
        first = false;
        // Sooner than Retry-After asks: more requests land inside the outage.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn outage() -> Duration {
    std::env::var("ONCEBOX_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(OUTAGE, Duration::from_secs_f64)
}

/// The outage as the test saw it: the server was down from `down` (after the stop returned)
/// until `back` (before the start began); `_ms` are the same instants on the system clock.
struct Window {
    down: Instant,
    down_ms: i64,
    back: Instant,
    back_ms: i64,
}

/// How the database goes away.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `pg_ctl stop -m immediate`, then a start.
    Stopped,
    /// SIGSTOP to every server process, then SIGCONT.
    Frozen,
}

#[test]
fn postgres_stopped_under_load_gets_only_503s_and_every_retried_event_applies_once() {
    under_load(Fault::Stopped);
}

#[test]
fn postgres_frozen_under_load_gets_only_503s_and_every_retried_event_applies_once() {
    under_load(Fault::Frozen);
}

fn under_load(fault: Fault) {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let outage = outage();
    run_within(outage + Duration::from_secs(120), async move {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
        let database = cluster.url("postgres");
        let mut gw = gateway(dir.path(), &database, &[]);
        let load = Arc::new(Load::default());
        let senders = tokio::spawn(arrivals(gw.url.clone(), load.clone()));

        until("events accepted before the outage", PATIENCE, || {
            load.accepted.load(Ordering::SeqCst) >= WARM
        })
        .await;
        match fault {
            Fault::Stopped => tokio::task::block_in_place(|| cluster.stop_immediate()),
            Fault::Frozen => {
                // The postmaster and at least the gateway's own sessions.
                let stopped = cluster.freeze();
                assert!(stopped > 1, "{stopped} server processes frozen");
            }
        }
        let (down, down_ms) = (Instant::now(), now_ms());
        if let Fault::Stopped = fault {
            unavailable_admin_says_only_the_kind(&gw.url).await;
        }
        // The fault itself: the database stays away this long.
        tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
        let (back, back_ms) = (Instant::now(), now_ms());
        match fault {
            Fault::Stopped => tokio::task::block_in_place(|| cluster.resume()),
            Fault::Frozen => cluster.thaw(),
        }
        let before = load.accepted.load(Ordering::SeqCst);
        until("events accepted after the outage", PATIENCE, || {
            load.accepted.load(Ordering::SeqCst) >= before + WARM
        })
        .await;
        load.stop.store(true, Ordering::SeqCst);
        senders.await.unwrap();
        assert!(gw.running(), "the gateway stayed up through the outage");
        gw.stop();

        // Every inbox row with the moment its transaction really committed.
        let mut conn = PgConnection::connect(&database).await.unwrap();
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT event_id,
                    floor(extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000)::bigint
             FROM oncebox_inbox WHERE source = 'out' AND state = 'completed'",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut commits: HashMap<String, Vec<i64>> = HashMap::new();
        for (id, at) in rows {
            commits.entry(id).or_default().push(at);
        }
        let attempts = load.attempts.lock().unwrap();
        let window = Window {
            down,
            down_ms,
            back,
            back_ms,
        };
        eprint!("{fault:?}: ");
        check(&attempts, &commits, &window);
    });
}

/// An admin read while the database is away is a 503 that names the kind of trouble, never the
/// driver's words (which can name hosts, ports and roles): what ingress and `/readyz` say.
async fn unavailable_admin_says_only_the_kind(url: &str) {
    let answer = reqwest::get(format!("{url}/v1/stats")).await.unwrap();
    assert_eq!(answer.status(), 503);
    assert!(answer.headers().contains_key("retry-after"));
    let body: serde_json::Value = answer.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        [
            "the storage failed; try again later",
            "the store did not answer in time; try again",
            "the database is busy; try again",
            "the store is unavailable; try again later",
        ]
        .contains(&detail),
        "{detail}"
    );
}

fn describe(a: &Attempt) -> String {
    format!("{}: {:?}", a.id, a.answer)
}

/// Computes, prints and asserts the outcome of the run.
fn check(attempts: &[Attempt], commits: &HashMap<String, Vec<i64>>, w: &Window) {
    // At any time: an answer (the gateway stays up), only 202 or 503, and every 503 with
    // Retry-After.
    let unexpected: Vec<String> = attempts
        .iter()
        .filter(|a| !matches!(a.answer, Ok((202, _, _) | (503, _, true))))
        .map(describe)
        .collect();
    // Made and answered while the database was down: 503 and nothing else.
    let inside: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| a.start >= w.down && a.end <= w.back)
        .collect();
    let wrong_inside: Vec<String> = inside
        .iter()
        .filter(|a| !matches!(a.answer, Ok((503, false, true))))
        .map(|a| describe(a))
        .collect();
    // Answered while it was down (some made before): refusals.
    let refused_while_down = attempts
        .iter()
        .filter(|a| a.end >= w.down && a.end <= w.back)
        .filter(|a| matches!(a.answer, Ok((503, _, _))))
        .count();
    // P and F: every 2xx answered after its key's commit; a replay never on a first attempt.
    let committed_by = |id: &str, ms: i64| {
        commits
            .get(id)
            .is_some_and(|c| c.iter().any(|at| *at <= ms))
    };
    let early: Vec<String> = attempts
        .iter()
        .filter(|a| matches!(a.answer, Ok((202, _, _))))
        .filter(|a| {
            !committed_by(&a.id, a.end_ms) || (a.first && matches!(a.answer, Ok((_, true, _))))
        })
        .map(describe)
        .collect();
    // Nothing commits while the server is down: a row stamped then would be a made-up record.
    let committed_while_down = commits
        .values()
        .flatten()
        .filter(|at| **at > w.down_ms && **at < w.back_ms)
        .count();
    let mut ids: Vec<&str> = attempts.iter().map(|a| a.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let not_once: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| commits.get(*id).is_none_or(|c| c.len() != 1))
        .collect();
    let unavailable: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| matches!(a.answer, Ok((503, _, _))))
        .collect();
    let mut retried: Vec<&str> = unavailable.iter().map(|a| a.id.as_str()).collect();
    retried.sort_unstable();
    retried.dedup();
    let slowest = unavailable
        .iter()
        .map(|a| a.end.duration_since(a.start))
        .max()
        .unwrap_or_default();
    let replays = attempts
        .iter()
        .filter(|a| matches!(a.answer, Ok((_, true, _))))
        .count();
    let rows: usize = commits.values().map(Vec::len).sum();

    eprintln!(
        "outage: {} ms down; {} requests: {} made and answered while down (all 503 with \
         Retry-After: {}), {} refusals answered while down, {} 503s in all (the slowest after \
         {} ms), {} other answers; {} events sent, {} of them retried after a 503, {} replays; \
         F + P (2xx before the key's commit) = {}, commits while down = {}; inbox rows {rows}, \
         events not stored exactly once {}",
        w.back.duration_since(w.down).as_millis(),
        attempts.len(),
        inside.len(),
        wrong_inside.is_empty(),
        refused_while_down,
        unavailable.len(),
        slowest.as_millis(),
        unexpected.len(),
        ids.len(),
        retried.len(),
        replays,
        early.len(),
        committed_while_down,
        not_once.len(),
    );
    assert!(
        unexpected.is_empty(),
        "answers other than 202, or 503 with Retry-After: {unexpected:?}"
    );
    assert!(
        wrong_inside.is_empty(),
        "while the database was down: {wrong_inside:?}"
    );
    assert!(
        early.is_empty(),
        "2xx before the key's commit, or a replay of a first attempt: {early:?}"
    );
    assert_eq!(
        committed_while_down, 0,
        "rows committed while the database was down"
    );
    assert!(
        not_once.is_empty(),
        "sent but not stored exactly once: {not_once:?}"
    );
    assert_eq!(rows, ids.len(), "nothing stored that was not sent");
    assert!(
        refused_while_down > 0,
        "requests were refused during the outage (exercised)"
    );
    assert!(
        !inside.is_empty(),
        "no request was made and answered within the outage: it must outlast the store's \
         deadline (5 s) for that; ONCEBOX_OUTAGE_SECS is {:?}",
        std::env::var("ONCEBOX_OUTAGE_SECS").ok()
    );
    assert!(
        !retried.is_empty(),
        "events were retried after a 503 (exercised)"
    );
}
