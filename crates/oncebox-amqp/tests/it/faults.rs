//! Faults around the consumer: the database unavailable (another connection holds SQLite's
//! write lock), and processing that outlasts the broker's patience so the message is delivered
//! to a second consumer while the first is still applying it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_amqp::{Consumer, InboxHandler};
use oncebox_core::{Event, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Options, Tx};
use oncebox_testkit::{run, service_url};
use tokio::sync::mpsc;

use crate::support::{Checked, World, effect, start};

const OUTAGE_MESSAGES: usize = 20;

#[test]
fn database_unavailable_acks_nothing_and_applies_everything_after_recovery() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
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
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        // Every message tried at least twice while the database refuses writes.
        let during = *counts
            .wait_for(|c| c.requeued >= 2 * OUTAGE_MESSAGES as u64)
            .await
            .unwrap();
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        assert_eq!(during.acked, 0, "nothing acknowledged during the outage");
        // Nothing was acknowledged: once the consumer let go, the queue holds every message.
        w.wait_ready(&w.queue, OUTAGE_MESSAGES as u32).await;

        locker.execute_batch("ROLLBACK").unwrap();
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        counts
            .wait_for(|c| c.acked >= OUTAGE_MESSAGES as u64)
            .await
            .unwrap();
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let after = *consumer.counts().borrow();
        w.wait_ready(&w.queue, 0).await;

        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (d, l, f) = w.figures(&keys, apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "amqp database unavailable: D={d} L={l} F={f} (requeued {} and acked {} during the outage; applied {} after recovery)",
            during.requeued, during.acked, after.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!(after.applied, OUTAGE_MESSAGES as u64);
        w.cleanup().await;
    });
}

/// Gate of the slow handler: it reports that it started, then waits to be let go.
static GATE: std::sync::Mutex<
    Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
> = std::sync::Mutex::new(None);

fn slow_effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    if let Some((started, release)) = GATE.lock().unwrap().take() {
        let _ = started.send(());
        let _ = release.recv_timeout(Duration::from_secs(30));
    }
    effect(tx, event)
}

#[test]
fn processing_longer_than_the_brokers_patience_has_one_effect() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *GATE.lock().unwrap() = Some((started_tx, release_rx));
        w.publish(Some("evt_slow"), r#"{"amount":7}"#).await;

        // Consumer A takes the message and blocks inside its transaction.
        let slow = Checked {
            inner: InboxHandler::new(w.inbox.clone(), slow_effect as _),
            ..w.checked()
        };
        let a = Arc::new(Consumer::new(slow.clone(), w.options()));
        let a_conn = Arc::new(crate::support::connect(&url).await);
        let a_task = {
            let (a, a_conn) = (a.clone(), a_conn.clone());
            tokio::spawn(async move { a.run(&a_conn, std::future::pending()).await })
        };
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();

        // Consumer B on another connection, then the broker gives up on A. RabbitMQ 3.10 has
        // only the server-wide `consumer_timeout` (30 minutes by default); when it passes the
        // broker closes A's channel and requeues the message. Closing A's connection does the
        // same to the message here, without touching the broker's settings.
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let b_apply = Checked {
            seen: Some(seen_tx),
            ..w.checked()
        };
        let b = Arc::new(Consumer::new(b_apply.clone(), w.options()));
        let mut b_counts = b.counts();
        let (b_stop, b_task) = start(&url, b.clone());
        a_conn
            .close(320, "the broker gave up on this consumer".into())
            .await
            .unwrap();
        // B holds the redelivered message while A is still inside its transaction.
        let redelivered = seen.recv().await.unwrap();
        assert_eq!(redelivered.event_id.as_str(), "evt_slow");
        release.send(()).unwrap();

        b_counts.wait_for(|c| c.acked >= 1).await.unwrap();
        let a_result = a_task.await.unwrap();
        let a_done = *a.counts().borrow();
        let _ = b_stop.send(());
        b_task.await.unwrap().unwrap();
        let b_done = *b.counts().borrow();
        w.wait_ready(&w.queue, 0).await;

        let falses = slow.false_duplicates.load(Ordering::SeqCst)
            + b_apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.figures(&["evt_slow"], falses);
        eprintln!(
            "amqp processing past the broker's patience: D={d} L={l} F={f} (A applied {} with its ack refused {}, B acked the redelivery as duplicate {}; A ended with {a_result:?})",
            a_done.applied, a_done.ack_failures, b_done.duplicates
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((a_done.applied, a_done.acked), (1, 0));
        assert_eq!((b_done.duplicates, b_done.applied), (1, 0));
        w.cleanup().await;
    });
}
