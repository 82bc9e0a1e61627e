//! Conformance tests of wall-clock jumps: a jump forward purges no record early, a jump back
//! leaves no lease stuck. `ManualClock::set` jumps the wall clock alone; `advance` is real time.

use std::time::Duration;

use oncebox_core::{Begun, Clock, LeaseError, ProcessError, Response, Retention};

use super::fresh;
use crate::{Backend, Script, event};

const TTL: Duration = Duration::from_secs(30);

pub async fn forward_clock_jump_purges_no_record_early<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    b.process(event("shop", "old", 1), Script::credit(1))
        .await
        .unwrap();
    // The first purge on a clock anchors it; nothing is due yet.
    assert_eq!(b.purge(clock.now(), &retention).await, 0);
    clock.advance(retain / 2);
    b.process(event("shop", "mid", 1), Script::credit(1))
        .await
        .unwrap();
    // The wall clock jumps ten retentions ahead; no real time passes.
    clock.set(clock.now().plus(retain * 10));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        0,
        "a jump ages nothing"
    );
    assert!(
        b.process(event("shop", "old", 1), Script::credit(1))
            .await
            .unwrap()
            .is_duplicate(),
        "a retry inside the real retention is still a duplicate"
    );
    // Real time passes until `old` (only) is past its retention.
    clock.advance(retain / 2 + Duration::from_millis(1));
    assert_eq!(b.purge(clock.now(), &retention).await, 1);
    assert_eq!(b.observe().await.inbox_rows, 1, "`mid` stays");
}

pub async fn backward_clock_jump_leaves_no_lease_stuck<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "jump-1", 0);
    let Ok(Begun::Leased(first)) = b.begin(e.clone(), TTL).await else {
        panic!("expected a lease");
    };
    // The wall clock jumps an hour back. The lease is not taken over at once (its holder may
    // still be running the outside effect): the first contender re-anchors it to one TTL from
    // the new now, instead of the hour the jump would otherwise hold it.
    clock.set(clock.now().minus(Duration::from_secs(3600)));
    match b.begin(e.clone(), TTL).await {
        Err(ProcessError::InProgress { retry_after }) => assert!(retry_after <= TTL),
        other => panic!("a lease just begun is held after the jump: {other:?}"),
    }
    clock.advance(TTL);
    let Ok(Begun::Leased(second)) = b.begin(e.clone(), TTL).await else {
        panic!("a lease begun before the jump is taken over one TTL after it was seen");
    };
    assert!(second.token > first.token);
    assert_eq!(
        b.complete(&first, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
    // The new lease lives its TTL on the new timeline, then expires as usual.
    assert!(matches!(
        b.begin(e.clone(), TTL).await,
        Err(ProcessError::InProgress { .. })
    ));
    clock.advance(TTL);
    let Ok(Begun::Leased(third)) = b.begin(e, TTL).await else {
        panic!("expired lease taken over");
    };
    b.complete(&third, Response::completed("sent"))
        .await
        .unwrap();
}
