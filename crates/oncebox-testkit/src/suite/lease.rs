//! Conformance tests of how `process` meets the two-phase form (fenced leases, uncertain keys),
//! and of retention.

use std::time::Duration;

use oncebox_core::{Begun, Lease, LeaseError, ProcessError, Response, Retention};

use super::fresh;
use crate::{Backend, Script, event};

const TTL: Duration = Duration::from_secs(30);

fn leased(b: Result<Begun, ProcessError>) -> Lease {
    match b {
        Ok(Begun::Leased(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// `process` honours the two-phase form's states: a live lease answers it `InProgress`, an
/// uncertain key `Uncertain`, and neither runs the handler. (The two-phase form itself is
/// [`super::leasing`], shared with Redis.)
pub async fn process_waits_behind_a_lease_and_an_uncertain_key<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "welcome-1", 0);
    let lease = leased(b.begin(e.clone(), TTL).await);
    let via_process = b.process(e.clone(), Script::credit(1)).await;
    assert!(
        matches!(via_process, Err(ProcessError::InProgress { .. })),
        "{via_process:?}"
    );
    b.uncertain(&lease).await.unwrap();
    clock.advance(TTL * 10);
    let via_process = b.process(e.clone(), Script::credit(1)).await;
    assert!(
        matches!(via_process, Err(ProcessError::Uncertain)),
        "{via_process:?}"
    );
    assert_eq!(b.observe().await.effects_of(&e.key), 0);
}

/// `process` finding a two-phase lease expired unfinished parks the key uncertain instead of
/// running its handler: the holder may have made its outside call before it stopped, and
/// `process` cannot tell its handler so, as `begin` does with `taken_over`. The old holder is
/// fenced; an operator's `resolve` then settles the key for both forms.
pub async fn process_parks_an_expired_two_phase_lease_uncertain<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "welcome-5", 3);
    let lease = leased(b.begin(e.clone(), TTL).await);
    clock.advance(TTL);
    let out = b.process(e.clone(), Script::credit(3)).await;
    assert!(matches!(out, Err(ProcessError::Uncertain)), "{out:?}");
    assert_eq!(
        b.complete(&lease, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
    let again = b.process(e.clone(), Script::credit(3)).await;
    assert!(matches!(again, Err(ProcessError::Uncertain)), "{again:?}");
    assert_eq!(b.observe().await.effects_of(&e.key), 0);
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
