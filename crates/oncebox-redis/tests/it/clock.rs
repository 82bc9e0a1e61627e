//! The Redis host's clock stepping back under a lease: the lease's end (and the record's
//! expiry, wall-clock time in Redis too) then lie as far ahead as the step. The first contender
//! re-anchors it to one lease from then, so the key is not held for the length of the step, and
//! its holder keeps its lease. The step is staged in the record (its `until`, the `until` kept
//! beside the lease's length, and its expiry moved an hour ahead, as a step back of an hour
//! leaves them): the host's clock itself is not the test's to set.

use std::time::{Duration, Instant};

use oncebox_core::{Begun, Event, LeaseError, ProcessError, Response};
use oncebox_redis::Leases;
use oncebox_testkit::run;

use crate::harness::{Namespace, event, query, raw, redis_now, shared};
use crate::lease::leased;

const TTL: Duration = Duration::from_secs(1);
const TTL_MS: i64 = 1_000;
const HOUR_MS: i64 = 3_600_000;

/// Moves the lease of `e` an hour and its length ahead, as a clock stepped back an hour since
/// it was taken leaves it; with `kept_until` false, as an earlier build's `begin` would have
/// rewritten `until` and left the length of the lease before it.
async fn step_back_an_hour(ns: &Namespace, url: &str, e: &Event, kept_until: bool) {
    let mut conn = raw(url).await;
    let record = ns.record(&e.key);
    let until = (redis_now(&mut conn).await + HOUR_MS + TTL_MS).to_string();
    let ttl = if kept_until {
        format!("{TTL_MS}:{until}")
    } else {
        format!("{TTL_MS}:1")
    };
    let _: i64 = query(&mut conn, "HSET", &[&record, "until", &until, "ttl", &ttl]).await;
    let expiry = (HOUR_MS + 2 * TTL_MS).to_string();
    let _: i64 = query(&mut conn, "PEXPIRE", &[&record, &expiry]).await;
}

async fn busy_for(leases: &Leases, e: &Event) -> Duration {
    match leases.begin(e, TTL).await {
        Err(ProcessError::InProgress { retry_after }) => retry_after,
        other => panic!("a lease just begun is held after the step: {other:?}"),
    }
}

#[test]
fn a_lease_dated_before_the_clock_stepped_back_holds_its_key_one_lease_at_most() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        let e = event("stepped", 1);
        let first = leased(leases.begin(&e, TTL).await);
        step_back_an_hour(&ns, &url, &e, true).await;

        // Not taken over at once (its holder may still be at work), but told to come back
        // within a lease, not an hour.
        let after = busy_for(&leases, &e).await;
        assert!(after <= TTL, "held for {after:?} after the step");
        let record = ns.record(&e.key);
        let pttl: i64 = query(&mut conn, "PTTL", &[&record]).await;
        assert!(
            pttl > 0 && pttl <= 2 * TTL_MS,
            "the record kept as long again: {pttl}"
        );

        // One lease later the key is taken over, and the first holder is fenced.
        let deadline = Instant::now() + Duration::from_secs(10);
        let second = loop {
            match leases.begin(&e, TTL).await {
                Ok(Begun::Leased(lease)) => break lease,
                Err(ProcessError::InProgress { .. }) => {
                    assert!(Instant::now() < deadline, "never taken over");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(second.taken_over && second.token > first.token);
        assert_eq!(
            leases.complete(&first, &Response::completed("late")).await,
            Err(LeaseError::Fenced)
        );
        leases
            .complete(&second, &Response::completed("sent"))
            .await
            .unwrap();
        // A done record keeps no lease fields to re-anchor.
        let left: Vec<Option<String>> = query(&mut conn, "HMGET", &[&record, "until", "ttl"]).await;
        assert_eq!(left, [None, None]);
    });
}

/// Re-anchored, the lease is still its holder's for a whole length: it completes.
#[test]
fn a_re_anchored_lease_is_still_its_holders() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let e = event("re-anchored", 1);
        let holder = leased(leases.begin(&e, TTL).await);
        step_back_an_hour(&ns, &url, &e, true).await;
        assert!(busy_for(&leases, &e).await <= TTL);
        leases
            .complete(&holder, &Response::completed("sent"))
            .await
            .unwrap();
        assert!(matches!(
            leases.begin(&e, TTL).await,
            Ok(Begun::Duplicate(r)) if r == Response::completed("sent")
        ));
    });
}

/// A length kept with another `until` (an earlier build's `begin` took the lease over and left
/// the length of the lease before it) is not trusted: the lease is left as it is.
#[test]
fn a_length_kept_with_another_until_re_anchors_nothing() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let e = event("upgraded", 1);
        let _held = leased(leases.begin(&e, TTL).await);
        step_back_an_hour(&ns, &url, &e, false).await;
        let after = busy_for(&leases, &e).await;
        assert!(after > Duration::from_secs(3500), "re-anchored: {after:?}");
    });
}

/// An earlier build's lease had no end of its own; the key's TTL told a contender when to come
/// back, and a key without one (-1) told it to come back at once, and again, without pause.
#[test]
fn a_lease_without_an_end_or_an_expiry_says_to_come_back_in_a_second() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        let e = event("endless", 1);
        let _held = leased(leases.begin(&e, TTL).await);
        let record = ns.record(&e.key);
        let _: i64 = query(&mut conn, "HDEL", &[&record, "until", "ttl"]).await;
        let _: i64 = query(&mut conn, "PERSIST", &[&record]).await;
        let after = busy_for(&leases, &e).await;
        assert_eq!(after, Duration::from_secs(1));
    });
}
