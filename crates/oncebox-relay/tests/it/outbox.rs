//! The library's own outbox through the relay: a message a handler queues with `Tx::enqueue`
//! is delivered to the route its destination names, once per key, and a handler that fails
//! after queueing, or queues what no header can carry, leaves nothing to deliver.

use oncebox_core::delivery::DeliveryState;
use oncebox_core::{Event, Key, OutboxMessage, ProcessError, Processed, Response};
use oncebox_sqlite::HandlerError;
use oncebox_testkit::run;

use crate::{World, receiver, route};

/// Processes `event_id`, whose handler queues the thank-you message of order o-7 to `hooks`,
/// then fails if `fail`.
async fn process(w: &World, event_id: &str, fail: bool) -> Result<Processed, ProcessError> {
    process_keyed(w, event_id, "thank-you:o-7", fail).await
}

/// As [`process`], the message under `message_key`.
async fn process_keyed(
    w: &World,
    event_id: &str,
    message_key: &'static str,
    fail: bool,
) -> Result<Processed, ProcessError> {
    let key = Key::parse("shop", event_id).unwrap();
    let event = Event::json(key, r#"{"order":"o-7"}"#).unwrap();
    w.inbox
        .process(event, move |tx| {
            let queued = tx.enqueue(&OutboxMessage::json(
                "hooks",
                message_key,
                r#"{"order":"o-7","template":"thank-you"}"#,
            ))?;
            assert_ne!(queued, oncebox_core::Enqueued::Conflict);
            if fail {
                return Err(HandlerError::failed("the mail template is missing"));
            }
            Ok(Response::completed("{}"))
        })
        .await
}

#[test]
fn a_message_queued_by_a_handler_is_delivered_once_under_its_own_key() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        // A failed handler's message is rolled back with its effect: nothing to deliver.
        assert!(process(&w, "evt-fails", true).await.is_err());
        let relay = w.relay(vec![route("hooks", addr, true)]);
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
        // Two events about one order queue one message: its key is the order's.
        for event_id in ["evt-paid-a", "evt-paid-b"] {
            assert!(matches!(
                process(&w, event_id, false).await,
                Ok(Processed::Applied(_))
            ));
        }
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1), "{out:?}");
        let seen = rx.requests();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].headers["idempotency-key"], "thank-you:o-7");
        assert_eq!(seen[0].body, br#"{"order":"o-7","template":"thank-you"}"#);
        assert_eq!(relay.run_once().await.unwrap().claimed, 0, "delivered once");
    });
}

#[test]
fn an_uncertain_message_is_reconciled_by_the_key_it_carried_not_its_events() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        assert!(matches!(
            process(&w, "evt-paid-a", false).await,
            Ok(Processed::Applied(_))
        ));
        // A receiver that does not honour keys, whose reply is lost: the message is uncertain.
        let mut plain = route("hooks", proxy, false);
        plain.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        let out = relay.run_once().await.unwrap();
        assert_eq!(*dropped.lock().unwrap(), 1, "the reply was really dropped");
        assert_eq!(out.uncertain, 1, "{out:?}");
        w.clock.advance(oncebox_core::relay_store::STATUS_RECHECK.0);
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        let d = w.delivery("evt-paid-a").await;
        assert_eq!(d.idempotency_key, "thank-you:o-7");
        assert_eq!(
            (d.state, d.note.as_deref()),
            (DeliveryState::Delivered, Some("status_url: applied"))
        );
        w.clock.advance(std::time::Duration::from_secs(3600));
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
        assert_eq!(rx.hits_of("thank-you:o-7"), 1, "never sent twice");
    });
}

#[test]
fn a_message_whose_key_no_header_can_carry_fails_its_event_and_a_non_ascii_key_goes_encoded() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        // A line break would fail every attempt for days (or, unchecked, split the header):
        // the handler hears why at once and nothing of the event is kept.
        let refused = process_keyed(&w, "evt-bad", "thank-you:o-7\r\nX-Injected: 1", false).await;
        let Err(ProcessError::Handler(why)) = refused else {
            panic!("{refused:?}");
        };
        assert!(why.to_string().contains("control character"), "{why}");
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
        // Not a duplicate later: the key stayed free.
        assert!(matches!(
            process(&w, "evt-bad", false).await,
            Ok(Processed::Applied(_))
        ));
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        // Bytes past ASCII are queued as they are and sent percent-encoded: a receiver reading
        // header bytes as Latin-1 would see mojibake.
        assert!(matches!(
            process_keyed(&w, "evt-accent", "merci:commande-é", false).await,
            Ok(Processed::Applied(_))
        ));
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 1, "{out:?}");
        let seen = rx.requests();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[1].headers["idempotency-key"],
            "merci%3Acommande-%C3%A9"
        );
    });
}
