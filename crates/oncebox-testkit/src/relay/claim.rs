//! Delivery conformance tests of the relay's side: claims under a fenced lease, and the verdicts
//! it records.

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{Claimed, DeliveryStore, STATUS_RECHECK};
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, LeaseError, ManualClock, Timestamp};

use super::{
    DeliveryBackend, LEASE, accept, answered, claim, failed, fresh, ingest, keys_and_routes, pair,
    view,
};

pub async fn claim_returns_due_deliveries_oldest_first_and_not_twice_while_leased<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    clock.advance(Duration::from_secs(1));
    accept(&b, "evt-2").await;
    let now = clock.now();
    let first = claim(&b, now, 3).await;
    let expect = [
        pair("shop:evt-1", "a"),
        pair("shop:evt-1", "b"),
        pair("shop:evt-2", "a"),
    ];
    assert_eq!(keys_and_routes(&first), expect);
    for c in &first {
        assert_eq!(c.lease_expires_at, now.plus(LEASE));
        assert_eq!(view(&b, c.id).await.state, DeliveryState::InFlight);
    }
    let mut tokens: Vec<i64> = first.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "one token per claim");
    let rest = claim(&b, now, 10).await;
    assert_eq!(keys_and_routes(&rest), [pair("shop:evt-2", "b")]);
    clock.advance(LEASE - Duration::from_millis(1));
    assert_eq!(
        claim(&b, clock.now(), 10).await,
        [],
        "leased deliveries are not claimed again"
    );
}

pub async fn expired_lease_is_reclaimed_with_a_higher_token_and_the_old_holder_is_fenced<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 10).await;
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|c| !c.taken_over), "{first:?}");
    clock.advance(LEASE);
    let now = clock.now();
    // Expired though nobody took it over yet: fenced all the same, someone may be about to.
    let lone = &first[1];
    let late = b
        .record(lone, answered(200, now), Verdict::Delivered, now)
        .await;
    assert_eq!(late, Err(LeaseError::Fenced));
    let second = claim(&b, now, 10).await;
    assert_eq!(second.len(), 2, "a relay that died mid-attempt is replaced");
    // The claim says its last holder may have sent it: the relay then knows the outcome of an
    // attempt is unknown before its own.
    assert!(second.iter().all(|c| c.taken_over), "{second:?}");
    let (old, new) = (&first[0], &second[0]);
    assert_eq!(
        (new.id, &new.idempotency_key, new.attempts),
        (old.id, &old.idempotency_key, 0)
    );
    assert!(new.token > old.token, "{} !> {}", new.token, old.token);
    let stale = b
        .record(old, answered(200, now), Verdict::Delivered, now)
        .await;
    assert_eq!(stale, Err(LeaseError::Fenced));
    // The fenced attempt left no trace: no attempt row, the state is the new holder's.
    for c in &first {
        assert_eq!(b.attempts(c.id).await.expect("attempts"), []);
        let v = view(&b, c.id).await;
        assert_eq!(
            (v.state, v.attempts, v.last_status),
            (DeliveryState::InFlight, 0, None)
        );
    }
    b.record(new, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("record");
    assert_eq!(view(&b, new.id).await.state, DeliveryState::Delivered);
    for c in [old, new] {
        let again = b
            .record(c, answered(500, now), Verdict::Retry(LEASE), now)
            .await;
        assert_eq!(again, Err(LeaseError::Fenced), "one outcome per claim");
    }
    assert_eq!(
        b.attempts(new.id).await.expect("attempts"),
        [answered(200, now)]
    );
}

/// Tokens come from the storage, not from one handle: a relay in another process (or on another
/// node) that takes over an expired claim gets a higher token than any the first handed out, and
/// the first relay is fenced, whichever handle each one uses.
pub async fn a_second_handle_on_the_storage_takes_over_with_a_higher_token<B: DeliveryBackend>() {
    let clock = ManualClock::new(crate::EPOCH);
    let (one, two) = B::fresh_pair(clock.clone()).await;
    accept(&one, "evt-1").await;
    accept(&one, "evt-2").await;
    // Tokens handed out by the first handle, before and after the second's.
    let first = claim(&one, clock.now(), 1).await;
    clock.advance(LEASE);
    let now = clock.now();
    let taken = claim(&two, now, 1).await;
    assert_eq!(
        keys_and_routes(&taken),
        keys_and_routes(&first),
        "taken over"
    );
    assert!(
        taken[0].token > first[0].token,
        "{} !> {}",
        taken[0].token,
        first[0].token
    );
    let stale = one
        .record(&first[0], answered(200, now), Verdict::Delivered, now)
        .await;
    assert_eq!(stale, Err(LeaseError::Fenced), "the first holder is fenced");
    let later = claim(&one, now, 1).await;
    assert!(
        later[0].token > taken[0].token,
        "{} !> {}: the first handle counts on from the second's tokens",
        later[0].token,
        taken[0].token
    );
    two.record(&taken[0], answered(200, now), Verdict::Delivered, now)
        .await
        .expect("the new holder records");
    assert_eq!(
        view(&one, taken[0].id).await.state,
        DeliveryState::Delivered
    );
}

