//! `InboxHandler`, the `Apply` broker consumers call, on a real server: duplicates answered
//! from the record, and the offset watermark behind a consumer with a `Position`. Every answer
//! the consumer acknowledges moves it, so a replay of the stream after the records were purged
//! finds each message stale, whether it had applied, been refused, been answered as a
//! duplicate, been quarantined as a conflict or as invalid.

use futures::future::BoxFuture;
use oncebox_core::consume::{Apply, Position};
use oncebox_core::{Event, Invalid, ManualClock, ProcessError, Processed, Response, ResponseKind};
use oncebox_postgres::{HandlerError, InboxHandler, MAX_EVENT_BYTES, Tx, sqlx};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, schema, url};

/// One effect row per applied event; a payload that says so is refused, or fails.
fn handler<'t>(tx: &'t mut Tx, event: &'t Event) -> BoxFuture<'t, Result<Response, HandlerError>> {
    Box::pin(async move {
        let says = |word: &[u8]| event.payload.windows(word.len()).any(|w| w == word);
        if says(b"refuse") {
            return Ok(Response::rejected("refused"));
        }
        if says(b"boom") {
            return Err(HandlerError::failed("the payload asked to fail"));
        }
        sqlx::query("INSERT INTO consumed (event_id) VALUES ($1)")
            .bind(event.key.event_id.as_str())
            .execute(tx.conn())
            .await?;
        Ok(Response::completed("ok"))
    })
}

pub type Consumer = InboxHandler<
    for<'t> fn(&'t mut Tx, &'t Event) -> BoxFuture<'t, Result<Response, HandlerError>>,
>;

pub async fn consumer() -> (Postgres, Consumer) {
    let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
    sqlx::query("CREATE TABLE consumed (event_id TEXT NOT NULL)")
        .execute(pg.inbox.pool())
        .await
        .expect("effects table");
    let apply = InboxHandler::new(pg.inbox.clone(), handler as _);
    (pg, apply)
}

fn shop(id: &str, payload: &str) -> Event {
    let key = oncebox_core::Key::parse("shop", id).expect("key");
    Event::json(key, payload.to_owned()).expect("payload")
}

fn at(offset: i64) -> Option<Position> {
    Some(Position {
        stream: "orders".into(),
        partition: 0,
        offset,
    })
}

pub async fn effects(pg: &Postgres, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM consumed WHERE event_id = $1")
        .bind(id)
        .fetch_one(pg.inbox.pool())
        .await
        .expect("count")
}

async fn watermark(pg: &Postgres) -> Option<i64> {
    sqlx::query_scalar("SELECT position FROM oncebox_offsets WHERE stream = 'orders'")
        .fetch_optional(pg.inbox.pool())
        .await
        .expect("watermark")
}

/// Retention purged every record.
async fn purge(pg: &Postgres) -> u64 {
    sqlx::query("DELETE FROM oncebox_inbox")
        .execute(pg.inbox.pool())
        .await
        .expect("purge")
        .rows_affected()
}

