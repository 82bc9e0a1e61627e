//! A SQLite store's writer held busy by a test: requests queue behind the holder until the
//! test lets it go, so a test can line them up (a claim under way, a batch of several).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use oncebox_sqlite::Inbox;

/// Occupies `inbox`'s writer until the returned sender is dropped or sent to.
pub async fn hold_writer(inbox: &Inbox) -> mpsc::Sender<()> {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (gate_tx, gate_rx) = mpsc::channel::<()>();
    let held = inbox.clone();
    tokio::spawn(async move {
        let _ = held
            .write(move |_| {
                let _ = entered_tx.send(());
                let _ = gate_rx.recv();
                Ok(())
            })
            .await;
    });
    entered_rx.await.expect("the writer runs the holder");
    gate_tx
}

/// Until `n` requests wait in the writer's queue (polled, with a deadline).
pub async fn queued(inbox: &Inbox, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while inbox.queued() < n {
        assert!(Instant::now() < until, "{} queued, not {n}", inbox.queued());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
