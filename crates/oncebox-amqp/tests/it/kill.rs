//! A consumer process SIGKILLed between the store's commit and the broker ack: the broker
//! redelivers the message, and the next consumer acknowledges it as a duplicate; one effect.

use std::sync::atomic::Ordering;

use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_core::consume::{KeyRule, MessageRules};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::consume::{SOURCE, effect, run_child_to_its_crash};
use oncebox_testkit::{run, service_url};

use crate::support::{World, connect, start};

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
            w.db.path().display()
        );
        run_child_to_its_crash("kill::amqp_child_process", CHILD, spec).await;
        assert_eq!(w.db.effects("evt_kill"), 1, "committed before the kill");
        // The dead consumer's connection is gone: the broker put the message back.
        w.wait_ready(&w.queue, 1).await;

        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        consumer.wait(|c| c.acked >= 1, w.state()).await;
        let done = consumer.stop().await;
        w.wait_ready(&w.queue, 0).await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_kill"], falses);
        eprintln!(
            "amqp killed between commit and ack: D={d} L={l} F={f} (child killed by signal 9; redelivery acked as duplicate {}, applied again {})",
            done.duplicates, done.applied
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.duplicates, done.applied), (1, 0));
        w.cleanup().await;
    });
}
