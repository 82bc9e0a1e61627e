//! A wall clock set back under deliveries that are scheduled, not leased: one due at once
//! before the step is due at once after it, and one waiting out a backoff keeps the wait it
//! had left, whether the step is seen by a relay that claimed before it or by one whose first
//! claim comes after it. Run on SQLite only, where every process shares one clock, so a
//! schedule written later than now means a step (PostgreSQL's nodes have clocks of their own).

use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::{Clock, ManualClock};

use super::{DeliveryBackend, Stores, accept, answered, claim, fresh, keys_and_routes, pair};

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
