//! NATS JetStream routes against the running server (`ONCEBOX_NATS_URL`): messages stored with
//! `Nats-Msg-Id` = the key and delivered only on the stream's PubAck; a redelivered key stored
//! once by the stream's duplicate window; no stream, or no server, retried; a connection lost
//! before the PubAck is an unknown outcome.

use std::time::Duration;

use async_nats::jetstream::stream::{Config, RetentionPolicy, StorageType, Stream};
use async_nats::jetstream::{self, Context};
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::{Clock, Key};
use oncebox_testkit::{run, service_url};

use crate::broker::{
    broker_down_is_retried, cut_before_the_confirm, refused_publish_is_retried, route_url, upstream,
};
use crate::{World, broker_route, closed_port, unique, with_query};

/// A test's own stream capturing one subject, deleted by `drop_all`.
struct JetStream {
    base: String,
    js: Context,
    stream: Stream,
    name: String,
    subject: String,
}

impl JetStream {
    async fn new() -> Option<JetStream> {
        JetStream::with(RetentionPolicy::Limits).await
    }

    async fn with(retention: RetentionPolicy) -> Option<JetStream> {
        let base = service_url("ONCEBOX_NATS_URL")?;
        let client = async_nats::connect(base.as_str())
            .await
            .expect("the test connects to NATS");
        let js = jetstream::new(client);
        // Stream names may not contain dots; subjects are dot-separated tokens.
        let name = unique("stream");
        let subject = format!("oncebox.test.{}", uuid::Uuid::new_v4().simple());
        let stream = js
            .create_stream(Config {
                name: name.clone(),
                // The subject, and those under it (for routes to subjects of their own).
                subjects: vec![subject.clone(), format!("{subject}.>")],
                storage: StorageType::Memory,
                // The dedup window the test relies on, stated rather than defaulted.
                duplicate_window: Duration::from_secs(120),
                retention,
                ..Config::default()
            })
            .await
            .expect("JetStream is enabled on the server");
        Some(JetStream {
            base,
            js,
            stream,
            name,
            subject,
        })
    }

    /// The route URL to this test's subject, through `server` (a proxy) when given.
    fn url(&self, server: Option<std::net::SocketAddr>) -> String {
        route_url(&self.base, server, &[("subject", &self.subject)])
    }

    /// The route URL to `{subject}.{token}`, a subject of the same stream.
    fn url_under(&self, token: &str) -> String {
        let subject = format!("{}.{token}", self.subject);
        route_url(&self.base, None, &[("subject", &subject)])
    }

    async fn stored(&self) -> u64 {
        self.stream.get_info().await.unwrap().state.messages
    }

    async fn drop_all(self) {
        self.js.delete_stream(&self.name).await.unwrap();
    }
}

#[test]
fn jetstream_route_stores_messages_with_route_and_key_as_nats_msg_id_and_a_redelivered_key_once() {
    run(async {
        let Some(nats) = JetStream::new().await else {
            return;
        };
        let w = World::new();
        w.accept("evt_1", &["stream"]).await;
        let relay = w.relay(vec![broker_route("stream", &nats.url(None), false)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1), "{out:?}");
        let d = w.delivery("evt_1").await;
        assert_eq!((d.state, d.last_status), (DeliveryState::Delivered, None));
        assert_eq!(nats.stored().await, 1);
        let m = nats.stream.get_raw_message(1).await.unwrap();
        let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(header("Nats-Msg-Id").as_deref(), Some("stream:shop:evt_1"));
        assert_eq!(header("Idempotency-Key").as_deref(), Some("shop:evt_1"));
        assert_eq!(header("Oncebox-Attempt").as_deref(), Some("1"));
        let fence = header("Oncebox-Fencing-Token").and_then(|v| v.parse::<i64>().ok());
        assert!(fence.is_some_and(|f| f > 0), "{fence:?}");
        assert_eq!(header("Content-Type").as_deref(), Some("application/json"));
        assert_eq!(&m.payload[..], br#"{"id":"evt_1"}"#);

        // An operator replays the event: same key, inside the stream's duplicate window.
        let key = Key::parse("shop", "evt_1").unwrap();
        assert_eq!(w.inbox.redeliver(&key, w.clock.now()).await.unwrap(), 1);
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        assert_eq!(nats.stored().await, 1, "the stream kept one message");
        let d = w.delivery("evt_1").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Delivered, 2));
        let attempts = w.inbox.attempts(d.id).await.unwrap();
        assert_eq!(attempts.len(), 2);
        assert!(
            attempts.iter().all(|a| a.error.is_none()),
            "both confirmed: {attempts:?}"
        );
        nats.drop_all().await;
    });
}

