//! Events longer than the store keeps (SQLite's `SQLITE_LIMIT_LENGTH` on the writer): refused
//! as `Invalid::TooLarge` before they reach the writer. Let through, SQLite's "string or blob
//! too big" failed the batch: `Unavailable` for the event on every retry, forever, and for
//! every event batched with it.

use oncebox_core::store::EventStore;
use oncebox_core::{Event, FingerprintMode, Invalid, Key, ProcessError, Processed, Response};
use oncebox_sqlite::{Inbox, Options, Tx};
use oncebox_testkit::run;
use oncebox_testkit::writer::{hold_writer, queued};

use crate::harness::ingest;

/// SQLite's own limit, which `Options` can only lower.
const BUILT: usize = 1_000_000_000;

/// What the store counts beside an inbox record's key and payload (`inbox/size.rs`).
const ROW_OVERHEAD: usize = 256;

/// An event of `payload_len` bytes, none of them read: the fingerprint is taken over a stand-in
/// (hashing a gigabyte would only slow the test), and zeroed memory is never touched.
fn event_of(id: &str, payload_len: usize) -> Event {
    let key = Key::parse("shop", id).unwrap();
    let mut event = Event::new(key, b"x".to_vec(), &FingerprintMode::Raw).unwrap();
    event.payload = vec![0; payload_len];
    event
}

fn ok(tx: &mut Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    let _ = tx;
    Ok(Response::completed("done"))
}

fn too_large(out: &Result<impl std::fmt::Debug, ProcessError>) -> (usize, usize) {
    match out {
        Err(ProcessError::Invalid(Invalid::TooLarge { size, limit })) => (*size, *limit),
        other => panic!("refused as too large: {other:?}"),
    }
}

/// With SQLite's real limit: every way in refuses a gigabyte event at once, while the writer
/// is busy, so it never joins a batch.
#[test]
fn an_event_longer_than_sqlite_stores_is_refused_before_the_writer() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        let gate = hold_writer(&inbox).await;
        let (size, limit) = too_large(&inbox.process(event_of("big", BUILT), ok).await);
        assert_eq!(limit, BUILT);
        assert!(size > BUILT, "{size}");
        too_large(
            &inbox
                .begin(event_of("big", BUILT), std::time::Duration::from_secs(30))
                .await,
        );
        too_large(&inbox.ingest(ingest(event_of("big", BUILT))).await);
        let blocking = inbox.clone();
        let out = tokio::task::spawn_blocking(move || {
            blocking.process_blocking(event_of("big", BUILT), ok)
        })
        .await
        .unwrap();
        too_large(&out);
        assert_eq!(inbox.queued(), 0, "none of them reached the writer");
        drop(gate);
        let out = inbox.process(event_of("small", 10), ok).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
    });
}

/// With a lowered limit: an event whose record takes the limit exactly is stored (the count is
/// no lower than what SQLite stores), one byte more is refused, naming both.
#[test]
fn the_limit_is_the_writers_and_an_event_at_it_is_stored() {
    run(async {
        const LIMIT: usize = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db")).length_limit(LIMIT)).unwrap();
        let fits = LIMIT - ROW_OVERHEAD - "shop".len() - "at".len();
        let out = inbox.process(event_of("at", fits), ok).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let over = inbox.process(event_of("by", fits + 1), ok).await;
        assert_eq!(too_large(&over), (LIMIT + 1, LIMIT));
        // One SQLite itself refuses ("string or blob too big"), which failed its batch.
        let (size, _) = too_large(&inbox.process(event_of("far", LIMIT + 1), ok).await);
        assert!(size > LIMIT + 1, "{size}");
    });
}