/// The stream's messages: `a` applies, `b` is refused, `a` comes again (a duplicate, the last
/// message of the stream), each at its own offset.
fn stream() -> [(Event, i64); 3] {
    [
        (shop("a", r#"{"n":1}"#), 1),
        (shop("b", r#"{"do":"refuse"}"#), 2),
        (shop("a", r#"{"n":1}"#), 3),
    ]
}

#[test]
fn a_replay_after_purge_finds_refused_and_duplicate_messages_stale() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, apply) = consumer().await;
        let mut first = Vec::new();
        for (event, offset) in stream() {
            first.push(apply.apply(event, at(offset)).await.expect("answer"));
        }
        assert!(first[0].is_applied(), "{first:?}");
        assert!(matches!(&first[1], Processed::Applied(r) if r.kind == ResponseKind::Rejected));
        assert!(
            matches!(&first[2], Processed::Duplicate(r) if r.body == b"ok"),
            "the first answer replayed: {first:?}"
        );
        assert_eq!(
            watermark(&pg).await,
            Some(3),
            "the last acknowledged offset"
        );

        assert_eq!(purge(&pg).await, 2);
        for (event, offset) in stream() {
            let again = apply.apply(event, at(offset)).await.expect("answer");
            assert!(again.is_stale(), "offset {offset}: {again:?}");
        }
        assert_eq!(effects(&pg, "a").await, 1, "a applied once");
        assert_eq!(effects(&pg, "b").await, 0, "b stays refused");
    });
}

/// A conflict is quarantined and acknowledged on its first attempt, so it settles its offset
/// too: otherwise, once the record and the stream's first message were gone, the conflicting
/// payload read again would find neither and apply the key a second time.
#[test]
fn a_replay_after_purge_finds_a_conflict_stale_too() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, apply) = consumer().await;
        let first = apply.apply(shop("k", r#"{"n":1}"#), at(1)).await;
        assert!(matches!(&first, Ok(p) if p.is_applied()), "{first:?}");
        let other = apply.apply(shop("k", r#"{"n":2}"#), at(2)).await;
        assert!(
            matches!(other, Err(ProcessError::Conflict { .. })),
            "{other:?}"
        );
        assert_eq!(watermark(&pg).await, Some(2));
        purge(&pg).await;
        let again = apply.apply(shop("k", r#"{"n":2}"#), at(2)).await;
        assert!(matches!(&again, Ok(p) if p.is_stale()), "{again:?}");
        assert_eq!(effects(&pg, "k").await, 1, "k applied once");
    });
}

/// An event the store can never keep is quarantined and acknowledged too: its offset settles,
/// and an earlier offset read again is a replay.
#[test]
fn an_invalid_event_settles_its_offset() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, apply) = consumer().await;
        let mut huge = event("shop", "huge", 1);
        // Allocated zeroed and refused by its length alone: no page of it is touched.
        huge.payload = vec![0; MAX_EVENT_BYTES + 1];
        let refused = apply.apply(huge, at(5)).await;
        assert!(
            matches!(
                refused,
                Err(ProcessError::Invalid(Invalid::TooLarge { .. }))
            ),
            "{refused:?}"
        );
        assert_eq!(watermark(&pg).await, Some(5));
        let earlier = apply.apply(shop("c", r#"{"n":1}"#), at(4)).await;
        assert!(matches!(&earlier, Ok(p) if p.is_stale()), "{earlier:?}");
        assert_eq!(effects(&pg, "c").await, 0);
    });
}

/// The watermark itself: a message at or below it is recorded as stale with nothing applied
/// (and stays so: its redelivery replays `Stale`); a failing handler leaves it where it was,
/// since the consumer requeues that message; a message without a position keeps none.
#[test]
fn a_message_at_or_below_the_watermark_is_stale_and_a_failure_leaves_it() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, apply) = consumer().await;
        let x = apply.apply(shop("x", r#"{"n":1}"#), at(10)).await;
        assert!(matches!(&x, Ok(p) if p.is_applied()), "{x:?}");
        for (id, offset) in [("y", 10), ("z", 7)] {
            let old = apply.apply(shop(id, r#"{"n":1}"#), at(offset)).await;
            assert!(matches!(&old, Ok(Processed::Stale)), "{id}: {old:?}");
            let again = apply.apply(shop(id, r#"{"n":1}"#), at(offset)).await;
            assert!(
                matches!(&again, Ok(p) if p.is_duplicate() && p.is_stale()),
                "{id}: {again:?}"
            );
            assert_eq!(effects(&pg, id).await, 0, "{id}");
        }
        let failed = apply.apply(shop("boom", r#"{"boom":1}"#), at(11)).await;
        assert!(
            matches!(failed, Err(ProcessError::Handler(_))),
            "{failed:?}"
        );
        assert_eq!(watermark(&pg).await, Some(10), "requeued, not settled");
        let next = apply.apply(shop("w", r#"{"n":1}"#), at(11)).await;
        assert!(matches!(&next, Ok(p) if p.is_applied()), "{next:?}");
        assert_eq!(watermark(&pg).await, Some(11));
        let unordered = apply.apply(shop("v", r#"{"n":1}"#), None).await;
        assert!(
            matches!(&unordered, Ok(p) if p.is_applied()),
            "{unordered:?}"
        );
        assert_eq!(watermark(&pg).await, Some(11), "no position, no watermark");
    });
}

/// A consumer that keeps its position in the inbox (a Kafka partition's, say) reads where to
/// resume, and moves the watermark past a message it acknowledges without applying, outside
/// any handler.
#[test]
fn a_consumer_reads_its_position_and_moves_it_on_its_own() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (pg, _) = consumer().await;
        let inbox = &pg.inbox;
        assert_eq!(inbox.offset("orders", 0).await.unwrap(), None);
        assert_eq!(
            inbox.move_offset("orders", 0, 8).await.unwrap(),
            oncebox_postgres::OffsetMove::Advanced
        );
        assert_eq!(
            inbox.move_offset("orders", 0, 5).await.unwrap(),
            oncebox_postgres::OffsetMove::Replay
        );
        assert_eq!(inbox.offset("orders", 0).await.unwrap(), Some(8));
        assert_eq!(inbox.offset("orders", 1).await.unwrap(), None);
    });
}
