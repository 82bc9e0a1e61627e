//! A consumer process SIGKILLed between the store's commit and the broker ack: the broker
//! redelivers the message, and the next consumer acknowledges it as a duplicate; one effect.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_core::Key;
use oncebox_core::consume::{KeyRule, MessageRules};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::{run, service_url};

use crate::support::{SOURCE, World, connect, effect, effects_of, start};

const CHILD: &str = "ONCEBOX_AMQP_CHILD";

/// The child's side: `ONCEBOX_AMQP_CHILD=<url>|<queue>|<quarantine exchange>|<db path>`. It
/// consumes with the crash point armed and dies at the first ack; the parent runs it with
/// `--include-ignored`.
#[test]
#[ignore = "entry point of the kill test's child process"]
fn amqp_child_process() {
    let spec = std::env::var(CHILD).expect("run by the kill test");
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, queue, quarantine, path] = parts[..] else {
        panic!("bad {CHILD}: {spec}");
    };
    fail::cfg("amqp-before-ack", "return").expect("arm crash point");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let inbox = Inbox::open(Options::new(path)).unwrap();
        let rules = MessageRules::new(
            oncebox_core::Source::new(SOURCE).unwrap(),
            KeyRule::MessageId,
        );
        let handler = InboxHandler::new(inbox, effect);
        let consumer = Consumer::new(handler, ConsumerOptions::new(queue, rules, quarantine));
        let conn = connect(url).await;
        let _ = consumer.run(&conn, std::future::pending()).await;
    });
    unreachable!("the crash point kills the process at the first ack");
}

#[test]
fn consumer_killed_between_commit_and_ack_is_redelivered_and_acked_as_duplicate() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_kill"), r#"{"amount":9}"#).await;
        let spec = format!(
            "{url}|{}|{}|{}",
            w.queue,
            w.quarantine_exchange,
            w.db_path().display()
        );
        let status = tokio::task::spawn_blocking(move || {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "kill::amqp_child_process",
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, spec)
                .status()
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "the consumer died by SIGKILL at the crash point"
        );
        let key = Key::parse(SOURCE, "evt_kill").unwrap();
        assert_eq!(effects_of(&w.inbox, &key), 1, "committed before the kill");
        // The dead consumer's connection is gone: the broker put the message back.
        w.wait_ready(&w.queue, 1).await;

        let apply = w.checked();
        let consumer = Arc::new(Consumer::new(apply.clone(), w.options()));
        let mut counts = consumer.counts();
        let (stop, task) = start(&url, consumer.clone());
        counts.wait_for(|c| c.acked >= 1).await.unwrap();
        let _ = stop.send(());
        task.await.unwrap().unwrap();
        let done = *consumer.counts().borrow();
        w.wait_ready(&w.queue, 0).await;

        let (d, l, f) = w.figures(&["evt_kill"], apply.false_duplicates.load(Ordering::SeqCst));
        eprintln!(
            "amqp killed between commit and ack: D={d} L={l} F={f} (child killed by signal 9; redelivery acked as duplicate {}, applied again {})",
            done.duplicates, done.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.duplicates, done.applied), (1, 0));
        w.cleanup().await;
    });
}
