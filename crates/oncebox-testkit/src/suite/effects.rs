//! Conformance tests of what a handler does on the transaction: action keys, entity versions,
//! offset watermarks, the outbox, and durability across a restart.

use oncebox_core::{ProcessError, Processed, Response};

use super::fresh;
use crate::{Backend, End, Script, event};

pub async fn action_key_sends_one_email_for_two_events<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    // Two *different* events about one order: event dedup lets both in, the action key lets
    // one email out.
    b.process(
        event("shop", "paid-1", 0),
        Script::credit(0).email("order-7"),
    )
    .await
    .unwrap();
    b.process(
        event("shop", "paid-2", 0),
        Script::credit(0).email("order-7"),
    )
    .await
    .unwrap();
    // A second integration (the CRM) reports the same business fact under its own source
    // and event id: the action key is not namespaced by source, so still one email.
    b.process(
        event("crm", "deal-9-won", 0),
        Script::credit(0).email("order-7"),
    )
    .await
    .unwrap();
    // The customer's next purchase is a new order: a new email.
    b.process(
        event("shop", "paid-3", 0),
        Script::credit(0).email("order-8"),
    )
    .await
    .unwrap();
    let seen = b.observe().await;
    assert_eq!(
        seen.emails,
        vec!["order-7".to_owned(), "order-8".to_owned()]
    );
    assert_eq!(
        seen.outbox,
        vec![
            ("email".to_owned(), "order-7".to_owned()),
            ("email".to_owned(), "order-8".to_owned())
        ]
    );
    assert_eq!(seen.inbox_rows, 4);
}

/// Fifty different events about one order, all held until each is in the store, then let go
/// together: one email (on SQLite they meet in one writer's batches, on PostgreSQL on the
/// action key's row), and every event applied.
pub async fn fifty_events_racing_for_one_action_key_send_one_email<B: Backend>() {
    const N: usize = 50;
    let (b, _) = fresh::<B>().await;
    let held = b.hold_writes().await;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let requests: Vec<_> = (0..N)
        .map(|i| {
            let (b, sent) = (b.clone(), sent.clone());
            tokio::spawn(async move {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let script = Script::credit(1).email("order-7");
                b.process(event("shop", &format!("paid-{i}"), 1), script)
                    .await
            })
        })
        .collect();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // All sent, and at least two waiting in the store itself, so the key is raced there.
    while sent.load(std::sync::atomic::Ordering::SeqCst) < N || b.held_requests().await < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the requests were not held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    drop(held);
    for request in requests {
        let out = request.await.expect("request task");
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
    }
    let seen = b.observe().await;
    assert_eq!(seen.emails, ["order-7"]);
    assert_eq!(seen.outbox, [("email".to_owned(), "order-7".to_owned())]);
    assert_eq!((seen.inbox_rows, seen.balance), (N as i64, N as i64));
}

/// A NUL in an action key or an entity id: PostgreSQL cannot store one (the handler failed
/// there on its SQL) while SQLite kept it. Every backend refuses it alike: the handler fails,
/// nothing of the event is kept, and the key stays free. (The email script also queues a
/// message under the order, which the outbox refused already; the entity id is refused only by
/// `advance`'s own check.)
pub async fn a_nul_in_an_action_key_or_entity_id_fails_the_handler<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    for script in [
        Script::credit(5).email("order\0-7"),
        Script::credit(5).version("order\0-1", 3),
    ] {
        let out = b.process(event("shop", "nul", 5), script).await;
        assert!(matches!(out, Err(ProcessError::Handler(_))), "{out:?}");
    }
    let seen = b.observe().await;
    assert_eq!((seen.balance, seen.inbox_rows), (0, 0), "nothing kept");
    assert!(seen.emails.is_empty());
    let out = b.process(event("shop", "nul", 5), Script::credit(5)).await;
    assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
}

