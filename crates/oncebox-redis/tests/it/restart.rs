//! Redis restarted empty and Redis down, on a private `redis-server` the test kills: the SQL
//! inbox still stops a second effect, and an outage is never answered as a duplicate.

use std::time::{Duration, Instant};

use oncebox_core::{Begun, Event, Key, LeaseError, ProcessError, Response};
use oncebox_redis::{ConnectError, Leases, Resolution};
use oncebox_sqlite::{Inbox, RecordState};
use oncebox_testkit::run;

use crate::guard::{Answer, Receiver, RedisSaw, TTL, deliver, finish};
use crate::harness::{Namespace, PrivateRedis, event, query, raw, report};
use crate::lease::leased;

const KEYS: usize = 20;

/// True when the inbox holds the key as done: the only state a duplicate answer may rest on.
async fn committed(inbox: &Inbox, key: &Key) -> bool {
    matches!(
        inbox.record(key).await.unwrap().map(|r| r.state),
        Some(RecordState::Done(_))
    )
}

/// Tallies answers: effects per key are counted by the receiver; a duplicate answer for a key
/// the inbox had not committed is a false duplicate (F).
#[derive(Debug, Default)]
struct Tally {
    accepted: Vec<Event>,
    false_duplicates: usize,
}

impl Tally {
    async fn note(&mut self, inbox: &Inbox, event: &Event, answer: &Answer) {
        match answer {
            Answer::Applied(response) => {
                assert_eq!(
                    response.body,
                    format!("receipt for {}", event.key).into_bytes()
                );
                self.accepted.push(event.clone());
            }
            Answer::Duplicate(first) => {
                assert_eq!(
                    first.body,
                    format!("receipt for {}", event.key).into_bytes()
                );
                if !committed(inbox, &event.key).await {
                    self.false_duplicates += 1;
                }
                self.accepted.push(event.clone());
            }
            Answer::NotNow(_) => {}
        }
    }

    /// (D, L): keys applied more than once; accepted keys with no effect.
    fn figures(&self, receiver: &Receiver) -> (usize, usize) {
        let mut keys: Vec<&Event> = self.accepted.iter().collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        keys.dedup_by(|a, b| a.key == b.key);
        let doubles = keys.iter().filter(|e| receiver.effects(e) > 1).count();
        let lost = keys.iter().filter(|e| receiver.effects(e) == 0).count();
        (doubles, lost)
    }
}

