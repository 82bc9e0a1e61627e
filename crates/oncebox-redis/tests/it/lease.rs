//! The two-phase form on the real Redis: in progress, done and replayed, conflicts, release,
//! uncertain and resolve, retention, and data under our keys that our scripts never wrote.

use std::time::Duration;

use oncebox_core::{Begun, Lease, LeaseError, ProcessError, Response, Retention, Source};
use oncebox_redis::{Leases, Resolution};
use oncebox_testkit::run;

use crate::harness::{Namespace, event, query, raw, shared};

const TTL: Duration = Duration::from_secs(30);

pub fn leased(b: Result<Begun, ProcessError>) -> Lease {
    match b {
        Ok(Begun::Leased(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

#[test]
fn lease_blocks_others_until_completed_then_replays_the_first_response() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let e = event("welcome-1", 1);
        let lease = leased(leases.begin(&e, TTL).await);
        match leases.begin(&e, TTL).await {
            Err(ProcessError::InProgress { retry_after }) => {
                assert!(
                    retry_after > Duration::ZERO && retry_after <= TTL,
                    "{retry_after:?}"
                );
            }
            other => panic!("expected in progress, got {other:?}"),
        }
        leases
            .complete(&lease, &Response::completed("sent"))
            .await
            .unwrap();
        let again = leases.begin(&e, TTL).await.unwrap();
        assert_eq!(again, Begun::Duplicate(Response::completed("sent")));
        // The holder repeating its completion (its reply was lost) is answered Ok, and the
        // first response stays.
        leases
            .complete(&lease, &Response::completed("other"))
            .await
            .unwrap();
        let again = leases.begin(&e, TTL).await.unwrap();
        assert_eq!(again, Begun::Duplicate(Response::completed("sent")));
        // Done is final for every lease operation.
        assert_eq!(leases.release(&lease).await, Err(LeaseError::Fenced));
        assert_eq!(leases.uncertain(&lease).await, Err(LeaseError::Fenced));
    });
}

#[test]
fn same_key_with_another_payload_is_a_conflict_while_leased_and_when_done() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let (first, other) = (event("order-1", 1), event("order-1", 2));
        let lease = leased(leases.begin(&first, TTL).await);
        for _ in 0..2 {
            match leases.begin(&other, TTL).await {
                Err(ProcessError::Conflict { stored, offered }) => {
                    assert_eq!(stored, first.fingerprint);
                    assert_eq!(offered, other.fingerprint);
                }
                out => panic!("expected a conflict, got {out:?}"),
            }
            let _ = leases.complete(&lease, &Response::rejected("no")).await;
        }
        let replay = leases.begin(&first, TTL).await.unwrap();
        assert_eq!(replay, Begun::Duplicate(Response::rejected("no")));
    });
}

#[test]
fn released_key_is_free_again_and_the_old_token_is_fenced() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let e = event("mail-1", 1);
        let first = leased(leases.begin(&e, TTL).await);
        leases.release(&first).await.unwrap();
        let second = leased(leases.begin(&e, TTL).await);
        assert!(second.token > first.token, "{second:?} after {first:?}");
        let done = Response::completed("stale holder");
        assert_eq!(
            leases.complete(&first, &done).await,
            Err(LeaseError::Fenced)
        );
        assert_eq!(leases.release(&first).await, Err(LeaseError::Fenced));
        assert_eq!(leases.uncertain(&first).await, Err(LeaseError::Fenced));
        leases.release(&second).await.unwrap();
        // Another handle on the same namespace shares the counter: tokens never repeat.
        let other = ns.leases().await;
        let third = leased(other.begin(&e, TTL).await);
        assert!(third.token > second.token);
    });
}

