//! Conformance tests of the two-phase form (fenced leases, uncertain keys) and of retention.

use std::time::Duration;

use oncebox_core::{Begun, Lease, LeaseError, ProcessError, Processed, Response, Retention};

use super::fresh;
use crate::{Backend, Script, event};

const TTL: Duration = Duration::from_secs(30);

fn leased(b: Result<Begun, ProcessError>) -> Lease {
    match b {
        Ok(Begun::Leased(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

pub async fn lease_blocks_other_workers_until_completed<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("mail", "welcome-1", 0);
    let lease = leased(b.begin(e.clone(), TTL).await);
    let second = b.begin(e.clone(), TTL).await;
    assert!(
        matches!(second, Err(ProcessError::InProgress { .. })),
        "{second:?}"
    );
    let via_process = b.process(e.clone(), Script::credit(1)).await;
    assert!(
        matches!(via_process, Err(ProcessError::InProgress { .. })),
        "{via_process:?}"
    );
    b.complete(&lease, Response::completed("sent"))
        .await
        .unwrap();
    let after = b.begin(e.clone(), TTL).await.unwrap();
    assert_eq!(after, Begun::Duplicate(Response::completed("sent")));
    assert_eq!(
        b.complete(&lease, Response::completed("again")).await,
        Err(LeaseError::Fenced)
    );
}

pub async fn expired_lease_is_taken_over_and_old_holder_is_fenced<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "welcome-2", 0);
    let first = leased(b.begin(e.clone(), TTL).await);
    clock.advance(TTL + Duration::from_millis(1));
    let second = leased(b.begin(e.clone(), TTL).await);
    assert!(
        second.token > first.token,
        "{} !> {}",
        second.token,
        first.token
    );
    assert_eq!(
        b.complete(&first, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
    assert_eq!(b.release(&first).await, Err(LeaseError::Fenced));
    b.complete(&second, Response::completed("sent"))
        .await
        .unwrap();
    let dup = b.begin(e, TTL).await.unwrap();
    assert_eq!(dup, Begun::Duplicate(Response::completed("sent")));
    // Expired but not taken over is fenced as well: someone may be about to take it.
    let e3 = event("mail", "welcome-3", 0);
    let lone = leased(b.begin(e3, TTL).await);
    clock.advance(TTL);
    assert_eq!(
        b.complete(&lone, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
}

pub async fn released_key_is_free_and_tokens_never_repeat<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("mail", "welcome-4", 0);
    let first = leased(b.begin(e.clone(), TTL).await);
    b.release(&first).await.unwrap();
    let second = leased(b.begin(e.clone(), TTL).await);
    assert!(second.token > first.token);
    assert_eq!(
        b.complete(&first, Response::completed("stale holder"))
            .await,
        Err(LeaseError::Fenced)
    );
    let b = b.reopen().await;
    b.release(&second).await.unwrap();
    let third = leased(b.begin(e, TTL).await);
    assert!(third.token > second.token, "tokens survive a restart");
}

pub async fn uncertain_key_is_neither_retried_nor_duplicate_until_resolved<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "charge-1", 0);
    let lease = leased(b.begin(e.clone(), TTL).await);
    b.uncertain(&lease).await.unwrap();
    clock.advance(TTL * 10);
    let again = b.begin(e.clone(), TTL).await;
    assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
    let via_process = b.process(e.clone(), Script::credit(1)).await;
    assert!(
        matches!(via_process, Err(ProcessError::Uncertain)),
        "{via_process:?}"
    );
    assert!(
        b.resolve(&e.key, Some(Response::completed("reconciled")))
            .await
    );
    let dup = b.begin(e.clone(), TTL).await.unwrap();
    assert_eq!(dup, Begun::Duplicate(Response::completed("reconciled")));
    assert!(
        !b.resolve(&e.key, None).await,
        "only uncertain keys are resolved"
    );

    let e2 = event("mail", "charge-2", 0);
    let lease = leased(b.begin(e2.clone(), TTL).await);
    b.uncertain(&lease).await.unwrap();
    assert!(b.resolve(&e2.key, None).await);
    leased(b.begin(e2, TTL).await);
}

pub async fn process_takes_over_an_expired_lease<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "welcome-5", 3);
    let lease = leased(b.begin(e.clone(), TTL).await);
    clock.advance(TTL);
    let out = b.process(e.clone(), Script::credit(3)).await;
    assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
    assert_eq!(
        b.complete(&lease, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
    assert_eq!(b.observe().await.effects_of(&e.key), 1);
}

pub async fn purge_deletes_only_terminal_records_past_retention<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let day = Duration::from_secs(24 * 3600);
    let retention = Retention::new(day * 7);
    b.process(event("shop", "old", 1), Script::credit(1))
        .await
        .unwrap();
    let lease = leased(b.begin(event("shop", "leased", 0), day * 30).await);
    let parked = leased(b.begin(event("shop", "parked", 0), TTL).await);
    b.uncertain(&parked).await.unwrap();
    clock.advance(day * 7 - Duration::from_millis(1));
    b.process(event("shop", "young", 1), Script::credit(1))
        .await
        .unwrap();
    // Retention − ε: nothing is due, a retry is still a duplicate.
    assert_eq!(b.purge(clock_now(&clock), &retention).await, 0);
    assert!(
        b.process(event("shop", "old", 1), Script::credit(1))
            .await
            .unwrap()
            .is_duplicate()
    );
    clock.advance(Duration::from_millis(2));
    assert_eq!(b.purge(clock_now(&clock), &retention).await, 1);
    let seen = b.observe().await;
    assert_eq!(
        seen.inbox_rows, 3,
        "leased, uncertain and young records stay"
    );
    let _ = lease;
}

fn clock_now(clock: &oncebox_core::ManualClock) -> oncebox_core::Timestamp {
    use oncebox_core::Clock;
    clock.now()
}
