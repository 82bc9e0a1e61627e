//! Faults around the consumer: the database unavailable (another connection holds SQLite's
//! write lock), and processing that outlasts the ack wait, so the server delivers the message
//! again while the first delivery is still being applied.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_core::{Event, Response};
use oncebox_nats::{Consumer, InboxHandler};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Options, Tx};
use oncebox_testkit::{run, service_url};
use tokio::sync::mpsc;

use crate::support::{Checked, World, effect, start};

const OUTAGE_MESSAGES: usize = 20;

#[test]
fn database_unavailable_acks_nothing_and_applies_everything_after_recovery() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        // A short busy timeout: each attempt gives up quickly while the lock is held.
        let w = World::with_options(&url, |p| {
            Options::new(p).busy_timeout(Duration::from_millis(20))
        })
        .await;
        let ids: Vec<String> = (0..OUTAGE_MESSAGES)
            .map(|i| format!("evt_out_{i}"))
            .collect();
        for id in &ids {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        let locker = Connection::open(w.db_path()).unwrap();
        locker.execute_batch("BEGIN EXCLUSIVE").unwrap();

        let apply = w.checked();
        // Messages pulled but not started when the first consumer stops come back after this.
        let mut options = w.options();
        options.ack_wait = Duration::from_secs(1);
        let consumer = Arc::new(Consumer::new(apply.clone(), options));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        // Every message tried at least twice while the database refuses writes.
        let during = w
            .wait_counts(&mut counts, |c| c.requeued >= 2 * OUTAGE_MESSAGES as u64)
            .await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let info = w.consumer_info().await;
        assert_eq!(during.acked, 0, "nothing acknowledged during the outage");
        // The server agrees: its ack floor never moved. (Its pending counts may count a message
        // being redelivered twice, so they are no proof.) The proof that nothing was acked is
        // below: an acknowledged message is never delivered again, yet after recovery every
        // one of them is delivered and applied.
        assert_eq!(info.ack_floor.stream_sequence, 0);

        locker.execute_batch("ROLLBACK").unwrap();
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        w.wait_counts(&mut counts, |c| c.applied >= OUTAGE_MESSAGES as u64)
            .await;
        w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let after = *consumer.counts().borrow();

        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (d, l, f) = w.figures(&keys, apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "nats database unavailable: D={d} L={l} F={f} (requeued {} and acked {} during the outage, server ack floor 0; applied {} after recovery)",
            during.requeued, during.acked, after.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}

/// Gate of the slow handler: it reports that it started, then waits to be let go.
type Gate = (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);
static GATE: std::sync::Mutex<Option<Gate>> = std::sync::Mutex::new(None);

fn slow_effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    if let Some((started, release)) = GATE.lock().unwrap().take() {
        let _ = started.send(());
        let _ = release.recv_timeout(Duration::from_secs(30));
    }
    effect(tx, event)
}

#[test]
fn processing_longer_than_the_ack_wait_has_one_effect() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *GATE.lock().unwrap() = Some((started_tx, release_rx));
        w.publish(Some("evt_slow"), r#"{"amount":7}"#).await;

        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let apply = Checked {
            inner: InboxHandler::new(w.inbox.clone(), slow_effect as _),
            seen: Some(seen_tx),
            ..w.checked()
        };
        let mut options = w.options();
        options.ack_wait = Duration::from_millis(500);
        let consumer = Arc::new(Consumer::new(apply.clone(), options));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();
        // The first delivery is inside its transaction; the ack wait passes and the server
        // delivers the message again, to the same consumer, while the first is still running.
        assert_eq!(seen.recv().await.unwrap().event_id.as_str(), "evt_slow");
        assert_eq!(seen.recv().await.unwrap().event_id.as_str(), "evt_slow");
        release.send(()).unwrap();

        w.wait_counts(&mut counts, |c| {
            c.applied == 1 && c.duplicates >= 1 && c.acked == c.applied + c.duplicates
        })
        .await;
        let info = w.wait_all_acked().await;
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let done = *consumer.counts().borrow();

        let (d, l, f) = w.figures(&["evt_slow"], apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "nats processing past the ack wait: D={d} L={l} F={f} (deliveries {}, applied {}, acked as duplicate {}, server deliveries {})",
            apply.calls.load(Ordering::SeqCst),
            done.applied,
            done.duplicates,
            info.delivered.consumer_sequence
        );
        assert_eq!((d, l, f), (0, 0, 0));
        w.cleanup().await;
    });
}
