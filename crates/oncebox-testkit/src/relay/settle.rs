//! Delivery conformance tests of the relay's own settlements: a claim given back unsent, and
//! an uncertain delivery settled (or put off) by its route's status URL.

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{
    DeliveryFilter, DeliveryStore, Resolve, STATUS_RECHECK, StatusAnswer,
};
use oncebox_core::{Clock, LeaseError};

use super::operator::each_state;
use super::{DeliveryBackend, LEASE, Stores, accept, answered, claim, failed, fresh, view};

const MS: Duration = Duration::from_millis(1);

/// Whether delivery `id` is among the uncertain ones whose status check is due at `at`.
async fn check_due<S: Stores>(b: &S, id: i64, at: oncebox_core::Timestamp) -> bool {
    let filter = DeliveryFilter {
        state: Some(DeliveryState::Uncertain),
        due_by: Some(at),
        limit: 100,
        ..DeliveryFilter::default()
    };
    let page = b.deliveries(filter).await.expect("deliveries");
    page.items.iter().any(|d| d.id == id)
}

/// A relay that waited past its lease for a permit gives its claim back unsent: the lease ran
/// out, but its token is still the row's, so no one took it over and nothing was sent. The
/// delivery is claimed afresh, not as taken over (on a plain route that would park it
/// uncertain, as if it might have been sent).
pub async fn an_expired_claim_nobody_took_over_is_given_back_and_claimed_afresh<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 2).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let now = clock.now();
    b.unclaim(&first[0], now, now)
        .await
        .expect("given back after its lease ran out");
    let v = view(&b, first[0].id).await;
    assert_eq!((v.state, v.attempts), (DeliveryState::Pending, 0));
    let again = claim(&b, now, 2).await;
    let mut taken_over: Vec<(i64, bool)> = again.iter().map(|c| (c.id, c.taken_over)).collect();
    taken_over.sort_unstable();
    assert_eq!(
        taken_over,
        [(first[0].id, false), (first[1].id, true)],
        "only the one left in flight is taken over"
    );
}

pub async fn unclaim_gives_a_claim_back_due_when_asked_without_an_attempt_and_only_to_its_holder<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let first = claim(&b, clock.now(), 2).await;
    let (a, other) = (&first[0], &first[1]);
    // A holder whose lease expired and was taken over cannot give it back.
    clock.advance(LEASE + Duration::from_secs(1));
    let again = claim(&b, clock.now(), 2).await;
    let taken = again.iter().find(|c| c.id == a.id).expect("taken over");
    assert!(matches!(
        b.unclaim(a, clock.now(), clock.now()).await,
        Err(LeaseError::Fenced)
    ));
    assert_eq!(view(&b, a.id).await.state, DeliveryState::InFlight);
    clock.advance(Duration::from_secs(1));
    let now = clock.now();
    b.unclaim(taken, now, now)
        .await
        .expect("the holder gives it back");
    let v = view(&b, a.id).await;
    assert_eq!(
        (v.state, v.attempts, v.next_attempt_at),
        (DeliveryState::Pending, 0, Some(now))
    );
    assert!(matches!(
        b.unclaim(taken, now, now).await,
        Err(LeaseError::Fenced)
    ));
    // A delivery with an attempt behind it goes back to retrying, its count unchanged.
    let held = again.iter().find(|c| c.id == other.id).expect("claimed");
    let retry = Verdict::Retry(Duration::from_secs(5));
    b.record(held, answered(503, now), retry, now)
        .await
        .expect("record");
    clock.advance(Duration::from_secs(10));
    let now = clock.now();
    let third = claim(&b, now, 2).await;
    let ids: Vec<i64> = third.iter().map(|c| c.id).collect();
    assert_eq!(ids, [a.id, other.id], "the given-back claim is due at once");
    // Given back to be due later (the relay holds back a claim its lease ran short for):
    // not claimed before then.
    let due = now.plus(Duration::from_secs(5));
    b.unclaim(&third[1], now, due).await.expect("unclaim");
    let v = view(&b, other.id).await;
    assert_eq!(
        (v.state, v.attempts, v.next_attempt_at),
        (DeliveryState::Retrying, 1, Some(due))
    );
    assert!(claim(&b, now, 2).await.is_empty(), "not due yet");
    clock.advance(Duration::from_secs(5));
    let now = clock.now();
    let fourth = claim(&b, now, 2).await;
    assert_eq!(fourth.len(), 1);
    assert_eq!(
        (fourth[0].id, fourth[0].attempts, &fourth[0].idempotency_key),
        (other.id, 1, &other.idempotency_key)
    );
}

pub async fn reconcile_settles_only_an_uncertain_delivery_and_puts_off_an_unanswered_check<
    B: DeliveryBackend,