pub async fn record_sets_state_attempts_and_last_result_for_each_verdict<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    for id in ["evt-1", "evt-2", "evt-3"] {
        accept(&b, id).await;
    }
    let c = claim(&b, clock.now(), 10).await;
    assert_eq!(c.len(), 6);
    clock.advance(Duration::from_secs(1));
    let now = clock.now();
    let wait = Duration::from_secs(10);
    let outcomes = [
        (answered(204, now), Verdict::Delivered),
        (answered(503, now), Verdict::Retry(wait)),
        (failed("timeout", now), Verdict::Uncertain(STATUS_RECHECK.0)),
        (
            answered(404, now),
            Verdict::Dead("receiver answered 404".into()),
        ),
        (
            failed("connection reset", now),
            Verdict::Dead("gave up after 15 attempts".into()),
        ),
    ];
    for (claimed, (attempt, verdict)) in c.iter().zip(outcomes.clone()) {
        b.record(claimed, attempt, verdict, now)
            .await
            .expect("record");
    }
    let expect = [
        (DeliveryState::Delivered, None, Some(204), None),
        (
            DeliveryState::Retrying,
            Some(now.plus(wait)),
            Some(503),
            None,
        ),
        (DeliveryState::Uncertain, None, None, Some("timeout")),
        (
            DeliveryState::Dead,
            None,
            Some(404),
            Some("receiver answered 404"),
        ),
        // Why it gave up, then the attempt's own error.
        (
            DeliveryState::Dead,
            None,
            None,
            Some("gave up after 15 attempts: connection reset"),
        ),
    ];
    for ((claimed, expect), (attempt, _)) in c.iter().zip(expect).zip(outcomes) {
        let v = view(&b, claimed.id).await;
        let seen = (
            v.state,
            v.next_attempt_at,
            v.last_status,
            v.last_error.as_deref(),
        );
        assert_eq!(seen, expect, "{}", claimed.route);
        assert_eq!(v.attempts, 1);
        assert_eq!(b.attempts(claimed.id).await.expect("attempts"), [attempt]);
    }
    let untouched = view(&b, c[5].id).await;
    assert_eq!(
        (untouched.state, untouched.attempts),
        (DeliveryState::InFlight, 0)
    );
    // Delivered, uncertain and dead are never claimed again; retrying and the lost lease are.
    clock.advance(Duration::from_secs(24 * 3600));
    let later = claim(&b, clock.now(), 10).await;
    let ids: Vec<(i64, u32)> = later.iter().map(|l| (l.id, l.attempts)).collect();
    // The lost lease's delivery has been due since it was created, before the retry's time.
    assert_eq!(ids, [(c[5].id, 0), (c[1].id, 1)]);
}

pub async fn retrying_delivery_is_claimable_only_from_its_next_attempt<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    b.ingest(ingest("evt-1", &["a"], None))
        .await
        .expect("ingest");
    let t0 = clock.now();
    let first = claim(&b, t0, 10).await.remove(0);
    let wait = Duration::from_secs(30);
    b.record(&first, answered(503, t0), Verdict::Retry(wait), t0)
        .await
        .expect("record");
    assert_eq!(claim(&b, t0, 10).await, []);
    clock.set(t0.plus(wait).minus(Duration::from_millis(1)));
    assert_eq!(claim(&b, clock.now(), 10).await, []);
    clock.set(t0.plus(wait));
    let now = clock.now();
    let second = claim(&b, now, 10).await.remove(0);
    assert_eq!((second.id, second.attempts), (first.id, 1));
    assert!(second.token > first.token);
    assert!(!second.taken_over, "a recorded retry is no relay's orphan");
    b.record(&second, answered(200, now), Verdict::Delivered, now)
        .await
        .expect("record");
    let attempts = b.attempts(first.id).await.expect("attempts");
    assert_eq!(
        attempts,
        [answered(503, t0), answered(200, now)],
        "oldest first"
    );
    assert_eq!(view(&b, first.id).await.attempts, 2);
}

