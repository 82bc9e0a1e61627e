//! How single messages are settled when things go wrong around them: a poison message carrying
//! JetStream's own headers is still quarantined.

use async_nats::HeaderMap;
use oncebox_nats::Consumer;
use oncebox_testkit::{run, service_url};

use crate::support::{World, start};

#[test]
fn poison_with_jetstream_headers_is_quarantined_without_them() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        // No key: poison. The header holds for the stream it was published to; kept on the
        // copy, the quarantine stream would refuse the copy, and the message would be requeued
        // forever.
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Stream", w.stream.as_str());
        headers.insert("Nats-Msg-Id", "msg_1");
        w.publish_with(headers, r#"{"amount":1}"#).await;

        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        w.wait(&mut consumer, |c| c.quarantined >= 1).await;
        w.wait_all_acked().await;
        let done = consumer.stop().await;

        assert_eq!(w.quarantined().await, ["event-id-missing"]);
        let q = w.js.get_stream(&w.quarantine_stream).await.unwrap();
        let copy = q.get_raw_message(1).await.unwrap().headers;
        let header = |name: &str| copy.get(name).map(ToString::to_string);
        assert_eq!(header("Nats-Expected-Stream"), None);
        assert_eq!(header("Nats-Msg-Id"), None);
        assert_eq!(
            header("Oncebox-Original-Nats-Expected-Stream").as_deref(),
            Some(w.stream.as_str())
        );
        assert_eq!(
            header("Oncebox-Original-Nats-Msg-Id").as_deref(),
            Some("msg_1")
        );
        eprintln!(
            "nats poison with Nats-Expected-Stream: quarantined {} (requeued {} on the way)",
            done.quarantined, done.requeued
        );
        assert_eq!((done.quarantined, done.requeued), (1, 0));
        w.cleanup().await;
    });
}
