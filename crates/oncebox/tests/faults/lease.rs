//! The Redis lease holder paused past its TTL: a child process takes the two-phase lease on a
//! key and is SIGSTOPped before its effect; the other worker, refused while the lease lives,
//! takes over with a higher fencing token once it expired in Redis, and applies the effect
//! behind the SQLite inbox. Resumed, the first holder finds the inbox done and its `release` is
//! refused (`Fenced`), as is a `complete` with an answer of its own: one effect per key, and
//! the new holder's answer is the one kept.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncebox_core::{Begun, Event, Key, LeaseError, ProcessError, Response};
use oncebox_redis::{Leases, redis};
use oncebox_sqlite::Inbox;
use oncebox_testkit::checker::check;
use oncebox_testkit::child::{Proc, Ready, Spec, until};
use oncebox_testkit::history::{History, Outcome, key};

use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, block_on, final_sqlite};

pub const REDIS_HOLDER_PAUSED: Scenario = Scenario {
    name: "redis: holder paused past TTL",
    backend: "sqlite",
    run: holder_paused,
};

/// The variable that makes this binary the first holder:
/// `<redis url>|<namespace>|<db path>|<effects file>|<event id>`.
const CHILD: &str = "ONCEBOX_FAULTS_LEASE_CHILD";
const SOURCE: &str = "lease";
/// The paused holder's Redis lease: short, so the pause outlives it, and long enough that the
/// other worker's first `begin` (after the holder stopped) comes while it still lives, on a
/// loaded machine too.
const SHORT: Duration = Duration::from_secs(2);
/// The inbox's lease and the second worker's Redis lease: longer than any step here.
const TTL: Duration = Duration::from_secs(30);

fn event(id: &str) -> Event {
    Event::json(Key::parse(SOURCE, id).unwrap(), world::body(id, "v1")).unwrap()
}

/// The external effect: one line per application, appended by whichever process applies it.
fn apply_effect(effects: &Path, event: &Event) -> Response {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(effects)
        .expect("the effects file");
    writeln!(f, "{}", event.key.event_id).expect("append the effect");
    Response::completed(format!("receipt for {}", event.key))
}

/// The inbox's lease, the effect, the inbox's completion, then Redis's (the pattern of the
/// crate's docs); a key the inbox holds as done releases the Redis lease instead (completed, it
/// would keep the answer a whole retention from now, past the record). Returns whether the
/// inbox answered a duplicate, and what Redis said.
async fn guarded(
    redis: &Leases,
    inbox: &Inbox,
    effects: &Path,
    event: &Event,
    fast: &oncebox_core::Lease,
) -> (bool, Result<(), LeaseError>) {
    match inbox.begin(event.clone(), TTL).await {
        Ok(Begun::Leased(lease)) => {
            let response = apply_effect(effects, event);
            inbox
                .complete(&lease, response.clone())
                .await
                .expect("the inbox completes");
            (false, redis.complete(fast, &response).await)
        }
        Ok(Begun::Duplicate(_)) => (true, redis.release(fast).await),
        other => panic!("the inbox answered {other:?}"),
    }
}

/// In a child process: takes the lease, stops itself before the effect, and finishes once
/// continued. Returns at once in the parent.
pub fn child_role() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, namespace, db, effects, id] = parts[..] else {
        panic!("bad {CHILD}: {spec}");
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let redis = Leases::connect(url, oncebox_redis::Options::new(namespace))
            .await
            .expect("connect to Redis");
        let inbox = Inbox::open(oncebox_sqlite::Options::new(db)).expect("open the inbox");
        let event = event(id);
        let Ok(Begun::Leased(fast)) = redis.begin(&event, SHORT).await else {
            panic!("the first holder did not get the lease");
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "leased {}", fast.token).unwrap();
        out.flush().unwrap();
        drop(out);
        // The pause: the process freezes here until the parent continues it.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).expect("stop");
        let (duplicate, said) = guarded(&redis, &inbox, Path::new(effects), &event, &fast).await;
        let said = match said {
            Ok(()) => "ok",
            Err(LeaseError::Fenced) => "fenced",
            Err(_) => "unavailable",
        };
        // A holder that skips the inbox (Redis alone guarding its effect) would complete here
        // with an answer of its own: refused as well, and the new holder's answer stays.
        let stale = Response::completed(format!("stale receipt for {}", event.key));
        let completed = match redis.complete(&fast, &stale).await {
            Ok(()) => "ok",
            Err(LeaseError::Fenced) => "fenced",
            Err(_) => "unavailable",
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "inbox duplicate={duplicate}").unwrap();
        writeln!(out, "redis {said}").unwrap();
        writeln!(out, "stale complete {completed}").unwrap();
        out.flush().unwrap();
    });
    std::process::exit(0);
}

