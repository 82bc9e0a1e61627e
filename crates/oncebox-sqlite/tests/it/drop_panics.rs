//! A value of the caller's own dropped on the writer thread (a handler never run because its
//! key was a duplicate, and what it captured) whose `Drop` panics. Before, the panic ended
//! the writer after the batch committed: the batch-mates still to be told read `Closed`, a
//! reader then stood in with their own commit and answered `Duplicate` for a handler that ran,
//! and every later request of the process was `Closed`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use oncebox_core::{Processed, Response};
use oncebox_sqlite::{Inbox, Options, Tx};
use oncebox_testkit::child::until_async;
use oncebox_testkit::run;

use crate::harness::shop;

/// Panics when dropped, as a value of the caller's own may.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a caller's value panics in its drop");
    }
}

fn ok(_: &mut Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    Ok(Response::completed("ok"))
}

#[test]
fn a_panicking_drop_on_the_writer_ends_neither_it_nor_a_batch_mates_answer() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox =
            Inbox::open(Options::new(dir.path().join("o.db")).deadline(Duration::from_secs(30)))
                .expect("open");
        let first = inbox.process(shop("paid", "{}"), ok).await;
        assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");

        // The writer held on a request of its own until both below are queued, so that they
        // make one batch: the duplicate, whose unrun handler holds the bomb, and a new key.
        let (release, held) = mpsc::channel::<()>();
        let started = Arc::new(AtomicBool::new(false));
        let (holding, starting) = (inbox.clone(), started.clone());
        let hold = tokio::spawn(async move {
            holding
                .write(move |_| {
                    starting.store(true, Ordering::SeqCst);
                    let _ = held.recv();
                    Ok(())
                })
                .await
        });
        until_async("the writer holds", Duration::from_secs(10), || {
            started.load(Ordering::SeqCst)
        })
        .await;
        let bomb = Bomb;
        let (a, b) = (inbox.clone(), inbox.clone());
        let both = tokio::spawn(async move {
            let duplicate = a.process(shop("paid", "{}"), move |tx: &mut Tx<'_>| {
                let _keep = &bomb;
                ok(tx)
            });
            tokio::join!(duplicate, b.process(shop("shipped", "{}"), ok))
        });
        until_async("both requests queued", Duration::from_secs(10), || {
            inbox.queued() == 2
        })
        .await;
        release.send(()).unwrap();
        hold.await.unwrap().expect("the holding write");
        let (duplicate, fresh) = both.await.unwrap();
        assert!(
            matches!(duplicate, Ok(Processed::Duplicate(_))),
            "{duplicate:?}"
        );
        // Its own handler ran and committed: never read as another's.
        assert!(matches!(fresh, Ok(Processed::Applied(_))), "{fresh:?}");

        let later = inbox.process(shop("refunded", "{}"), ok).await;
        assert!(
            matches!(later, Ok(Processed::Applied(_))),
            "the writer still serves: {later:?}"
        );
    });
}
