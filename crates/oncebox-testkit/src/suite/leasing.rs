//! Conformance tests of the two-phase form (fenced leases, uncertain keys), run against every
//! [`Leasing`] store: SQLite, PostgreSQL and Redis answer alike.

use std::time::Duration;

use oncebox_core::{
    Begun, Event, Invalid, Key, Lease, LeaseError, MIN_LEASE_TTL, ProcessError, Response,
};

use crate::leasing::Leasing;

const TTL: Duration = Duration::from_secs(30);

fn leased(b: Result<Begun, ProcessError>) -> Lease {
    match b {
        Ok(Begun::Leased(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// A JSON event of source `mail` with payload `{"n": n}`.
fn event(id: &str, n: i64) -> Event {
    let key = Key::parse("mail", id).expect("valid test key");
    Event::json(key, format!(r#"{{"n":{n}}}"#)).expect("valid test payload")
}

pub async fn lease_blocks_others_until_completed_then_replays_the_first_response<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("welcome-1", 1);
    let lease = leased(l.begin(&e, TTL).await);
    match l.begin(&e, TTL).await {
        Err(ProcessError::InProgress { retry_after }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= TTL,
                "{retry_after:?}"
            );
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    l.complete(&lease, &Response::completed("sent"))
        .await
        .unwrap();
    let after = l.begin(&e, TTL).await.unwrap();
    assert_eq!(after, Begun::Duplicate(Response::completed("sent")));
    // Done is final for every other lease operation.
    assert_eq!(l.release(&lease).await, Err(LeaseError::Fenced));
    assert_eq!(l.uncertain(&lease).await, Err(LeaseError::Fenced));
}

/// A holder whose completion's reply was lost (a timeout, a reset) tries again: it is told its
/// completion stands, not that it lost the lease, and the first response is the one kept.
pub async fn a_completion_repeated_by_its_holder_is_ok_and_keeps_the_first_response<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("receipt-1", 1);
    let lease = leased(l.begin(&e, TTL).await);
    l.complete(&lease, &Response::completed("sent"))
        .await
        .unwrap();
    l.complete(&lease, &Response::completed("sent"))
        .await
        .expect("the same completion again");
    l.complete(&lease, &Response::completed("other"))
        .await
        .expect("a completion again, with another body");
    let replay = l.begin(&e, TTL).await.unwrap();
    assert_eq!(replay, Begun::Duplicate(Response::completed("sent")));
    // Still so once the lease's TTL has passed: the completion was in time.
    l.lapse(TTL).await;
    l.complete(&lease, &Response::completed("sent"))
        .await
        .expect("the completion stands after the TTL");
}

pub async fn another_payload_is_a_conflict_while_leased_and_when_done<L: Leasing>() {
    let l = L::fresh().await;
    let (first, other) = (event("order-1", 1), event("order-1", 2));
    let lease = leased(l.begin(&first, TTL).await);
    for done in [false, true] {
        match l.begin(&other, TTL).await {
            Err(ProcessError::Conflict { stored, offered }) => {
                assert_eq!(stored, first.fingerprint);
                assert_eq!(offered, other.fingerprint);
            }
            out => panic!("expected a conflict (done: {done}), got {out:?}"),
        }
        if !done {
            l.complete(&lease, &Response::rejected("no")).await.unwrap();
        }
    }
    let replay = l.begin(&first, TTL).await.unwrap();
    assert_eq!(replay, Begun::Duplicate(Response::rejected("no")));
}

pub async fn expired_lease_is_taken_over_and_old_holder_is_fenced<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("welcome-2", 1);
    let first = leased(l.begin(&e, TTL).await);
    assert!(!first.taken_over, "{first:?}");
    l.lapse(TTL).await;
    let second = leased(l.begin(&e, TTL).await);
    assert!(second.token > first.token, "{second:?} after {first:?}");
    // The first holder may have made the call before it stopped: the new one is told so.
    assert!(second.taken_over, "{second:?}");
    let late = Response::completed("late");
    assert_eq!(l.complete(&first, &late).await, Err(LeaseError::Fenced));
    assert_eq!(l.release(&first).await, Err(LeaseError::Fenced));
    assert_eq!(l.uncertain(&first).await, Err(LeaseError::Fenced));
    l.complete(&second, &Response::completed("sent"))
        .await
        .unwrap();
    let dup = l.begin(&e, TTL).await.unwrap();
    assert_eq!(dup, Begun::Duplicate(Response::completed("sent")));
    // Expired but not taken over is fenced as well: someone may be about to take it.
    let lone = leased(l.begin(&event("welcome-3", 1), TTL).await);
    l.lapse(TTL).await;
    assert_eq!(l.complete(&lone, &late).await, Err(LeaseError::Fenced));
}

/// Tokens come from the storage, not from one handle: a process (or node) taking over an
/// expired lease through its own handle gets a higher token, and the first holder is fenced.
pub async fn a_second_handle_takes_over_with_a_higher_token_and_fences_the_first<L: Leasing>() {
    let one = L::fresh().await;
    let two = one.another().await;
    let e = event("welcome-4", 1);
    let first = leased(one.begin(&e, TTL).await);
    one.lapse(TTL).await;
    let second = leased(two.begin(&e, TTL).await);
    assert!(second.token > first.token, "{second:?} after {first:?}");
    let late = Response::completed("late");
    assert_eq!(one.complete(&first, &late).await, Err(LeaseError::Fenced));
    // And the first handle counts on from the second's tokens.
    let other = leased(one.begin(&event("welcome-5", 1), TTL).await);
    assert!(other.token > second.token, "{other:?} after {second:?}");
    two.complete(&second, &Response::completed("sent"))
        .await
        .unwrap();
    let dup = one.begin(&e, TTL).await.unwrap();
    assert_eq!(dup, Begun::Duplicate(Response::completed("sent")));
}

/// A holder whose lease ran out while nobody took over parks the key because its call's
/// outcome is unknown: no redelivery repeats the call. Once another took the key over, the
/// lapsed holder is told `Fenced` (it must not assume the key is held).
pub async fn a_lapsed_holder_parks_the_key_while_no_one_took_it_over<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("charge-9", 1);
    let lease = leased(l.begin(&e, TTL).await);
    l.lapse(TTL).await;
    l.uncertain(&lease)
        .await
        .expect("parked by the lapsed holder");
    let again = l.begin(&e, TTL).await;
    assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");

    let other = event("charge-10", 1);
    let late = leased(l.begin(&other, TTL).await);
    l.lapse(TTL).await;
    let took = leased(l.begin(&other, TTL).await);
    assert!(took.taken_over, "{took:?}");
    assert_eq!(l.uncertain(&late).await, Err(LeaseError::Fenced));
}

pub async fn released_key_is_free_again_and_the_old_token_is_fenced<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("mail-1", 1);
    let first = leased(l.begin(&e, TTL).await);
    l.release(&first).await.unwrap();
    let second = leased(l.begin(&e, TTL).await);
    assert!(second.token > first.token, "{second:?} after {first:?}");
    // Given back, not abandoned: nothing was done under the first lease.
    assert!(!second.taken_over, "{second:?}");
    let done = Response::completed("stale holder");
    assert_eq!(l.complete(&first, &done).await, Err(LeaseError::Fenced));
    assert_eq!(l.release(&first).await, Err(LeaseError::Fenced));
    assert_eq!(l.uncertain(&first).await, Err(LeaseError::Fenced));
    l.complete(&second, &Response::completed("sent"))
        .await
        .unwrap();
}

/// A lease shorter than a millisecond would expire as it is taken: its holder would run the
/// effect, be fenced from recording it, and the next delivery would run it again. It is refused
/// with nothing taken, and the key stays free for a real lease.
pub async fn a_lease_under_a_millisecond_is_refused_and_takes_nothing<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("mail-3", 1);
    for ttl in [Duration::ZERO, Duration::from_micros(999)] {
        match l.begin(&e, ttl).await {
            Err(ProcessError::Invalid(Invalid::LeaseTtl(refused))) => assert_eq!(refused, ttl),
            other => panic!("a lease of {ttl:?}: expected a refusal, got {other:?}"),
        }
    }
    // Nothing was taken: the next lease is not a takeover of an abandoned one.
    let lease = leased(l.begin(&e, TTL).await);
    assert!(!lease.taken_over, "{lease:?}");
    l.complete(&lease, &Response::completed("sent"))
        .await
        .unwrap();
    // The shortest lease allowed is granted. It may lapse before its release arrives (Redis
    // keeps an ended lease's record only as long again as the lease), which fences the release.
    let short = leased(l.begin(&event("mail-4", 1), MIN_LEASE_TTL).await);
    assert!(!short.taken_over, "{short:?}");
    match l.release(&short).await {
        Ok(()) | Err(LeaseError::Fenced) => {}
        other => panic!("releasing a lease of {MIN_LEASE_TTL:?}: {other:?}"),
    }
}

pub async fn tokens_keep_growing_across_a_restart<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("mail-2", 1);
    let first = leased(l.begin(&e, TTL).await);
    l.release(&first).await.unwrap();
    let l = l.restart().await;
    let second = leased(l.begin(&e, TTL).await);
    assert!(second.token > first.token, "{second:?} after {first:?}");
    // A holder from before the restart is still fenced by the token it carries.
    assert_eq!(
        l.complete(&first, &Response::completed("old")).await,
        Err(LeaseError::Fenced)
    );
}