#[test]
fn restarted_empty_redis_cannot_cause_a_second_effect() {
    let Some(mut server) = PrivateRedis::start() else {
        return;
    };
    run(async move {
        let url = server.url();
        let ns = Namespace::new(&url);
        let redis = ns.leases().await;
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(oncebox_sqlite::Options::new(dir.path().join("inbox.db"))).unwrap();
        let receiver = Receiver::default();
        let mut tally = Tally::default();
        let events: Vec<Event> = (0..KEYS).map(|i| event(&format!("order-{i}"), 1)).collect();

        // Before the fault: each key applied once; its redelivery answered from Redis.
        let mut cached_before = 0;
        for e in &events {
            let (answer, _) = deliver(&redis, &inbox, &receiver, e).await;
            assert!(matches!(answer, Answer::Applied(_)), "{answer:?}");
            tally.note(&inbox, e, &answer).await;
            let (answer, saw) = deliver(&redis, &inbox, &receiver, e).await;
            cached_before += usize::from(saw == RedisSaw::Duplicate);
            tally.note(&inbox, e, &answer).await;
        }
        assert_eq!(
            cached_before, KEYS,
            "Redis held every answer before the fault"
        );

        // A delivery in flight at the fault: both leases taken, the effect done, not completed.
        let inflight = event("order-inflight", 1);
        let fast = leased(redis.begin(&inflight, TTL).await);
        let lease = leased(inbox.begin(inflight.clone(), TTL).await);
        let response = receiver.send(&inflight);

        // The fault: Redis killed and started again, empty.
        server.restart();
        let mut conn = raw(&url).await;
        let keys_after: i64 = query(&mut conn, "DBSIZE", &[]).await;
        assert_eq!(keys_after, 0, "the restarted Redis really is empty");

        // Another worker redelivers the in-flight event. Until the handle has reconnected,
        // Redis is unavailable and the inbox alone answers; then Redis, having forgotten,
        // hands out a new lease — with a token above every token before the restart — and
        // the inbox still holds the first holder's lease.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut unavailable = 0;
        let token_after = loop {
            let (answer, saw) = deliver(&redis, &inbox, &receiver, &inflight).await;
            let Answer::NotNow(why) = answer else {
                panic!("the in-flight key answered {answer:?}")
            };
            assert!(
                why.contains("InProgress"),
                "the inbox holds the lease: {why}"
            );
            match saw {
                RedisSaw::Leased(token) => break token,
                RedisSaw::Unavailable if Instant::now() < deadline => unavailable += 1,
                other => panic!("Redis after its restart: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            token_after > fast.token,
            "{token_after} after {}",
            fast.token
        );

        // The first holder finishes: the inbox completes; Redis no longer knows its lease.
        let redis_said = finish(&redis, &inbox, &lease, Some(&fast), &response).await;
        assert_eq!(redis_said, Some(Err(LeaseError::Fenced)));
        tally.accepted.push(inflight.clone());

        // Every key again, twice: first Redis has forgotten and the inbox answers, then
        // Redis answers from the refilled cache.
        let (mut forgotten, mut refilled) = (0, 0);
        for e in events.iter().chain([&inflight]) {
            let (answer, saw) = deliver(&redis, &inbox, &receiver, e).await;
            assert!(matches!(answer, Answer::Duplicate(_)), "{answer:?}");
            forgotten += usize::from(matches!(saw, RedisSaw::Leased(_)));
            tally.note(&inbox, e, &answer).await;
            let (answer, saw) = deliver(&redis, &inbox, &receiver, e).await;
            refilled += usize::from(saw == RedisSaw::Duplicate);
            tally.note(&inbox, e, &answer).await;
        }

        let (doubles, lost) = tally.figures(&receiver);
        report(
            "redis-restart",
            doubles,
            lost,
            tally.false_duplicates,
            &format!(
                "keys={} restarted_empty=1 forgotten={forgotten} refilled={refilled} \
                 unavailable_while_reconnecting={unavailable} token_before={} token_after={token_after}",
                KEYS + 1,
                fast.token
            ),
        );
        assert_eq!((forgotten, refilled), (KEYS + 1, KEYS + 1));
    });
}

#[test]
fn redis_down_answers_unavailable_never_duplicate() {
    let Some(mut server) = PrivateRedis::start() else {
        return;
    };
    run(async move {
        let url = server.url();
        let ns = Namespace::new(&url);
        let leases = Leases::connect(&url, ns.options().deadline(Duration::from_millis(500)))
            .await
            .unwrap();
        let done = event("paid", 1);
        let lease = leased(leases.begin(&done, TTL).await);
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .unwrap();
        let open = leased(leases.begin(&event("open", 1), TTL).await);
        assert!(leases.recall(&done).await.unwrap().is_some());

        server.kill();
        let (mut unavailable, mut false_duplicates) = (0, 0);
        for _ in 0..3 {
            match leases.begin(&done, TTL).await {
                Err(ProcessError::Unavailable(_)) => unavailable += 1,
                Ok(Begun::Duplicate(_)) => false_duplicates += 1,
                other => panic!("with Redis down: {other:?}"),
            }
        }
        let new = leases.begin(&event("new", 1), TTL).await;
        assert!(matches!(new, Err(ProcessError::Unavailable(_))), "{new:?}");
        assert!(leases.recall(&done).await.is_err(), "no cached answer");
        let r = Response::completed("late");
        assert!(matches!(
            leases.complete(&open, &r).await,
            Err(LeaseError::Unavailable(_))
        ));
        assert!(matches!(
            leases.release(&open).await,
            Err(LeaseError::Unavailable(_))
        ));
        assert!(
            leases
                .resolve(&done.key, Resolution::Released)
                .await
                .is_err()
        );
        let now = leases.options().clock.now();
        assert!(leases.remember(&done, &r, now).await.is_err());
        let refused =
            Leases::connect(&url, ns.options().deadline(Duration::from_millis(500))).await;
        assert!(
            matches!(refused, Err(ConnectError::Unavailable(_))),
            "{refused:?}"
        );
        let bad = Leases::connect("no-such-scheme://x", ns.options()).await;
        assert!(matches!(bad, Err(ConnectError::Url(_))), "{bad:?}");
        // No effect runs while Redis is down, so there are no doubles or losses to count: the
        // one figure this outage can break is F, a key answered as done without a record.
        eprintln!("scenario=redis-down F={false_duplicates} unavailable={unavailable}");
        assert_eq!(
            false_duplicates, 0,
            "redis-down: a duplicate answered with Redis down"
        );
        assert_eq!(unavailable, 3, "the outage was really met");
    });
}