/// A handler whose response, stored with its event, is longer than the store keeps fails as
/// `Handler`, nothing of it kept; the event batched with it commits.
#[test]
fn a_response_longer_than_the_store_keeps_fails_its_handler_alone() {
    run(async {
        const LIMIT: usize = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db")).length_limit(LIMIT)).unwrap();
        let failed = inbox.stats().failed_batches();
        let gate = hold_writer(&inbox).await;
        let long = tokio::spawn({
            let inbox = inbox.clone();
            async move {
                inbox
                    .process(event_of("long", 10), |_| {
                        Ok(Response::completed(vec![b'x'; LIMIT]))
                    })
                    .await
            }
        });
        queued(&inbox, 1).await;
        let beside = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.process(event_of("beside", 10), ok).await }
        });
        queued(&inbox, 2).await;
        gate.send(()).unwrap();
        let out = long.await.unwrap();
        assert!(matches!(out, Err(ProcessError::Handler(_))), "{out:?}");
        let out = beside.await.unwrap();
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(inbox.stats().failed_batches(), failed);
        let record = inbox.record(&event_of("long", 10).key).await.unwrap();
        assert!(record.is_none(), "the key is free: {record:?}");
    });
}

/// The gateway's record also keeps its answer, which repeats a long event id: an event whose
/// record fits only without that answer is refused too, and never fails its batch.
#[test]
fn a_gateway_record_counts_the_answer_it_keeps() {
    run(async {
        const LIMIT: usize = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db")).length_limit(LIMIT)).unwrap();
        let failed = inbox.stats().failed_batches();
        let id = "i".repeat(200);
        let fits = LIMIT - ROW_OVERHEAD - "shop".len() - id.len();
        let mut answered = ingest(event_of(&id, fits));
        answered.accepted = format!(r#"{{"event_id":"{id}","status":"accepted"}}"#).into_bytes();
        let answer = answered.accepted.len();
        let (size, limit) = too_large(&inbox.ingest(answered).await);
        assert_eq!((size, limit), (LIMIT + answer, LIMIT));
        assert_eq!(inbox.stats().failed_batches(), failed, "no batch failed");
        // Short of its answer's length, it is stored.
        let mut stored = ingest(event_of(&id, fits - answer));
        stored.accepted = format!(r#"{{"event_id":"{id}","status":"accepted"}}"#).into_bytes();
        let out = inbox.ingest(stored).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(inbox.stats().failed_batches(), failed);
    });
}

/// The two-phase form: a `complete` whose response the store cannot keep is refused alone
/// (`TooLarge`), its batch-mate applied, no batch failed, and the lease still the holder's,
/// which completes with a shorter response. Before, its error failed the batch on every retry
/// until the lease lapsed.
#[test]
fn a_complete_with_a_response_longer_than_the_store_keeps_is_refused_alone() {
    run(async {
        const LIMIT: usize = 64 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db")).length_limit(LIMIT)).unwrap();
        let begun = inbox
            .begin(event_of("long", 10), std::time::Duration::from_secs(60))
            .await
            .unwrap();
        let oncebox_core::Begun::Leased(lease) = begun else {
            panic!("a new key is leased: {begun:?}");
        };
        let failed = inbox.stats().failed_batches();
        let gate = hold_writer(&inbox).await;
        let long = tokio::spawn({
            let (inbox, lease) = (inbox.clone(), lease.clone());
            async move {
                let response = Response::completed(vec![b'x'; LIMIT]);
                inbox.complete(&lease, response).await
            }
        });
        queued(&inbox, 1).await;
        let beside = tokio::spawn({
            let inbox = inbox.clone();
            async move { inbox.process(event_of("beside", 10), ok).await }
        });
        queued(&inbox, 2).await;
        gate.send(()).unwrap();
        let out = long.await.unwrap();
        assert!(
            matches!(out, Err(oncebox_core::LeaseError::TooLarge(_))),
            "{out:?}"
        );
        let out = beside.await.unwrap();
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert_eq!(inbox.stats().failed_batches(), failed);
        inbox
            .complete(&lease, Response::completed("short"))
            .await
            .unwrap();
    });
}
