//! A storage failure (a full disk, which ends SQLite's transaction; a write refused, which
//! fails its statement alone) that a handler wrapped in its own error, bare or with context:
//! answered `Unavailable`, as its bare `Sql` error is, not as the event's own failure. A
//! broker consumer counted that toward quarantining a valid message during the outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use oncebox_core::{ProcessError, Response};
use oncebox_sqlite::rusqlite::ErrorCode;
use oncebox_sqlite::{HandlerError, Inbox, Options};
use oncebox_testkit::run;
use oncebox_testkit::wrapped::WithContext;

use crate::harness::shop;

#[test]
fn a_storage_failure_a_handler_wrapped_is_unavailable_not_its_failure() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        inbox
            .write(|c| c.execute_batch("CREATE TABLE receipts (body BLOB)"))
            .await
            .unwrap();
        // Room for the records, not for a megabyte.
        inbox
            .write(|c| {
                let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                c.pragma_update(None, "max_page_count", pages + 32)
            })
            .await
            .unwrap();
        // A full disk ends SQLite's transaction; a write refused (`query_only`, read-only
        // storage) fails the statement alone. Either way the storage's.
        let met = Arc::new(AtomicUsize::new(0));
        for (refused, context) in [(false, false), (false, true), (true, false), (true, true)] {
            let saw = met.clone();
            let id = format!("evt-{refused}-{context}");
            let out = inbox
                .process(shop(&id, "{}"), move |tx| {
                    let body = vec![0u8; 1 << 20];
                    if refused {
                        tx.conn().pragma_update(None, "query_only", true)?;
                    }
                    let stored = tx
                        .conn()
                        .execute("INSERT INTO receipts VALUES (?1)", [&body]);
                    if refused {
                        tx.conn().pragma_update(None, "query_only", false)?;
                    }
                    if let Err(e) = stored {
                        let expected = if refused {
                            ErrorCode::ReadOnly
                        } else {
                            ErrorCode::DiskFull
                        };
                        if e.sqlite_error_code() == Some(expected) {
                            saw.fetch_add(1, Ordering::SeqCst);
                        }
                        return Err(if context {
                            HandlerError::failed(WithContext(e))
                        } else {
                            HandlerError::failed(e)
                        });
                    }
                    Ok(Response::completed("stored"))
                })
                .await;
            assert!(
                matches!(out, Err(ProcessError::Unavailable(_))),
                "refused {refused}, context {context}: {out:?}"
            );
        }
        assert_eq!(
            met.load(Ordering::SeqCst),
            4,
            "the handler's own write met the storage's refusal"
        );
    });
}
