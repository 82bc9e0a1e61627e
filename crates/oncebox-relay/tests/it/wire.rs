//! The key's wire form on HTTP routes: a key of printable ASCII goes verbatim, any other
//! percent-encoded, the same string in `Idempotency-Key`, in the signed `webhook-id` and (encoded
//! once more) in the status URL, so a receiver that reads header bytes as Latin-1 sees, verifies
//! and is asked about the one key.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::routing::get;
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::STATUS_RECHECK;
use oncebox_core::signature::{Scheme, Secret, verify};
use oncebox_testkit::run;

use crate::delivery::Lookup;
use crate::receiver::{self, Receiver, Seen};
use crate::{SECRET, World, route};

/// Delivers `shop:{id}` to a counting receiver; returns the one request it saw.
async fn deliver(w: &World, id: &str) -> Seen {
    let (rx, addr) = receiver::start().await;
    w.accept(id, &["hooks"]).await;
    let out = w.relay(vec![route("hooks", addr, true)]).run_once().await;
    assert_eq!(out.unwrap().delivered, 1);
    let mut seen = rx.requests();
    assert_eq!(seen.len(), 1);
    seen.remove(0)
}

/// Checks the Standard Webhooks signature of `seen` as a receiver would: over the `webhook-id`
/// header's bytes as they arrived.
fn assert_verifies(w: &World, seen: &Seen) {
    let secret = Secret::parse(&Scheme::StandardWebhooks, SECRET).unwrap();
    verify(
        &Scheme::StandardWebhooks,
        &[secret],
        &Lookup(&seen.headers),
        &seen.body,
        w.clock_now(),
        Duration::from_secs(300),
    )
    .expect("the signature verifies over the webhook-id the receiver got");
}

#[test]
fn a_non_ascii_key_goes_percent_encoded_in_both_headers_and_is_signed_as_sent() {
    run(async {
        let w = World::new();
        let seen = deliver(&w, "msg_é_1").await;
        for name in ["idempotency-key", "webhook-id"] {
            let value = seen.headers[name].as_bytes();
            assert_eq!(value, b"shop%3Amsg_%C3%A9_1", "{name}");
            // What a Latin-1 reader (Python's http.server, Node's http) decodes unchanged.
            assert!(value.iter().all(|b| (0x20..0x7f).contains(b)), "{name}");
        }
        assert_verifies(&w, &seen);
    });
}

#[test]
fn an_ascii_key_goes_verbatim_percent_signs_and_spaces_included() {
    run(async {
        let w = World::new();
        let seen = deliver(&w, "50% off sale").await;
        assert_eq!(seen.headers["idempotency-key"], "shop:50% off sale");
        assert_eq!(seen.headers["webhook-id"], "shop:50% off sale");
        assert_verifies(&w, &seen);
    });
}

/// The status paths asked, as they arrived (still percent-encoded).
type Asked = Arc<Mutex<Vec<String>>>;

/// `GET /status/{key}`: records the raw path and answers whether `rx` applied the decoded key,
/// the one its `Idempotency-Key` header carried.
async fn status(
    State((rx, asked)): State<(Arc<Receiver>, Asked)>,
    uri: Uri,
    Path(key): Path<String>,
) -> axum::Json<serde_json::Value> {
    asked.lock().unwrap().push(uri.path().to_owned());
    axum::Json(serde_json::json!({ "applied": rx.hits_of(&key) > 0 }))
}

#[test]
fn the_status_url_asks_about_the_key_the_receiver_saw_encoded_once_more() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        let asked = Asked::default();
        let app = Router::new()
            .route("/status/{key}", get(status))
            .with_state((rx.clone(), asked.clone()));
        let status_addr = receiver::serve(app).await;
        w.accept("msg_é_1", &["hooks"]).await;
        let mut plain = route("hooks", proxy, false);
        plain.status_url = Some(format!("http://{status_addr}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        assert_eq!(*dropped.lock().unwrap(), 1, "the reply was really dropped");
        assert_eq!(
            rx.hits_of("shop%3Amsg_%C3%A9_1"),
            1,
            "applied under the wire key"
        );
        w.clock.advance(STATUS_RECHECK.0);
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        assert_eq!(
            *asked.lock().unwrap(),
            ["/status/shop%253Amsg_%25C3%25A9_1"],
            "the wire key, percent-encoded for the path"
        );
        let d = w.delivery("msg_é_1").await;
        assert_eq!(
            (d.state, d.note.as_deref()),
            (DeliveryState::Delivered, Some("status_url: applied"))
        );
    });
}