#[test]
fn uncertain_key_is_neither_leased_nor_duplicate_until_resolved() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        let e = event("charge-1", 5);
        let lease = leased(leases.begin(&e, TTL).await);
        leases.uncertain(&lease).await.unwrap();
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert_eq!(pttl, -1, "an uncertain key does not expire");
        let again = leases.begin(&e, TTL).await;
        assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
        let settled = Resolution::Completed(Response::completed("reconciled"));
        assert!(leases.resolve(&e.key, settled.clone()).await.unwrap());
        let dup = leases.begin(&e, TTL).await.unwrap();
        assert_eq!(dup, Begun::Duplicate(Response::completed("reconciled")));
        assert!(
            !leases.resolve(&e.key, settled).await.unwrap(),
            "only uncertain keys"
        );
        // Settled by the operator: the parked holder's completion is refused, not a retry.
        let late = Response::completed("late");
        assert_eq!(
            leases.complete(&lease, &late).await,
            Err(LeaseError::Fenced)
        );

        let e2 = event("charge-2", 5);
        let lease = leased(leases.begin(&e2, TTL).await);
        leases.uncertain(&lease).await.unwrap();
        assert!(leases.resolve(&e2.key, Resolution::Released).await.unwrap());
        let retaken = leased(leases.begin(&e2, TTL).await);
        assert!(retaken.token > lease.token);
    });
}

#[test]
fn done_answers_are_kept_for_their_source_retention() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let mut retention = Retention::new(Duration::from_secs(3600));
        retention
            .set(Source::new("shop").unwrap(), Duration::from_secs(600), None)
            .unwrap();
        let leases = Leases::connect(&url, ns.options().retention(retention))
            .await
            .unwrap();
        let mut conn = raw(&url).await;
        let e = event("kept-1", 1);
        let lease = leased(leases.begin(&e, Duration::from_secs(5)).await);
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert!(pttl > 0 && pttl <= 5_000, "lease TTL {pttl}");
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .unwrap();
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert!(pttl > 5_000 && pttl <= 600_000, "retention {pttl}");
    });
}

#[test]
fn extreme_ttls_are_clamped_not_refused() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        let forever = event("forever", 1);
        let lease = leased(leases.begin(&forever, Duration::MAX).await);
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&forever.key)]).await;
        assert!(pttl > 365 * 24 * 3600 * 1000, "{pttl}");
        leases.release(&lease).await.unwrap();
        // Zero is one millisecond, not "delete now" and not an error.
        let instant = event("instant", 1);
        leased(leases.begin(&instant, Duration::ZERO).await);
    });
}

#[test]
fn foreign_data_under_our_key_is_unavailable_never_a_duplicate() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let mut conn = raw(&url).await;
        // A plain string where a hash belongs: WRONGTYPE from Redis.
        let plain = event("plain", 1);
        let _: () = query(&mut conn, "SET", &[&ns.record(&plain.key), "x"]).await;
        let out = leases.begin(&plain, TTL).await;
        assert!(matches!(out, Err(ProcessError::Unavailable(_))), "{out:?}");
        assert!(leases.recall(&plain).await.is_err());
        // A done record with a kind our scripts never write: not replayed as anything.
        let odd = event("odd", 1);
        let key = ns.record(&odd.key);
        let args = [key.as_str(), "state", "done", "kind", "maybe", "body", "b"];
        let _: i64 = query(&mut conn, "HSET", &args).await;
        // Without a matching fingerprint it is a conflict; with one, the kind is checked.
        let out = leases.begin(&odd, TTL).await;
        assert!(matches!(out, Err(ProcessError::Conflict { .. })), "{out:?}");
        let mut set_fp = redis::cmd("HSET");
        set_fp
            .arg(&key)
            .arg("fp")
            .arg(&odd.fingerprint.as_bytes()[..]);
        let _: i64 = set_fp.query_async(&mut conn).await.unwrap();
        let out = leases.begin(&odd, TTL).await;
        assert!(matches!(out, Err(ProcessError::Unavailable(_))), "{out:?}");
        assert!(leases.recall(&odd).await.is_err());
    });
}
