//! A database damaged inside rather than as a whole: one page of the inbox's key index
//! overwritten. The keys that page held must come back unavailable (the sender retries later),
//! never answer as new: an index that said "not found" would apply those events a second time.
//! And records an edit by hand left unreadable: their own key fails, nothing beside it.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::store::EventStore;
use oncebox_core::{
    Clock, Event, ManualClock, ProcessError, Processed, Response, Retention, Unavailable,
};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::damage::damage_key_index;
use oncebox_testkit::{EPOCH, run};

use crate::harness::{ingest, shop};

const KEYS: usize = 20;

fn event(i: usize) -> Event {
    shop(&format!("evt-{i}"), r#"{"n":1}"#)
}

#[test]
fn a_damaged_key_index_answers_unavailable_never_new() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        for i in 0..KEYS {
            let applied = inbox
                .process(event(i), |_| Ok(Response::completed("done")))
                .await;
            assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
        }
        // The last close copies the log into the file and removes it: the index is in the file.
        drop(inbox);
        assert!(!dir.path().join("o.db-wal").exists());
        let check = damage_key_index(&path);
        assert_ne!(check, "ok", "the damage is there");

        // The damage is found on use, not at open (which reads no index page); a store that
        // refused the file at open instead would do as well, and this test would change then.
        let inbox = Inbox::open(Options::new(&path)).expect("opens; the damage is found on use");
        for i in 0..KEYS {
            let processed = inbox
                .process(event(i), |_| Ok(Response::completed("again")))
                .await;
            assert!(
                matches!(
                    processed,
                    Err(ProcessError::Unavailable(Unavailable::Storage(_)))
                ),
                "evt-{i} through process: {processed:?}"
            );
            // The gateway's path, with its reads of committed keys beside the writer.
            let ingested = inbox.ingest(ingest(event(i))).await;
            assert!(
                matches!(
                    ingested,
                    Err(ProcessError::Unavailable(Unavailable::Storage(_)))
                ),
                "evt-{i} through ingest: {ingested:?}"
            );
        }
        drop(inbox);
        // Counted from the table itself: the damaged index cannot count.
        let records: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM oncebox_inbox NOT INDEXED", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(records, KEYS as i64, "no record was added or lost");
    });
}

/// Records an edit by hand left unlike what oncebox writes (SQLite keeps any type in any
/// column): a response written as text still replays as its bytes; a fingerprint of another
/// type answers that key unavailable, through either path, without failing the batch it was in
/// (which would have answered every event beside it unavailable, each time the sender retried).
#[test]
fn a_record_an_edit_left_unreadable_fails_its_own_key_not_its_batch() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        for id in ["evt-text", "evt-real"] {
            let applied = inbox
                .process(shop(id, r#"{"n":1}"#), |_| Ok(Response::completed("done")))
                .await;
            assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
        }
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch(
            "UPDATE oncebox_inbox SET response = 'by hand' WHERE event_id = 'evt-text';
             UPDATE oncebox_inbox SET fingerprint = 1.5 WHERE event_id = 'evt-real';",
        )
        .unwrap();
        let replayed = inbox
            .process(shop("evt-text", r#"{"n":1}"#), |_| {
                Ok(Response::completed("again"))
            })
            .await;
        assert!(
            matches!(&replayed, Ok(Processed::Duplicate(r)) if r.body == b"by hand"),
            "{replayed:?}"
        );
        let processed = inbox
            .process(shop("evt-real", r#"{"n":1}"#), |_| {
                Ok(Response::completed("again"))
            })
            .await;
        let ingested = inbox.ingest(ingest(shop("evt-real", r#"{"n":1}"#))).await;
        for answer in [processed, ingested] {
            assert!(
                matches!(
                    &answer,
                    Err(ProcessError::Unavailable(Unavailable::Storage(why)))
                        if why.contains("shop:evt-real") && why.contains("no longer reads")
                ),
                "{answer:?}"
            );
        }
        assert_eq!(inbox.stats().failed_batches(), 0, "no batch failed for it");
    });
}

/// A record an edit left with a value of another type than oncebox writes is passed over by
/// the purge, kept: read strictly, it failed every purge (and its batch-mates' ingest, 503),
/// and no purge ever got past it.
#[test]
fn a_record_an_edit_left_unreadable_is_kept_by_the_purge_and_the_rest_purged() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let clock = ManualClock::new(EPOCH);
        let options = Options::new(&path).clock(Arc::new(clock.clone()));
        let inbox = Inbox::open(options).unwrap();
        let retention = Retention::new(Duration::from_secs(3600));
        assert_eq!(inbox.purge(clock.now(), &retention).await.unwrap(), 0);
        for id in ["evt-edited", "evt-old"] {
            let applied = inbox
                .process(shop(id, r#"{"n":1}"#), |_| Ok(Response::completed("done")))
                .await;
            assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
        }
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "UPDATE oncebox_inbox SET received_at = 'x' WHERE event_id = 'evt-edited'",
            )
            .unwrap();
        clock.advance(Duration::from_secs(2 * 3600));
        let purged = inbox.purge(clock.now(), &retention).await;
        assert_eq!(purged.expect("the purge passes over it"), 1);
        let kept = |id: &str| {
            Connection::open(&path)
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM oncebox_inbox WHERE event_id = ?1",
                    [id],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap()
        };
        assert_eq!((kept("evt-edited"), kept("evt-old")), (1, 0));
        assert_eq!(inbox.stats().failed_batches(), 0, "no batch failed for it");
    });
}