/// The stream's duplicate window is per stream, whatever the subject: with the key alone as
/// `Nats-Msg-Id`, the second of two routes into one stream was answered "duplicate" and
/// recorded delivered while the stream kept nothing for it.
#[test]
fn two_routes_into_one_stream_each_store_their_message() {
    run(async {
        let Some(nats) = JetStream::new().await else {
            return;
        };
        let w = World::new();
        w.accept("evt_2", &["billing", "audit"]).await;
        let relay = w.relay(vec![
            broker_route("billing", &nats.url_under("billing"), false),
            broker_route("audit", &nats.url_under("audit"), false),
        ]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (2, 2), "{out:?}");
        assert_eq!(
            nats.stored().await,
            2,
            "each route's message is in the stream"
        );
        let mut subjects = Vec::new();
        for seq in 1..=2 {
            let m = nats.stream.get_raw_message(seq).await.unwrap();
            assert_eq!(
                m.headers.get("Idempotency-Key").map(|v| v.as_str()),
                Some("shop:evt_2")
            );
            subjects.push(m.subject.to_string());
        }
        subjects.sort();
        let under = |t: &str| format!("{}.{t}", nats.subject);
        assert_eq!(subjects, [under("audit"), under("billing")]);
        nats.drop_all().await;
    });
}

#[test]
fn jetstream_subject_without_a_stream_is_not_sent_and_retried() {
    run(async {
        let Some(base) = service_url("ONCEBOX_NATS_URL") else {
            return;
        };
        let subject = format!("oncebox.nostream.{}", uuid::Uuid::new_v4().simple());
        let url = with_query(&base, &[("subject", &subject)]);
        // "No responders": no stream captures the subject, so nothing was stored.
        refused_publish_is_retried(&url, "no stream").await;
    });
}

/// A stream with interest retention acknowledges a message no consumer wants with a sequence
/// and keeps nothing: a route into one is refused at every attempt (retried, in the end dead),
/// never recorded delivered.
#[test]
fn jetstream_interest_stream_is_not_published_into() {
    run(async {
        let Some(nats) = JetStream::with(RetentionPolicy::Interest).await else {
            return;
        };
        let w = World::new();
        w.accept("evt_i", &["stream"]).await;
        let relay = w.relay(vec![broker_route("stream", &nats.url(None), false)]);
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.delivered, out.retrying), (0, 1), "{out:?}");
        let d = w.delivery("evt_i").await;
        let error = d.last_error.unwrap_or_default();
        assert!(error.contains("interest retention"), "{error}");
        // What a publish there would have been: acknowledged, and nothing kept.
        let ack = nats.js.publish(nats.subject.clone(), "x".into()).await;
        let ack = ack.unwrap().await.unwrap();
        assert!(ack.sequence > 0);
        assert_eq!(nats.stored().await, 0, "the stream kept nothing");
        nats.drop_all().await;
    });
}

/// The stream looked at deleted and made anew with interest retention, within the minute a
/// look holds: its PubAck names another stream (or the same, its sequence started over), which
/// is looked at before the attempt counts. It may have dropped the message (no consumer wants
/// it): an unknown outcome, not delivered.
#[test]
fn a_puback_from_a_stream_made_anew_with_interest_retention_is_not_delivered() {
    made_anew_with_interest_retention(false);
}