/// An uncertain key never expires into a lease and is never done until `resolve`. A holder
/// whose `uncertain` reply was lost asks again and is told `Ok` (the key is parked under its
/// token), not `Fenced`, which would read as "not parked"; once settled, it is refused.
pub async fn uncertain_key_is_neither_leased_nor_duplicate_until_resolved<L: Leasing>() {
    let l = L::fresh().await;
    let e = event("charge-1", 5);
    let lease = leased(l.begin(&e, TTL).await);
    l.uncertain(&lease).await.unwrap();
    l.uncertain(&lease)
        .await
        .expect("the holder parks its key again");
    let again = l.begin(&e, TTL).await;
    assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
    // An uncertain key never expires into a fresh lease: its effect may have happened.
    l.lapse(TTL * 10).await;
    let again = l.begin(&e, TTL).await;
    assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
    let settled = Response::completed("reconciled");
    assert!(l.resolve(&e.key, Some(settled.clone())).await);
    let dup = l.begin(&e, TTL).await.unwrap();
    assert_eq!(dup, Begun::Duplicate(settled.clone()));
    assert!(
        !l.resolve(&e.key, Some(settled)).await,
        "only uncertain keys are resolved"
    );
    // Settled by the operator: the parked holder's completion is refused, not taken for its
    // own retry.
    let late = Response::completed("late");
    assert_eq!(l.complete(&lease, &late).await, Err(LeaseError::Fenced));
    assert_eq!(l.uncertain(&lease).await, Err(LeaseError::Fenced));

    let e2 = event("charge-2", 5);
    let lease = leased(l.begin(&e2, TTL).await);
    l.uncertain(&lease).await.unwrap();
    assert!(l.resolve(&e2.key, None).await);
    assert_eq!(l.uncertain(&lease).await, Err(LeaseError::Fenced));
    let retaken = leased(l.begin(&e2, TTL).await);
    assert!(retaken.token > lease.token);
    assert_eq!(l.uncertain(&lease).await, Err(LeaseError::Fenced));
    // The operator found the call was not made: nothing to warn the new holder of.
    assert!(!retaken.taken_over, "{retaken:?}");
}