pub async fn claim_takes_only_the_given_routes<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    accept(&b, "evt-2").await;
    let now = clock.now();
    let only_b = b.claim(now, 10, LEASE, &["b".into()]).await.expect("claim");
    assert_eq!(
        keys_and_routes(&only_b),
        [pair("shop:evt-1", "b"), pair("shop:evt-2", "b")]
    );
    let a_or_c = b
        .claim(now, 1, LEASE, &["c".into(), "a".into()])
        .await
        .expect("claim");
    assert_eq!(keys_and_routes(&a_or_c), [pair("shop:evt-1", "a")]);
    assert_eq!(
        b.claim(now, 10, LEASE, &["c".into()]).await.expect("claim"),
        []
    );
    let rest = claim(&b, now, 10).await;
    assert_eq!(keys_and_routes(&rest), [pair("shop:evt-2", "a")]);
}

/// On one clock (SQLite; PostgreSQL's claimers are nodes with clocks of their own and do not
/// re-anchor, `oncebox-postgres` says why): a relay dies holding deliveries and the wall clock
/// then goes back an hour. Its leases are not taken over at once (a live holder may still be
/// sending, and a route that ignores the key would get the request twice), nor held for the
/// hour: they end one lease length after the first claim that sees them, and the delivery goes
/// out again with the same key.
pub async fn a_backward_clock_jump_holds_a_lease_one_lease_length_not_the_jump<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 10).await;
    assert_eq!(first.len(), 2);
    clock.set(clock.now().minus(Duration::from_secs(3600)));
    assert_eq!(
        claim(&b, clock.now(), 10).await,
        [],
        "held just after the jump"
    );
    clock.advance(LEASE - Duration::from_millis(1));
    assert_eq!(
        claim(&b, clock.now(), 10).await,
        [],
        "held for one lease length"
    );
    // A live holder still records within that length, on the new timeline.
    let now = clock.now();
    b.record(&first[1], answered(200, now), Verdict::Delivered, now)
        .await
        .expect("the holder records its outcome after the jump");
    clock.advance(Duration::from_millis(1));
    let now = clock.now();
    let second = claim(&b, now, 10).await;
    assert_eq!(
        keys_and_routes(&second),
        keys_and_routes(&first[..1]),
        "the dead holder's delivery is claimed again one lease after the jump was seen"
    );
    assert!(second[0].token > first[0].token);
    assert_eq!(second[0].idempotency_key, first[0].idempotency_key);
    let late = b
        .record(&first[0], answered(200, now), Verdict::Delivered, now)
        .await;
    assert_eq!(late, Err(LeaseError::Fenced));
    assert_eq!(view(&b, first[1].id).await.state, DeliveryState::Delivered);
}

/// A claim whose `now` is stale by more than a lease (read before it waited for the store, or
/// reused across a loop of claims) while the store's clock shows no step cuts no live lease.
/// Taken for a step back, it re-anchored the holder's lease to end one lease after that stale
/// now, already past, and the next claim took the delivery over while its holder was sending.
pub async fn a_claim_with_a_stale_now_cuts_no_live_lease<B: DeliveryBackend>() {
    let clock = ManualClock::new(crate::EPOCH);
    let (one, two) = B::fresh_pair(clock.clone()).await;
    accept(&one, "evt-1").await;
    let at = clock.now();
    let held = claim(&one, at, 10).await;
    assert_eq!(held.len(), 2);
    assert_eq!(claim(&two, at, 10).await, [], "its first claim");
    let stale = at.minus(LEASE + Duration::from_millis(1));
    assert_eq!(claim(&two, stale, 10).await, [], "a claim with a stale now");
    let next = at.plus(Duration::from_millis(1));
    assert_eq!(claim(&one, next, 10).await, [], "nothing taken over");
    let end = at.plus(LEASE - Duration::from_millis(1));
    for c in &held {
        recorded_within(&one, c, end).await;
    }
}

/// Records `c` delivered at `at`, which its lease must still cover.
async fn recorded_within<S: super::Stores>(b: &S, c: &Claimed, at: Timestamp) {
    b.record(c, answered(200, at), Verdict::Delivered, at)
        .await
        .expect("the holder records within its lease");
}

/// A claimer whose clock runs behind the holder's by less than a lease (two nodes' skew) leaves
/// the lease as it is: the holder still records its outcome near the lease's end on its own
/// clock, and nobody takes the delivery over meanwhile.
pub async fn a_claimer_behind_by_less_than_a_lease_leaves_the_lease_alone<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let held = claim(&b, clock.now(), 10).await;
    assert_eq!(held.len(), 2);
    // Another node, its clock half a lease behind, polls.
    assert_eq!(claim(&b, clock.now().minus(LEASE / 2), 10).await, []);
    clock.advance(LEASE - Duration::from_millis(1));
    let now = clock.now();
    for c in &held {
        b.record(c, answered(200, now), Verdict::Delivered, now)
            .await
            .expect("the holder's lease was not cut by the other claimer's skew");
        assert_eq!(view(&b, c.id).await.state, DeliveryState::Delivered);
    }
}
