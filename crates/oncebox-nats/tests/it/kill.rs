//! A consumer process SIGKILLed between the store's commit and the ack: the server delivers
//! the message again after the ack wait, and the next consumer acknowledges it as a duplicate;
//! one effect.

use std::sync::atomic::Ordering;
use std::time::Duration;

use oncebox_core::consume::{KeyRule, MessageRules};
use oncebox_nats::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::consume::{SOURCE, effect, run_child_to_its_crash};
use oncebox_testkit::{run, service_url};

use crate::support::{KEY_HEADER, World, connect, start};

const CHILD: &str = "ONCEBOX_NATS_CHILD";

/// The child's side: `ONCEBOX_NATS_CHILD=<url>|<stream>|<durable>|<quarantine>|<db path>`. It
/// consumes with the crash point armed and dies at the first ack; the parent runs it with
/// `--include-ignored`.
#[test]
#[ignore = "entry point of the kill test's child process"]
fn nats_child_process() {
    let spec = std::env::var(CHILD).expect("run by the kill test");
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, stream, durable, quarantine, path] = parts[..] else {
        panic!("bad {CHILD}: {spec}");
    };
    fail::cfg("nats-before-ack", "return").expect("arm crash point");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let inbox = Inbox::open(Options::new(path)).unwrap();
        let rules = MessageRules::new(
            oncebox_core::Source::new(SOURCE).unwrap(),
            KeyRule::Header(KEY_HEADER.into()),
        );
        let mut options = ConsumerOptions::new(stream, durable, rules, quarantine);
        options.ack_wait = Duration::from_secs(1);
        let consumer = Consumer::new(InboxHandler::new(inbox, effect), options);
        let js = connect(url).await;
        let _ = consumer.run(&js, std::future::pending()).await;
    });
    unreachable!("the crash point kills the process at the first ack");
}

#[test]
fn consumer_killed_between_commit_and_ack_is_redelivered_and_acked_as_duplicate() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_kill"), r#"{"amount":9}"#).await;
        let spec = format!(
            "{url}|{}|{}|{}|{}",
            w.stream,
            w.durable,
            w.quarantine_subject,
            w.db.path().display()
        );
        run_child_to_its_crash("kill::nats_child_process", CHILD, spec).await;
        assert_eq!(w.db.effects("evt_kill"), 1, "committed before the kill");
        let info = w.consumer_info().await;
        assert_eq!(
            (info.ack_floor.stream_sequence, info.num_ack_pending),
            (0, 1),
            "delivered, never acknowledged"
        );

        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), w.options()));
        w.wait(&mut consumer, |c| c.acked >= 1).await;
        let info = w.wait_all_acked().await;
        let done = consumer.stop().await;

        let falses = apply.false_duplicates.load(Ordering::SeqCst);
        let (d, l, f) = w.db.figures(&["evt_kill"], falses);
        eprintln!(
            "nats killed between commit and ack: D={d} L={l} F={f} (child killed by signal 9; redelivery acked as duplicate {}, applied again {}, server deliveries {})",
            done.duplicates, done.applied, info.delivered.consumer_sequence
        );
        assert_eq!((d, l, f), (0, 0, 0));
        assert_eq!((done.duplicates, done.applied), (1, 0));
        w.cleanup().await;
    });
}
