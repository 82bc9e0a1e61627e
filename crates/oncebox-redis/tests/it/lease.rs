//! What the two-phase form keeps in Redis beyond the shared suite (`conformance.rs`): TTLs of
//! uncertain and done records, a clamped TTL, and data under our keys our scripts never wrote.

use std::time::Duration;

use oncebox_core::{Begun, Lease, LeaseError, ProcessError, Response, Retention, Source};
use oncebox_redis::Leases;
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
fn an_uncertain_key_never_expires() {
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
        // Kept as long again after the lease ends, so that a takeover can tell.
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert!(pttl > 5_000 && pttl <= 10_000, "lease TTL {pttl}");
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .unwrap();
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        // The source's retention, not what is left of the lease's record (under 10 s).
        assert!(pttl > 590_000 && pttl <= 600_000, "retention {pttl}");
    });
}

/// The retention of a `done` mark counts from its lease's start, which came before the inbox's
/// own completion: counted from `complete`, the mark outlived the inbox's record by as long
/// as the holder took to call it, and answered `done` for a key the inbox had purged.
#[test]
fn a_done_mark_is_kept_from_its_leases_start_not_from_complete() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = Leases::connect(
            &url,
            ns.options()
                .retention(Retention::new(Duration::from_secs(600))),
        )
        .await
        .unwrap();
        let mut conn = raw(&url).await;
        let e = event("late-1", 1);
        let lease = leased(leases.begin(&e, Duration::from_secs(30)).await);
        // The holder's effect and the inbox's commit take this long (real time: Redis dates
        // the lease by its own clock).
        let took = Duration::from_millis(1_500);
        tokio::time::sleep(took).await;
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .unwrap();
        let pttl: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        let most = 600_000 - i64::try_from(took.as_millis()).unwrap();
        assert!(pttl > 0 && pttl <= most, "kept {pttl} ms, at most {most}");
    });
}

/// The longest TTL is clamped to what Redis keeps (100 years); one under a millisecond is
/// refused (the shared suite checks that every store refuses it alike).
#[test]
fn a_huge_ttl_is_clamped_not_refused() {
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
    });
}

#[test]
fn foreign_data_under_our_key_is_unavailable_never_a_duplicate_or_conflict() {
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
        // Without a fingerprint, or with one that is not 32 bytes, it is no record of ours:
        // no conflict (with a stored fingerprint made up), only unavailable.
        let out = leases.begin(&odd, TTL).await;
        assert!(matches!(out, Err(ProcessError::Unavailable(_))), "{out:?}");
        let _: i64 = query(&mut conn, "HSET", &[key.as_str(), "fp", "short"]).await;
        let out = leases.begin(&odd, TTL).await;
        assert!(matches!(out, Err(ProcessError::Unavailable(_))), "{out:?}");
        // Another payload's fingerprint is a conflict; the matching one has its kind checked.
        let other = event("odd", 2);
        let mut set_fp = redis::cmd("HSET");
        set_fp
            .arg(&key)
            .arg("fp")
            .arg(&other.fingerprint.as_bytes()[..]);
        let _: i64 = set_fp.query_async(&mut conn).await.unwrap();
        match leases.begin(&odd, TTL).await {
            Err(ProcessError::Conflict { stored, offered }) => {
                assert_eq!((stored, offered), (other.fingerprint, odd.fingerprint));
            }
            out => panic!("expected a conflict, got {out:?}"),
        }
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

/// A response past what Redis takes in one value is the holder's own error, not an outage: it
/// would fail the same way on every retry. Nothing is written and the lease stays the holder's.
#[test]
fn a_response_past_what_redis_takes_is_too_large_and_the_lease_kept() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let leases = ns.leases().await;
        let e = event("charge-huge", 5);
        let lease = leased(leases.begin(&e, TTL).await);
        let huge = Response::completed(vec![0; oncebox_redis::MAX_RESPONSE_BYTES + 1]);
        let answer = leases.complete(&lease, &huge).await;
        assert!(matches!(answer, Err(LeaseError::TooLarge(_))), "{answer:?}");
        let shorter = Response::completed("charged");
        leases.complete(&lease, &shorter).await.expect("completed");
        assert!(matches!(
            leases.begin(&e, TTL).await,
            Ok(Begun::Duplicate(r)) if r == shorter
        ));
    });
}