pub async fn older_entity_version_is_stale_and_changes_nothing<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    b.process(
        event("shop", "paid", 100),
        Script::credit(100).version("order-1", 20),
    )
    .await
    .unwrap();
    let old = event("shop", "created", 1);
    let out = b
        .process(old.clone(), Script::credit(1).version("order-1", 10))
        .await
        .unwrap();
    assert_eq!(out, Processed::Stale);
    let replay = b
        .process(old.clone(), Script::credit(1).version("order-1", 10))
        .await
        .unwrap();
    assert_eq!(replay, Processed::Duplicate(Response::stale()));
    let newer = b.process(
        event("shop", "refunded", 5),
        Script::credit(5).version("order-1", 30),
    );
    assert!(matches!(newer.await, Ok(Processed::Applied(_))));
    let seen = b.observe().await;
    assert_eq!(
        (seen.balance, seen.effects_of(&old.key), seen.inbox_rows),
        (105, 0, 3)
    );
}

pub async fn offset_at_or_below_watermark_is_a_replay<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let at = |id: &str, off: i64| {
        (
            event("broker", id, 1),
            Script::credit(1).offset("orders", 0, off),
        )
    };
    let (e, s) = at("m5", 5);
    assert_eq!(
        b.process(e, s).await.unwrap(),
        Processed::Applied(Response::completed("ok"))
    );
    for (id, off) in [("m3", 3), ("m5-again", 5)] {
        let (e, s) = at(id, off);
        assert_eq!(
            b.process(e, s).await.unwrap(),
            Processed::Applied(Response::completed("replay"))
        );
    }
    let (e, s) = at("m6", 6);
    assert_eq!(
        b.process(e, s).await.unwrap(),
        Processed::Applied(Response::completed("ok"))
    );
    assert_eq!(b.observe().await.balance, 2);
}

pub async fn outbox_message_commits_only_with_the_effect<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let _ = b
        .process(
            event("shop", "e1", 1),
            Script::credit(1).email("o1").end(End::Fail),
        )
        .await;
    let _ = b
        .process(
            event("shop", "e2", 1),
            Script::credit(1).email("o2").end(End::Panic),
        )
        .await;
    let rejected = Script::credit(1).email("o3").end(End::Reject("no".into()));
    b.process(event("shop", "e3", 1), rejected).await.unwrap();
    assert!(b.observe().await.outbox.is_empty());
    b.process(event("shop", "e4", 1), Script::credit(1).email("o4"))
        .await
        .unwrap();
    assert_eq!(
        b.observe().await.outbox,
        vec![("email".to_owned(), "o4".to_owned())]
    );
    // A key no header can carry is refused at enqueue: the event fails whole, with why, and
    // its key stays free.
    let before = b.observe().await;
    let bad = b
        .process(
            event("shop", "e5", 1),
            Script::credit(1).email("o5\r\nX: 1"),
        )
        .await;
    assert!(
        matches!(&bad, Err(ProcessError::Handler(e)) if e.to_string().contains("control character")),
        "{bad:?}"
    );
    assert_eq!(
        b.observe().await,
        before,
        "nothing of the refused event is kept"
    );
    let retried = b
        .process(event("shop", "e5", 1), Script::credit(1).email("o5"))
        .await
        .unwrap();
    assert!(retried.is_applied(), "{retried:?}");
}