#[test]
fn a_puback_from_a_stream_made_anew_under_its_name_with_interest_retention_is_not_delivered() {
    made_anew_with_interest_retention(true);
}

fn made_anew_with_interest_retention(same_name: bool) {
    run(async move {
        let Some(nats) = JetStream::new().await else {
            return;
        };
        let w = World::new();
        w.accept("evt_1", &["stream"]).await;
        let relay = w.relay(vec![broker_route("stream", &nats.url(None), false)]);
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        // Deleted and made again, with interest retention, no consumer.
        nats.js.delete_stream(&nats.name).await.unwrap();
        let anew = if same_name {
            nats.name.clone()
        } else {
            unique("stream")
        };
        nats.js
            .create_stream(Config {
                name: anew.clone(),
                subjects: vec![nats.subject.clone(), format!("{}.>", nats.subject)],
                storage: StorageType::Memory,
                retention: RetentionPolicy::Interest,
                ..Config::default()
            })
            .await
            .unwrap();
        w.accept("evt_2", &["stream"]).await;
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.delivered, 0, "{out:?}");
        let d = w.delivery("evt_2").await;
        assert_eq!(d.state, DeliveryState::Uncertain, "{d:?}");
        let error = d.last_error.unwrap_or_default();
        assert!(error.contains("interest retention"), "{error}");
        let kept = nats.js.get_stream(&anew).await.unwrap().get_info().await;
        assert_eq!(kept.unwrap().state.messages, 0, "the stream kept nothing");
        nats.js.delete_stream(&anew).await.unwrap();
    });
}

#[test]
fn jetstream_server_down_is_retried_never_delivered() {
    run(async {
        let url = format!("nats://{}?subject=orders.paid", closed_port());
        broker_down_is_retried(&url).await;
    });
}

#[test]
fn jetstream_connection_lost_before_the_puback_is_unknown_uncertain_or_retried_by_the_route() {
    run(async {
        let Some(nats) = JetStream::new().await else {
            return;
        };
        let upstream = upstream(&nats.base, 4222).await;
        let w = World::new();
        for (id, idempotent, want, stored) in [
            ("evt_plain", false, DeliveryState::Uncertain, 1),
            ("evt_idem", true, DeliveryState::Retrying, 2),
        ] {
            // The stream stores the message and acks it; the PubAck never arrives.
            let route = |proxy| {
                let mut route =
                    broker_route(&format!("stream-{id}"), &nats.url(Some(proxy)), idempotent);
                // The wait for the lost PubAck.
                route.timeout = Duration::from_secs(2);
                route
            };
            cut_before_the_confirm(&w, upstream, id, route, want).await;
            assert_eq!(nats.stored().await, stored, "{id}: the stream did store it");
        }
        // The network heals: a relay reaching the server directly publishes the idempotent
        // route's message again; the stream recognises the key and stores nothing new.
        w.clock.advance(Duration::from_secs(3600));
        let healed = w.relay(vec![broker_route("stream-evt_idem", &nats.url(None), true)]);
        assert_eq!(healed.run_once().await.unwrap().delivered, 1);
        assert_eq!(
            nats.stored().await,
            2,
            "the duplicate window dropped the re-publish"
        );
        nats.drop_all().await;
    });
}

/// A route timed out at `Duration::MAX` (a library caller's "no timeout"; configuration caps
/// it at a century) publishes and is delivered: its attempt's deadline overflowed, a panic in
/// the relay's task.
#[test]
fn a_route_timed_out_at_duration_max_publishes_without_overflowing() {
    run(async {
        let Some(nats) = JetStream::new().await else {
            return;
        };
        let w = World::new();
        w.accept("evt_max", &["billing"]).await;
        let mut billing = broker_route("billing", &nats.url(None), false);
        billing.timeout = Duration::MAX;
        let out = w.relay(vec![billing]).run_once().await.unwrap();
        assert_eq!((out.claimed, out.delivered), (1, 1), "{out:?}");
        assert_eq!(nats.stored().await, 1);
        nats.drop_all().await;
    });
}
