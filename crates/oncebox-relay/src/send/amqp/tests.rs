//! The publisher's own state against a real broker: which connection a failure drops, and
//! how long an answered attempt may wait for the state another publish holds; and the
//! `message_id` a key is sent under.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use oncebox_core::relay_store::{Budget, Claimed};
use oncebox_core::{Key, Timestamp};
use oncebox_testkit::proxy::{Mode, Proxy};

use super::Publisher;
use crate::send::CONFIRMED;
use crate::target::Target;

/// A publisher to the broker at `url` whose messages no queue takes.
fn unrouted(url: &str) -> Publisher {
    let Ok(Target::Amqp(target)) =
        Target::parse(&format!("{url}?exchange=&routing_key=oncebox-unused"))
    else {
        panic!("an AMQP target from {url}")
    };
    Publisher::new(target)
}

/// Two publishes fail on one connection: the first to notice opens a new one, and the
/// second's late `forget` must not drop it (with it the first's confirm).
#[test]
fn a_failure_drops_only_the_connection_it_happened_on() {
    let Some(url) = oncebox_testkit::service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let p = unrouted(&url);
        let (_, first) = p.channel().await.unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        p.forget(first + 1, deadline).await;
        assert_eq!(p.channel().await.unwrap().1, first, "another's failure");
        p.forget(first, deadline).await;
        assert_ne!(p.channel().await.unwrap().1, first, "its own failure");
    });
}

fn claimed(id: &str) -> Claimed {
    let key = Key::parse("shop", id).unwrap();
    Claimed {
        id: 1,
        route: "queue".into(),
        idempotency_key: key.to_string(),
        key,
        payload: br#"{"n":1}"#.to_vec(),
        content_type: "application/json".into(),
        attempts: 0,
        created_at: Timestamp(0),
        budget: Budget {
            attempts_before: 0,
            since: Timestamp(0),
        },
        token: 1,
        lease_expires_at: Timestamp(i64::MAX),
        taken_over: false,
        hops: 1,
    }
}

/// A confirm that comes back while another publish holds the publisher's state (connecting, or
/// opening a channel behind a slow broker) is answered by the attempt's deadline, not after
/// the other publish lets go: past it, the relay's lease may have ended and a confirmed
/// message looked abandoned. Staged: the broker's answers held 300 ms in a proxy, and the
/// state taken once the broker has the message, before its confirm is through.
#[test]
fn a_confirm_is_answered_by_the_deadline_while_another_publish_holds_the_state() {
    let Some(url) = oncebox_testkit::service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let direct = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = direct.create_channel().await.unwrap();
        let queue = format!("oncebox-held-{}", uuid::Uuid::new_v4());
        let exclusive = QueueDeclareOptions {
            exclusive: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), exclusive, FieldTable::default())
            .await
            .unwrap();
        let address = url.split('@').nth(1).unwrap().split('/').next().unwrap();
        let upstream = tokio::net::lookup_host(address)
            .await
            .unwrap()
            .next()
            .unwrap();
        let proxy = Proxy::start(upstream).await;
        let via = url.replacen(address, &proxy.addr().to_string(), 1);
        let Ok(Target::Amqp(target)) =
            Target::parse(&format!("{via}?exchange=&routing_key={queue}"))
        else {
            panic!("an AMQP target from {via}")
        };
        let p = Publisher::new(target);
        let timeout = Duration::from_secs(2);
        assert_eq!(p.publish(&claimed("warm"), 1, timeout).await, CONFIRMED);

        proxy.set(Mode::Delay(Duration::from_millis(300)));
        let held_back = claimed("held");
        let publish = p.publish(&held_back, 1, timeout);
        tokio::pin!(publish);
        let held = loop {
            tokio::select! {
                answer = &mut publish => panic!("answered before its confirm was held: {answer:?}"),
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let q = channel
                .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                .await
                .unwrap();
            if q.message_count() == 2 {
                break p.open.lock().await;
            }
        };
        // Three deadlines: only an attempt waiting for the state runs into it.
        let answered = tokio::time::timeout(timeout * 3, &mut publish).await;
        drop(held);
        assert_eq!(
            answered.expect("the attempt waited for the state past its deadline"),
            CONFIRMED
        );
    });
}

/// A failure found while another publish holds the state past this one's deadline is still
/// told: the next publish to take the state drops that connection, instead of opening its
/// channel on it (until the heartbeat noticed, or for good with none).
#[test]
fn a_failure_told_while_the_state_is_held_drops_its_connection_later() {
    let Some(url) = oncebox_testkit::service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let p = unrouted(&url);
        let (_, first) = p.channel().await.unwrap();
        let held = p.open.lock().await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        p.forget(first, deadline).await;
        assert!(p.open.try_lock().is_err(), "the state was held throughout");
        drop(held);
        assert_ne!(p.channel().await.unwrap().1, first, "its failure was told");
    });
}

/// A key short enough goes as it is; a longer one as `sha256:<hex>`; and a key spelled as such
/// an id gets an id of its own, not the long key's.
#[test]
fn every_key_gets_a_message_id_no_other_key_has() {
    assert_eq!(super::message::message_id("shop:evt_1"), "shop:evt_1");
    let long = format!("shop:{}", "x".repeat(300));
    let hashed = super::message::message_id(&long);
    assert!(
        hashed.starts_with("sha256:") && hashed.len() == 71,
        "{hashed}"
    );
    let spelled = super::message::message_id(&hashed);
    assert!(
        spelled.starts_with("sha256:") && spelled != hashed,
        "{spelled}"
    );
    // Not every `sha256:` key is spelled as one: only 64 hex digits after it.
    assert_eq!(super::message::message_id("sha256:evt_1"), "sha256:evt_1");
}
