//! The connection the quarantine publishes on closes under a running consumer (the broker node
//! it reached restarted, a middlebox reset it) while the reading connection stays up. Nothing
//! reopens a connection by itself: the consumer went on, every quarantine failed, and each
//! poison message went round the queue (on a quorum queue, towards its delivery limit) until
//! the reading side failed too. It now ends, the message back in the queue, so that its
//! caller connects both again.

use std::time::Duration;

use oncebox_amqp::{ConsumeError, Consumer};
use oncebox_core::consume::from_fn;
use oncebox_core::{Event, ProcessError, Processed, Response};
use oncebox_testkit::proxy::Mode;
use oncebox_testkit::{run, service_url};
use tokio::sync::oneshot;

use crate::blocked::proxied;
use crate::support::{World, connect};

/// A deadline for what takes milliseconds.
const PROMPT: Duration = Duration::from_secs(20);

#[test]
fn a_quarantine_connection_that_closed_ends_the_consumer_to_be_connected_again() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;
        // `ok` applies; anything else fails for good, to be quarantined at once.
        let apply = from_fn(|event: Event, _| async move {
            if event.key.event_id.as_str() == "ok" {
                Ok(Processed::Applied(Response::completed("done")))
            } else {
                Err(ProcessError::Handler("fails for good".into()))
            }
        });
        let mut options = w.options();
        options.retry.max_attempts = 1;
        let consumer = Consumer::new(apply, options);
        let mut counts = consumer.counts();
        let (consuming, publishing) = (connect(&url).await, connect(&via).await);
        let publishing_status = publishing.status().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let ended = consumer
                .run_apart(&consuming, &publishing, async {
                    let _ = stopped.await;
                })
                .await;
            (ended, consuming, publishing)
        });
        w.publish(Some("ok"), r#"{"amount":1}"#).await;
        tokio::time::timeout(PROMPT, counts.wait_for(|c| c.applied == 1))
            .await
            .expect("consuming")
            .unwrap();
        // The fault: the quarantine's connection is reset; the reading one is not.
        proxy.set(Mode::Reset);
        tokio::time::timeout(PROMPT, async {
            while publishing_status.connected() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the client saw its quarantine connection close");
        w.publish(Some("poison"), r#"{"amount":1}"#).await;
        let (ended, consuming, _publishing) = tokio::time::timeout(PROMPT, task)
            .await
            .expect("the consumer ended")
            .unwrap();
        assert!(
            matches!(ended, Err(ConsumeError::QuarantineClosed)),
            "{ended:?}"
        );
        assert!(consuming.status().connected(), "the reading side was up");
        drop(stop);
        // Not acknowledged, not quarantined: back in the queue for the consumer made again.
        w.wait_ready(&w.queue, 1).await;
        assert!(w.quarantined().await.is_empty());
        let _ = consuming.close(200, "done".into()).await;
        w.cleanup().await;
    });
}

/// A delivery's task that fails outside the handler's own catch (a bug; armed here with a
/// failpoint) left its message neither acknowledged nor rejected, holding a prefetch slot for
/// good: with `prefetch = 1` the broker sent nothing more and the consumer sat idle. The run
/// now ends, its channel closes, the message goes back to the queue, and the next run applies
/// it and the rest.
#[test]
fn a_failed_delivery_task_ends_the_run_and_its_message_comes_back() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        for id in ["evt_a", "evt_b"] {
            w.publish(Some(id), r#"{"amount":1}"#).await;
        }
        // Armed for this test's queue only: the tests of this process share the failpoint.
        fail::cfg("amqp-delivery-task", &format!("return({})", w.queue))
            .expect("arm the failpoint");
        let mut options = w.options();
        options.prefetch = 1;
        let conn = connect(&url).await;
        let first = Consumer::new(w.db.checked(), options.clone());
        let ended = tokio::time::timeout(PROMPT, first.run(&conn, std::future::pending()))
            .await
            .expect("the run ended");
        assert!(
            matches!(ended, Err(ConsumeError::TaskFailed(_))),
            "{ended:?}"
        );
        fail::remove("amqp-delivery-task");
        w.wait_ready(&w.queue, 2).await;
        let mut again = crate::support::start(&url, Consumer::new(w.db.checked(), options));
        again.wait(|c| c.applied >= 2, w.state()).await;
        let done = again.stop().await;
        assert_eq!(done.applied, 2);
        for id in ["evt_a", "evt_b"] {
            assert_eq!(w.db.effects(id), 1, "{id}");
        }
        let _ = conn.close(200, "done".into()).await;
        w.cleanup().await;
    });
}
