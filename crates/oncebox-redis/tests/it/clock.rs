//! The Redis host's clock stepping back under a lease: the lease's end (and the record's
//! expiry, wall-clock time in Redis too) then lie as far ahead as the step. The first contender
//! re-anchors it to one lease from then, so the key is not held for the length of the step.
//! The step is staged in the record (its `until` and expiry moved an hour ahead, as a step back
//! of an hour leaves them): the host's clock itself is not the test's to set.

use std::time::{Duration, Instant};

use oncebox_core::{Begun, LeaseError, ProcessError, Response};
use oncebox_testkit::run;

use crate::harness::{Namespace, event, query, raw, redis_now, shared};
use crate::lease::leased;

const TTL: Duration = Duration::from_millis(300);
const HOUR_MS: i64 = 3_600_000;

#[test]
fn a_lease_dated_before_the_clock_stepped_back_holds_its_key_one_lease_at_most() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        let e = event("stepped", 1);
        let first = leased(leases.begin(&e, TTL).await);
        let record = ns.record(&e.key);
        let now = redis_now(&mut conn).await;
        let until = (now + HOUR_MS + 300).to_string();
        let _: i64 = query(&mut conn, "HSET", &[&record, "until", &until]).await;
        let _: i64 = query(
            &mut conn,
            "PEXPIRE",
            &[&record, &(HOUR_MS + 600).to_string()],
        )
        .await;

        // Not taken over at once (its holder may still be at work), but told to come back
        // within a lease, not an hour.
        match leases.begin(&e, TTL).await {
            Err(ProcessError::InProgress { retry_after }) => {
                assert!(
                    retry_after <= TTL,
                    "held for {retry_after:?} after the step"
                );
            }
            other => panic!("a lease just begun is held after the step: {other:?}"),
        }
        let pttl: i64 = query(&mut conn, "PTTL", &[&record]).await;
        assert!(
            pttl > 0 && pttl <= 600,
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
