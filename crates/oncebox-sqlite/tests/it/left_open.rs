//! A read through `Inbox::read` that began a transaction and returned without ending it (an
//! early `?`): its pooled connection went back on that snapshot, and every later read on it
//! missed what was committed since.

use oncebox_core::store::EventStore;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::harness::{self, shop};

fn count(inbox: &Inbox) -> i64 {
    inbox
        .read_blocking(|c| c.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0)))
        .unwrap()
}

#[test]
fn a_read_left_in_a_transaction_does_not_keep_its_connection_on_that_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        let left_open = inbox.read_blocking(|c| {
            c.execute_batch("BEGIN")?;
            c.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| {
                r.get::<_, i64>(0)
            })
        });
        assert_eq!(left_open.unwrap(), 0);
        let done = inbox.ingest(harness::ingest(shop("evt-1", "{}"))).await;
        assert!(done.is_ok_and(|d| d.is_applied()));
        assert_eq!(count(&inbox), 1, "the read sees the commit");
    });
}