/// Whether the process is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(p: &Proc) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).unwrap_or_default();
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
}

/// Deletes the namespace's keys from the shared Redis.
async fn forget(url: &str, namespace: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{namespace}:*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    for k in keys {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(k).query_async(&mut conn).await;
    }
}

/// Per key: the child holds the lease and stops; this worker is refused while the lease lives,
/// then takes over with a higher token and applies the effect; the child, continued, must be
/// fenced and find the inbox done.
fn holder_paused() -> Option<Report> {
    let url = oncebox_testkit::service_url("ONCEBOX_REDIS_URL")?;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lease.db");
    let effects = dir.path().join("effects.txt");
    let namespace = format!("oncebox-faults-{}", uuid::Uuid::new_v4());
    let history = Arc::new(History::new());
    Some(block_on(Duration::from_secs(120), async {
        let redis = Leases::connect(&url, oncebox_redis::Options::new(&namespace))
            .await
            .expect("connect to Redis");
        let inbox = Inbox::open(oncebox_sqlite::Options::new(&db)).expect("open the inbox");
        let rounds = scale(3);
        let (mut refused_live, mut fenced) = (0u64, 0u64);
        for round in 0..rounds {
            let id = format!("k{round}");
            let event = event(&id);
            let first = history.invoke(key(SOURCE, &id), "v1", None);
            let spec = format!(
                "{url}|{namespace}|{}|{}|{id}",
                db.display(),
                effects.display()
            );
            let mut holder = Spec::new(std::env::current_exe().unwrap())
                .env(CHILD, spec)
                .ready(Ready::Stdout("leased ".into()))
                .watch("redis fenced")
                .watch("redis ok")
                .watch("stale complete ")
                .watch("stale complete fenced")
                .watch("inbox duplicate=true")
                .start();
            let token_a: i64 = holder.ready.trim().parse().expect("a token");
            until("the holder stopped itself", PATIENCE, || stopped(&holder));
            // The other worker, until the paused holder's lease has expired in Redis. Its own
            // lease is long: its inbox work (two fsynced commits) must not race a short TTL on
            // a loaded machine; only the paused holder's lease is meant to expire.
            let second = history.invoke(key(SOURCE, &id), "v1", None);
            let deadline = Instant::now() + PATIENCE;
            let refused_before = refused_live;
            let fast = loop {
                match redis.begin(&event, TTL).await {
                    Ok(Begun::Leased(lease)) => break lease,
                    Err(ProcessError::InProgress { .. }) => refused_live += 1,
                    other => panic!("the second worker's begin: {other:?}"),
                }
                assert!(Instant::now() < deadline, "the paused lease never expired");
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert!(
                refused_live > refused_before,
                "the first begin came after the paused lease had expired: its refusal untested"
            );
            assert!(
                fast.token > token_a,
                "taken over with token {} after {token_a}",
                fast.token
            );
            assert!(fast.taken_over, "the lease says it was taken over");
            assert!(stopped(&holder), "the holder stayed paused past its TTL");
            let (duplicate, said) = guarded(&redis, &inbox, &effects, &event, &fast).await;
            assert!(!duplicate, "the inbox held {id} before anyone applied it");
            assert_eq!(said, Ok(()), "the new holder completes in Redis");
            second.end(Outcome::Ok { replayed: false });
            holder.resume();
            tokio::task::block_in_place(|| holder.wait());
            until("the holder reported", PATIENCE, || {
                holder.seen("stale complete ") == 1
            });
            let dup = holder.seen("inbox duplicate=true") == 1;
            first.end(Outcome::Ok { replayed: dup });
            assert_eq!(
                holder.seen("redis fenced"),
                1,
                "the paused holder's release is refused"
            );
            assert_eq!(
                holder.seen("stale complete fenced"),
                1,
                "the paused holder's completion is refused"
            );
            match redis.begin(&event, TTL).await {
                Ok(Begun::Duplicate(r)) => assert_eq!(
                    r.body,
                    format!("receipt for {}", event.key).into_bytes(),
                    "the new holder's answer stays"
                ),
                other => panic!("after both holders, Redis answered {other:?}"),
            }
            fenced += 1;
        }
        forget(&url, &namespace).await;
        let mut fin = final_sqlite(&db, false);
        // The effects are the file's lines, each applying the one payload every key was sent.
        fin.effects.clear();
        for id in std::fs::read_to_string(&effects)
            .unwrap_or_default()
            .lines()
        {
            fin.effects
                .entry(key(SOURCE, id))
                .or_default()
                .push("v1".to_owned());
        }
        Report {
            figures: check(&history.ops(), &fin),
            exercised: fenced,
            what: format!(
                "{fenced} paused holders fenced (release and completion refused); \
                 {refused_live} begins refused while the paused lease lived"
            ),
            expected_unresolved: 0,
        }
    }))
}
