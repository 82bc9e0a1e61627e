//! The offset watermark behind a broker consumer (`InboxHandler` with a `Position`): every
//! answer the consumer acknowledges moves it, so a replay of the stream after the records were
//! purged finds each message stale, whether it had applied, been refused, been answered as a
//! duplicate or been quarantined as a conflict.

use oncebox_core::consume::{Apply, Position};
use oncebox_core::{Event, Processed, Response, ResponseKind};
use oncebox_sqlite::rusqlite::params;
use oncebox_sqlite::{HandlerError, Inbox, InboxHandler, OffsetMove, Options, Tx};
use oncebox_testkit::run;

use crate::harness::shop;

/// One effect row per applied event; a payload that says so is refused.
fn handler(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    if event.payload.windows(6).any(|w| w == b"refuse") {
        return Ok(Response::rejected("refused"));
    }
    tx.conn().execute(
        "INSERT INTO effects (event_id) VALUES (?1)",
        params![event.key.event_id.as_str()],
    )?;
    Ok(Response::completed("ok"))
}

fn at(offset: i64) -> Option<Position> {
    Some(Position {
        stream: "orders".into(),
        partition: 0,
        offset,
    })
}

async fn effects(inbox: &Inbox, id: &'static str) -> i64 {
    inbox
        .read(move |c| {
            c.query_row(
                "SELECT count(*) FROM effects WHERE event_id = ?1",
                [id],
                |r| r.get(0),
            )
        })
        .await
        .unwrap()
}

/// An inbox at `path` with an effects table, and the consumer's handler on it.
async fn consumer(
    path: std::path::PathBuf,
) -> (
    Inbox,
    InboxHandler<impl Fn(&mut Tx<'_>, &Event) -> Result<Response, HandlerError>>,
) {
    let inbox = Inbox::open(Options::new(path)).unwrap();
    inbox
        .write(|c| c.execute_batch("CREATE TABLE effects (event_id TEXT NOT NULL)"))
        .await
        .unwrap();
    let apply = InboxHandler::new(inbox.clone(), handler);
    (inbox, apply)
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
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let (inbox, apply) = consumer(dir.path().join("w.db")).await;

        let mut first = Vec::new();
        for (event, offset) in stream() {
            first.push(apply.apply(event, at(offset)).await.unwrap());
        }
        assert!(first[0].is_applied(), "{first:?}");
        assert!(matches!(&first[1], Processed::Applied(r) if r.kind == ResponseKind::Rejected));
        assert!(first[2].is_duplicate(), "{first:?}");
        let watermark: i64 = inbox
            .read(|c| {
                c.query_row(
                    "SELECT position FROM oncebox_offsets WHERE stream = 'orders'",
                    [],
                    |r| r.get(0),
                )
            })
            .await
            .unwrap();
        assert_eq!(watermark, 3, "the last acknowledged offset");

        // Retention purged the records; the stream is read again from its start.
        let purged = inbox
            .write(|c| c.execute("DELETE FROM oncebox_inbox", []))
            .await
            .unwrap();
        assert_eq!(purged, 2);
        for (event, offset) in stream() {
            let again = apply.apply(event, at(offset)).await.unwrap();
            assert!(again.is_stale(), "offset {offset}: {again:?}");
        }
        assert_eq!(effects(&inbox, "a").await, 1, "a applied once");
        assert_eq!(effects(&inbox, "b").await, 0, "b stays refused");
    });
}

/// A conflict is quarantined and acknowledged on its first attempt, so it settles its offset
/// too: otherwise, once the record and the stream's first message were gone, the conflicting
/// payload read again would find neither and apply the key a second time.
#[test]
fn a_replay_after_purge_finds_a_conflict_stale_too() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let (inbox, apply) = consumer(dir.path().join("w.db")).await;
        let first = apply.apply(shop("k", r#"{"n":1}"#), at(1)).await.unwrap();
        assert!(first.is_applied(), "{first:?}");
        let other = apply.apply(shop("k", r#"{"n":2}"#), at(2)).await;
        assert!(
            matches!(other, Err(oncebox_core::ProcessError::Conflict { .. })),
            "{other:?}"
        );
        // Retention purged the record; the stream's limits dropped its first message.
        inbox
            .write(|c| c.execute("DELETE FROM oncebox_inbox", []))
            .await
            .unwrap();
        let again = apply.apply(shop("k", r#"{"n":2}"#), at(2)).await.unwrap();
        assert!(again.is_stale(), "{again:?}");
        assert_eq!(effects(&inbox, "k").await, 1, "k applied once");
    });
}

/// A consumer that keeps its position in the inbox (a Kafka partition's, say) reads where to
/// resume after a restart, and moves the watermark past a message it acknowledges without
/// applying, outside any handler.
#[test]
fn a_consumer_reads_its_position_and_moves_it_on_its_own() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert_eq!(inbox.offset("orders", 0).await.unwrap(), None);
        let applied = inbox
            .process(shop("o-7", r#"{"n":7}"#), |tx: &mut Tx<'_>| {
                let _ = tx.commit_offset("orders", 0, 7)?;
                Ok(Response::completed("ok"))
            })
            .await
            .unwrap();
        assert!(matches!(applied, Processed::Applied(_)));
        assert_eq!(
            inbox.move_offset("orders", 0, 8).await.unwrap(),
            OffsetMove::Advanced
        );
        assert_eq!(
            inbox.move_offset("orders", 0, 5).await.unwrap(),
            OffsetMove::Replay
        );
        assert!(inbox.move_offset("ord\0ers", 0, 9).await.is_err());
        drop(inbox);
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert_eq!(inbox.offset("orders", 0).await.unwrap(), Some(8));
        assert_eq!(inbox.offset("orders", 1).await.unwrap(), None);
    });
}
