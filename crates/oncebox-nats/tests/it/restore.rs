//! A stream restored from a snapshot older than the inbox winds its sequence back and keeps its
//! creation time, and so the watermark's name: started on it, a consumer would record every
//! message published since, up to the watermark, stale and acknowledge it unapplied. It refuses
//! to start instead. Staged by moving the watermark past the stream's last sequence, which is
//! what such a restore leaves: the server's snapshot and restore are not the test's to run.

use oncebox_nats::{ConsumeError, Consumer};
use oncebox_testkit::{run, service_url};

use crate::support::{World, connect, start};

#[test]
fn a_watermark_above_the_streams_last_sequence_refuses_the_start() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        w.publish(Some("evt_r1"), r#"{"amount":1}"#).await;
        let mut options = w.options();
        options.watermark = true;
        let apply = w.db.checked();
        let mut consumer = start(&url, Consumer::new(apply.clone(), options.clone()));
        w.wait(&mut consumer, |c| c.applied >= 1 && c.acked >= 1)
            .await;
        consumer.stop().await;

        let stream = w.js.get_stream(&w.stream).await.unwrap();
        let created = stream.cached_info().created.unix_timestamp_nanos();
        let name = format!("nats:{}:{}:{created}", w.stream, w.durable);
        let inbox = &w.db.inbox;
        assert_eq!(inbox.offset(&name, 0).await.unwrap(), Some(1), "{name}");
        // A stream at its own watermark starts.
        let js = connect(&url).await;
        let at_watermark = Consumer::new(apply.clone(), options.clone());
        at_watermark.run(&js, async {}).await.unwrap();

        // The restore: the inbox applied up to 5, the stream knows 1.
        let _ = inbox.move_offset(&name, 0, 5).await.unwrap();
        let refused = Consumer::new(apply, options).run(&js, async {}).await;
        match refused {
            Err(ConsumeError::WoundBack {
                watermark: 5,
                last: 1,
                ..
            }) => {}
            other => panic!("started on a wound-back stream: {other:?}"),
        }
        w.cleanup().await;
    });
}