>() {
    let (b, clock) = fresh::<B>().await;
    let each = each_state(&b, &clock).await;
    let now = clock.now();
    let answers = [
        StatusAnswer::Applied,
        StatusAnswer::NotApplied,
        StatusAnswer::NotAppliedSpent,
        StatusAnswer::NoAnswer,
    ];
    let others = [
        (each.delivered.id, DeliveryState::Delivered),
        (each.dead.id, DeliveryState::Dead),
        (each.retrying.id, DeliveryState::Retrying),
        (each.in_flight.id, DeliveryState::InFlight),
        (each.pending, DeliveryState::Pending),
    ];
    for (id, was) in others {
        let attempts = view(&b, id).await.attempts;
        for answer in answers {
            assert!(
                !b.reconcile(id, attempts, answer, now)
                    .await
                    .expect("reconcile")
            );
            let v = view(&b, id).await;
            assert_eq!((v.state, v.note), (was, None), "{answer:?}");
        }
    }
    let u = each.uncertain.id;
    assert_eq!(
        view(&b, u).await.idempotency_key,
        each.uncertain.idempotency_key
    );
    // First asked the shortest wait after it became uncertain, not at once: a receiver that
    // timed out may still be at work on it. Before then no answer counts.
    let (least, _) = STATUS_RECHECK;
    let first = now.plus(least);
    assert!(!check_due(&b, u, first.minus(MS)).await);
    assert!(check_due(&b, u, first).await);
    for answer in answers {
        assert!(!b.reconcile(u, 1, answer, first.minus(MS)).await.unwrap());
    }
    // No answer: asked again after twice the time since it was last asked (or parked).
    assert!(
        b.reconcile(u, 1, StatusAnswer::NoAnswer, first)
            .await
            .unwrap()
    );
    assert_eq!(view(&b, u).await.state, DeliveryState::Uncertain);
    let second = first.plus(least * 2);
    assert!(!check_due(&b, u, second.minus(MS)).await);
    assert!(check_due(&b, u, second).await);
    // A second relay's answer to the question just put off changes nothing.
    assert!(
        !b.reconcile(u, 1, StatusAnswer::NoAnswer, first)
            .await
            .unwrap()
    );
    assert!(
        !b.reconcile(u, 1, StatusAnswer::NotApplied, first)
            .await
            .unwrap()
    );
    assert!(
        b.reconcile(u, 1, StatusAnswer::NoAnswer, second)
            .await
            .unwrap()
    );
    let third = second.plus(least * 4);
    assert!(!check_due(&b, u, third.minus(MS)).await);
    assert!(check_due(&b, u, third).await);
    // Not applied: due again now, with the same key, its attempts unchanged.
    assert!(
        b.reconcile(u, 1, StatusAnswer::NotApplied, third)
            .await
            .unwrap()
    );
    let v = view(&b, u).await;
    assert_eq!(
        (v.state, v.next_attempt_at, v.attempts, v.note.as_deref()),
        (
            DeliveryState::Pending,
            Some(third),
            1,
            Some("status_url: not applied")
        )
    );
    assert!(
        !b.reconcile(u, 1, StatusAnswer::Applied, third)
            .await
            .unwrap()
    );
    let again = claim(&b, third, 10).await;
    let back = again.iter().find(|c| c.id == u).expect("due again");
    assert_eq!(back.idempotency_key, each.uncertain.idempotency_key);
    // Applied: delivered, and never claimed again.
    b.record(
        back,
        failed("timeout", third),
        Verdict::Uncertain(STATUS_RECHECK.0),
        third,
    )
    .await
    .expect("record");
    // An answer to the question about the attempt before changes nothing.
    assert!(
        !b.reconcile(u, 1, StatusAnswer::NotApplied, third)
            .await
            .unwrap()
    );
    // Nor once the new attempt's question is due: an answer asked about attempt 1, slow to
    // come back, would have it sent a third time.
    let fourth = third.plus(least);
    assert!(
        !b.reconcile(u, 1, StatusAnswer::NotApplied, fourth)
            .await
            .unwrap()
    );
    assert_eq!(view(&b, u).await.state, DeliveryState::Uncertain);
    // Nor does one that went unanswered put the new attempt's check off.
    assert!(
        !b.reconcile(u, 1, StatusAnswer::NoAnswer, fourth)
            .await
            .unwrap()
    );
    assert!(check_due(&b, u, fourth).await, "its check is still due");
    assert!(
        b.reconcile(u, 2, StatusAnswer::Applied, fourth)
            .await
            .unwrap()
    );
    let v = view(&b, u).await;
    assert_eq!(
        (v.state, v.note.as_deref()),
        (DeliveryState::Delivered, Some("status_url: applied"))
    );
}

/// An attempt's error quoting what the other side said may hold a NUL (a broker's reply text, a
/// TLS library's chain), and so may a library caller's note: PostgreSQL's `text` refuses it, so
/// the record failed as a storage error every time, until the lease ran out and the delivery
/// was taken over as possibly sent. Every store keeps it as U+FFFD.
pub async fn an_error_or_a_note_holding_nul_is_recorded<B: DeliveryBackend>() {
    let (b, clock) = fresh::<B>().await;
    accept(&b, "evt-1").await;
    let c = claim(&b, clock.now(), 10).await;
    let now = clock.now();
    let wait = Duration::from_secs(10);
    b.record(
        &c[0],
        failed("312 NO\0ROUTE", now),
        Verdict::Retry(wait),
        now,
    )
    .await
    .expect("recorded");
    let kept = "312 NO\u{FFFD}ROUTE";
    let v = view(&b, c[0].id).await;
    assert_eq!(
        (v.state, v.last_error.as_deref()),
        (DeliveryState::Retrying, Some(kept))
    );
    let attempts = b.attempts(c[0].id).await.expect("attempts");
    assert_eq!(attempts[0].error.as_deref(), Some(kept));
    let settled = b.resolve(c[0].id, Resolve::Dead, "by hand\0", now).await;
    assert!(settled.expect("resolved"), "{:?}", view(&b, c[0].id).await);
    assert_eq!(
        view(&b, c[0].id).await.note.as_deref(),
        Some("by hand\u{FFFD}")
    );
}
