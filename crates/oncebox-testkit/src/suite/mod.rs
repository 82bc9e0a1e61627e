//! The conformance suite: every behaviour of DESIGN §1–4 and §8 as a test written once, run
//! against each backend through [`crate::Backend`]. The operators' reads of the gateway's
//! store (conflicts.rs, activity.rs) run on each backend's store through
//! [`crate::relay::DeliveryBackend`] and `read_conformance!`, which `delivery_conformance!`
//! includes.

mod activity;
mod clock;
mod conflicts;
mod effects;
mod lease;
pub mod leasing;
mod reads;

use oncebox_core::{ManualClock, ProcessError, Processed, Response, ResponseKind};

pub use crate::model::model_based_sequences_match_the_model;
pub use activity::*;
pub use clock::*;
pub use conflicts::*;
pub use effects::*;
pub use lease::*;

use crate::{Backend, EPOCH, End, Script, event};

pub(crate) async fn fresh<B: Backend>() -> (B, ManualClock) {
    let clock = ManualClock::new(EPOCH);
    (B::fresh(clock.clone()).await, clock)
}

pub async fn first_delivery_applies_and_stores_its_response<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("provider-a", "evt-1", 500);
    let out = b
        .process(
            e.clone(),
            Script::credit(500).end(End::Complete("credited".into())),
        )
        .await;
    assert_eq!(
        out.unwrap(),
        Processed::Applied(Response::completed("credited"))
    );
    let seen = b.observe().await;
    assert_eq!(
        (seen.balance, seen.inbox_rows, seen.effects_of(&e.key)),
        (500, 1, 1)
    );
}

pub async fn duplicate_replays_first_response_without_running_handler<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("provider-a", "evt-1", 500);
    b.process(
        e.clone(),
        Script::credit(500).end(End::Complete("first".into())),
    )
    .await
    .unwrap();
    // The second handler would answer differently and fail: it must not run at all.
    let out = b
        .process(e.clone(), Script::credit(500).end(End::Fail))
        .await;
    assert_eq!(
        out.unwrap(),
        Processed::Duplicate(Response::completed("first"))
    );
    let seen = b.observe().await;
    assert_eq!((seen.balance, seen.effects_of(&e.key)), (500, 1));
}

pub async fn same_key_with_different_payload_is_a_conflict_and_first_payload_wins<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    b.process(event("provider-a", "evt-1", 500), Script::credit(500))
        .await
        .unwrap();
    let out = b
        .process(event("provider-a", "evt-1", 700), Script::credit(700))
        .await;
    assert!(matches!(out, Err(ProcessError::Conflict { .. })), "{out:?}");
    // Still a conflict the second time: the first payload stays the reference.
    let again = b
        .process(event("provider-a", "evt-1", 700), Script::credit(700))
        .await;
    assert!(
        matches!(again, Err(ProcessError::Conflict { .. })),
        "{again:?}"
    );
    let seen = b.observe().await;
    assert_eq!((seen.balance, seen.inbox_rows, seen.conflicts), (500, 1, 2));
    let dup = b
        .process(event("provider-a", "evt-1", 500), Script::credit(500))
        .await;
    assert!(dup.unwrap().is_duplicate());
}

pub async fn equal_json_in_another_spelling_is_a_duplicate<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let key = oncebox_core::Key::parse("shop", "evt-9").unwrap();
    let a = oncebox_core::Event::json(key.clone(), r#"{"amount":10,"cur":"EUR"}"#).unwrap();
    let spelled =
        oncebox_core::Event::json(key, "{ \"cur\" : \"EUR\", \"amount\" : 10.0 }").unwrap();
    b.process(a, Script::credit(10)).await.unwrap();
    let out = b.process(spelled, Script::credit(10)).await.unwrap();
    assert!(out.is_duplicate(), "{out:?}");
}

pub async fn handler_failure_rolls_back_everything_and_retry_applies<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("provider-a", "evt-2", 500);
    let failed = b
        .process(
            e.clone(),
            Script::credit(500).email("order-1").end(End::Fail),
        )
        .await;
    assert!(
        matches!(failed, Err(ProcessError::Handler(_))),
        "{failed:?}"
    );
    let seen = b.observe().await;
    assert_eq!(
        (
            seen.balance,
            seen.inbox_rows,
            seen.emails.len(),
            seen.outbox.len()
        ),
        (0, 0, 0, 0)
    );
    let retried = b
        .process(e.clone(), Script::credit(500).email("order-1"))
        .await;
    assert!(matches!(retried, Ok(Processed::Applied(_))), "{retried:?}");
    let seen = b.observe().await;
    assert_eq!(
        (seen.balance, seen.effects_of(&e.key), seen.emails.len()),
        (500, 1, 1)
    );
}

