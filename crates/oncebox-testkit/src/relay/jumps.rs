//! A wall clock set back under deliveries that are scheduled, not leased: one due at once
//! before the step is due at once after it, and one waiting out a backoff keeps the wait it
//! had left, whether the step is seen by a relay that claimed before it or by one whose first
//! claim comes after it. And one set ahead under leased deliveries: they keep the real time
//! they had left. Run on SQLite only, where every process shares one clock, so a schedule
//! written later than now means a step (PostgreSQL's nodes have clocks of their own).

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::{Clock, LeaseError, ManualClock};

use super::{
    DeliveryBackend, LEASE, Stores, accept, answered, claim, fresh, keys_and_routes, pair, view,
};

/// The backoff the retried delivery waits.
const BACKOFF: Duration = Duration::from_secs(10);

/// Accepts `evt-1` (two deliveries), claims one and has it retried after [`BACKOFF`], then
/// sets the clock an hour back. Returns the other, still pending, route's name.
async fn scheduled_then_set_back<S: Stores>(b: &S, clock: &ManualClock) -> String {
    accept(b, "evt-1").await;
    let held = claim(b, clock.now(), 1).await;
    assert_eq!(held.len(), 1);
    let now = clock.now();
    b.record(&held[0], answered(503, now), Verdict::Retry(BACKOFF), now)
        .await
        .expect("recorded under its lease");
    clock.set(clock.now().minus(Duration::from_secs(3600)));
    let pending = ["a", "b"].into_iter().find(|r| *r != held[0].route);
    pending.expect("two routes").to_owned()
}

/// What is due after the step, then once the backoff has passed on the new timeline.
async fn due_after<S: Stores>(b: &S, clock: &ManualClock, pending: &str) {
    assert_eq!(
        keys_and_routes(&claim(b, clock.now(), 10).await),
        [pair("shop:evt-1", pending)],
        "the delivery due at once before the step is due at once after it"
    );
    clock.advance(BACKOFF - Duration::from_millis(1));
    assert_eq!(
        claim(b, clock.now(), 10).await,
        [],
        "its backoff is not over"
    );
    clock.advance(Duration::from_millis(1));
    let retried = claim(b, clock.now(), 10).await;
    assert_eq!(
        retried.len(),
        1,
        "the backoff, not the step, is waited: {retried:?}"
    );
    assert_ne!(retried[0].route, pending);
}

pub async fn a_backward_clock_jump_delays_no_scheduled_delivery_by_the_jump<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    let pending = scheduled_then_set_back(&b, &clock).await;
    due_after(&b, &clock, &pending).await;
}

pub async fn a_relay_started_after_a_backward_jump_finds_the_schedules_due_as_before<
    B: DeliveryBackend,
>() {
    let clock = ManualClock::new(crate::EPOCH);
    let (before, after) = B::fresh_pair(clock.clone()).await;
    let pending = scheduled_then_set_back(&before, &clock).await;
    drop(before);
    due_after(&after, &clock, &pending).await;
}

/// On one clock, the re-anchor's boundary: the clock set back exactly one lease length after a
/// lease was taken leaves it as it is; a millisecond more, and the next claim re-anchors it to
/// end one lease from its now.
pub async fn a_lease_is_re_anchored_only_when_taken_over_a_lease_ahead<B: DeliveryBackend>() {
    for (ahead, kept) in [(LEASE, true), (LEASE + Duration::from_millis(1), false)] {
        let (b, clock) = fresh::<B>().await;
        accept(&b, "evt-1").await;
        let at = clock.now();
        let held = claim(&b, at, 10).await;
        assert_eq!(held.len(), 2);
        clock.set(at.minus(ahead));
        assert_eq!(claim(&b, clock.now(), 10).await, []);
        // The holder's last moment on its own clock.
        let end = at.plus(LEASE - Duration::from_millis(1));
        let recorded = b
            .record(&held[0], answered(200, end), Verdict::Delivered, end)
            .await;
        if kept {
            assert_eq!(recorded, Ok(()), "one lease ahead: left alone");
        } else {
            // Re-anchored to end one lease after `at - ahead`: before `end`.
            assert_eq!(
                recorded,
                Err(LeaseError::Fenced),
                "over a lease ahead: re-anchored"
            );
        }
    }
}

/// The wall clock steps an hour ahead (NTP setting it right) while a relay holds deliveries.
/// Judged by the wall clock alone every lease looked an hour over, and the next claim (the
/// holder's own, a moment later) took them over as possibly sent: sent again beside the first
/// request where the route honours the key, parked uncertain where it does not, and the
/// holder's 2xx fenced. Now they keep the real time they had left: a live holder records its
/// outcome, and a dead one's delivery is claimed again once its lease ends in real time.
pub async fn a_forward_clock_jump_takes_over_no_live_lease<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 10).await;
    assert_eq!(first.len(), 2);
    clock.set(clock.now().plus(Duration::from_secs(3600)));
    assert_eq!(
        claim(&b, clock.now(), 10).await,
        [],
        "held just after the jump"
    );
    clock.advance(LEASE - Duration::from_millis(1));
    assert_eq!(
        claim(&b, clock.now(), 10).await,
        [],
        "held for the rest of its lease"
    );
    let now = clock.now();
    b.record(&first[1], answered(200, now), Verdict::Delivered, now)
        .await
        .expect("the holder records its outcome after the jump");
    clock.advance(Duration::from_millis(1));
    let second = claim(&b, clock.now(), 10).await;
    assert_eq!(
        keys_and_routes(&second),
        keys_and_routes(&first[..1]),
        "the dead holder's delivery is claimed again once its lease ended in real time"
    );
    assert_eq!(view(&b, first[1].id).await.state, DeliveryState::Delivered);
}

/// The same step seen first by the holder's own record, no claim between: its outcome is
/// recorded, not refused as past its lease.
pub async fn a_forward_clock_jump_refuses_no_live_holders_outcome<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 10).await;
    assert_eq!(first.len(), 2);
    clock.set(clock.now().plus(Duration::from_secs(3600)));
    let now = clock.now();
    b.record(&first[1], answered(200, now), Verdict::Delivered, now)
        .await
        .expect("the holder records its outcome just after the jump");
    assert_eq!(claim(&b, clock.now(), 10).await, [], "the other still held");
    assert_eq!(view(&b, first[1].id).await.state, DeliveryState::Delivered);
}

/// A month's step ahead ages no delivery's retry budget: counted from before the step, one
/// retrying was past its route's `max_age` at its next turn and died unsent.
pub async fn a_forward_clock_jump_ages_no_retry_budget<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 10).await;
    assert_eq!(first.len(), 2);
    let now = clock.now();
    b.record(&first[0], answered(500, now), Verdict::Retry(BACKOFF), now)
        .await
        .expect("retrying");
    clock.set(now.plus(Duration::from_secs(30 * 24 * 3600)));
    clock.advance(BACKOFF);
    let again = claim(&b, clock.now(), 10).await;
    assert_eq!(keys_and_routes(&again), keys_and_routes(&first[..1]));
    let age = again[0].budget.age(clock.now());
    assert!(age <= BACKOFF, "its budget aged by the step: {age:?}");
}