/// A key names one message for its destination: a second under it is not queued, and the
/// handler hears whether it was the same message or another one (a key built from too little).
pub async fn a_second_message_under_a_key_says_whether_it_was_the_same<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let answers = |p: oncebox_core::Processed| String::from_utf8(p.response().body).unwrap();
    let first = Script::credit(1)
        .note("n1", r#"{"a":1}"#)
        .note("n1", r#"{"a":1}"#)
        .note("n1", r#"{"a":2}"#);
    let p = b.process(event("shop", "e1", 1), first).await.unwrap();
    assert_eq!(answers(p), "Queued,Already,Conflict");
    // From another event, in another transaction, against the committed row.
    let again = Script::credit(1).note("n1", r#"{"a":1}"#).note("n1", "{}");
    let p = b.process(event("shop", "e2", 1), again).await.unwrap();
    assert_eq!(answers(p), "Already,Conflict");
    let n1 = ("notes".to_owned(), "n1".to_owned());
    assert_eq!(b.observe().await.outbox, vec![n1]);
}

pub async fn restart_keeps_every_committed_key<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    for i in 0..20 {
        b.process(event("shop", &format!("e{i}"), 1), Script::credit(1))
            .await
            .unwrap();
    }
    let b = b.reopen().await;
    for i in 0..20 {
        let out = b
            .process(event("shop", &format!("e{i}"), 1), Script::credit(1))
            .await
            .unwrap();
        assert!(out.is_duplicate(), "e{i}: {out:?}");
    }
    let seen = b.observe().await;
    assert_eq!((seen.balance, seen.inbox_rows, seen.doubles()), (20, 20, 0));
}

/// The store counts the rows no purge removes (action keys, entity versions, offset
/// watermarks) for operators: one per scope and key, entity, partition, however many events
/// touch it; a rolled-back event adds none.
pub async fn stats_count_the_rows_kept_forever<B: Backend>() {
    let (b, _) = fresh::<B>().await;
    let kept = async || {
        let k = b.stats().await.kept;
        (k.actions, k.versions, k.offsets)
    };
    assert_eq!(kept().await, (0, 0, 0));
    let script = |order: &str, version, partition, offset| {
        Script::credit(1)
            .email(order)
            .version(order, version)
            .offset("orders", partition, offset)
    };
    b.process(event("shop", "e1", 1), script("o1", 1, 0, 1))
        .await
        .unwrap();
    // The same order again, newer: the same three rows, moved on.
    b.process(event("shop", "e2", 1), script("o1", 2, 0, 2))
        .await
        .unwrap();
    assert_eq!(kept().await, (1, 1, 1));
    // A failing handler leaves no row behind.
    let failed = script("o9", 1, 9, 1).end(End::Fail);
    assert!(b.process(event("shop", "e3", 1), failed).await.is_err());
    assert_eq!(kept().await, (1, 1, 1));
    b.process(event("shop", "e4", 1), script("o2", 1, 1, 1))
        .await
        .unwrap();
    assert_eq!(kept().await, (2, 2, 2));
}

/// Action keys and entity versions outlive the records that made them (S3, S4 of the seeds: a
/// deleted record must not make an old fact new). A purge deletes a record past its retention;
/// a sender's redelivery after that is a new event to the inbox, and its own effect runs again
/// (why retention must cover the sender's redelivery horizon), but the email it would send
/// went out already, its message keeps its row (the guard of its own key), and an older
/// version of its entity is still stale.
pub async fn action_keys_and_versions_outlive_their_records_purge<B: Backend>() {
    use std::time::Duration;

    use oncebox_core::{Clock, Retention};

    let (b, clock) = fresh::<B>().await;
    let day = Duration::from_secs(24 * 3600);
    let retention = Retention::new(day * 7);
    let paid = || Script::credit(1).email("o-7").version("o-7", 20);
    let first = b.process(event("shop", "paid", 1), paid()).await.unwrap();
    assert!(matches!(first, Processed::Applied(_)), "{first:?}");
    // The email's message delivered, so nothing holds the record back from the purge.
    assert_eq!(b.deliver_due(clock.now()).await, 1);
    let kept = b.stats().await.kept;
    assert_eq!((kept.actions, kept.versions), (1, 1));
    clock.advance(day * 8);
    assert_eq!(b.purge(clock.now(), &retention).await, 1);
    let purged = b.observe().await;
    assert_eq!(purged.inbox_rows, 0, "{purged:?}");
    // Before the redelivery below, which would set the version again.
    let created = Script::credit(1).version("o-7", 10);
    let late = b.process(event("shop", "created", 1), created).await;
    assert_eq!(late.unwrap(), Processed::Stale);
    let again = b.process(event("shop", "paid", 1), paid()).await.unwrap();
    assert!(matches!(again, Processed::Applied(_)), "{again:?}");
    let seen = b.observe().await;
    assert_eq!(seen.emails, ["o-7"], "one email for the order");
    assert_eq!(seen.outbox, [("email".to_owned(), "o-7".to_owned())]);
    assert_eq!(
        seen.balance, 2,
        "the redelivered event's own effect ran again"
    );
    let kept = b.stats().await.kept;
    assert_eq!((kept.actions, kept.versions), (1, 1));
}