pub async fn handler_panic_rolls_back_and_other_events_commit<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let (p, ok) = (event("a", "panics", 5), event("a", "fine", 7));
    let (r1, r2) = tokio::join!(
        b.process(p.clone(), Script::credit(5).end(End::Panic)),
        b.process(ok.clone(), Script::credit(7)),
    );
    // What the panic said reaches the caller (a consumer's quarantine record carries it).
    assert!(
        matches!(&r1, Err(ProcessError::Handler(e)) if e.to_string().contains("scripted panic")),
        "{r1:?}"
    );
    assert!(matches!(r2, Ok(Processed::Applied(_))), "{r2:?}");
    let seen = b.observe().await;
    assert_eq!(
        (seen.balance, seen.effects_of(&p.key), seen.inbox_rows),
        (7, 0, 1)
    );
}

pub async fn sql_error_in_handler_leaves_no_inbox_row<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    // Account 42 does not exist: the effect violates a foreign key.
    let out = b
        .process(
            event("provider-a", "evt-x", 5),
            Script::credit(5).account(42),
        )
        .await;
    assert!(matches!(out, Err(ProcessError::Handler(_))), "{out:?}");
    let seen = b.observe().await;
    assert_eq!((seen.inbox_rows, seen.balance), (0, 0));
}

pub async fn rejection_is_stored_and_replayed_without_effect<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let e = event("shop", "evt-r", 5);
    let out = b
        .process(
            e.clone(),
            Script::credit(5).end(End::Reject("no such order".into())),
        )
        .await;
    assert_eq!(
        out.unwrap(),
        Processed::Applied(Response::rejected("no such order"))
    );
    let dup = b.process(e.clone(), Script::credit(5)).await.unwrap();
    assert_eq!(
        dup,
        Processed::Duplicate(Response::rejected("no such order"))
    );
    let seen = b.observe().await;
    assert_eq!(
        (seen.balance, seen.effects_of(&e.key), seen.inbox_rows),
        (0, 0, 1)
    );
}

pub async fn same_event_id_from_two_sources_is_two_events<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    b.process(event("provider-a", "evt-1", 500), Script::credit(500))
        .await
        .unwrap();
    let other = b
        .process(event("provider-b", "evt-1", 500), Script::credit(500))
        .await;
    assert!(matches!(other, Ok(Processed::Applied(_))), "{other:?}");
    assert_eq!(b.observe().await.balance, 1000);
}

/// 50 deliveries of one key in flight together: every one is sent while the store's writes are
/// held, so none can be answered before all are sent, and none waits for another's answer
/// before asking (tasks let go together could still run one after another on a starved
/// runtime, as happened once, and a first request answered before the test thread got to send
/// the rest showed no race on a loaded machine).
pub async fn concurrent_deliveries_of_one_key_apply_once<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    const N: usize = 50;
    // Every request is sent before the store may answer any: left to timing, a test thread
    // descheduled between the first request's send and its first look at the answer saw it
    // answered before the others were sent, on a loaded machine, and no race was shown.
    let held = b.hold_writes().await;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let requests: Vec<_> = (0..N)
        .map(|_| {
            let (b, sent) = (b.clone(), sent.clone());
            tokio::spawn(crate::race::timed(async move {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                b.process(event("provider-a", "evt-3", 500), Script::credit(500))
                    .await
            }))
        })
        .collect();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // All sent, and at least two of them waiting in the store itself: the key is raced there,
    // not only in the test's tasks.
    let mut held_at_once = 0;
    while sent.load(std::sync::atomic::Ordering::SeqCst) < N || held_at_once < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the requests were not all sent and held ({held_at_once} waiting in the store)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        held_at_once = b.held_requests().await;
    }
    let released = std::time::Instant::now();
    drop(held);
    let mut applied = 0;
    let mut duplicate = 0;
    let mut answers = Vec::new();
    for answer in futures::future::join_all(requests).await {
        let answer = answer.expect("request task");
        match answer.value.as_ref().unwrap() {
            Processed::Applied(r) if r.kind == ResponseKind::Completed => applied += 1,
            Processed::Duplicate(_) => duplicate += 1,
            other => panic!("unexpected {other:?}"),
        }
        answers.push(answer);
    }
    assert_eq!((applied, duplicate), (1, N - 1));
    // The hold held: nothing was answered before it was let go, so every request was sent
    // while none could have been answered.
    assert!(
        answers.iter().all(|a| a.answered >= released),
        "a request was answered while the store's writes were held"
    );
    let seen = b.observe().await;
    assert_eq!((seen.balance, seen.inbox_rows, seen.doubles()), (500, 1, 0));
}
