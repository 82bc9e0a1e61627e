//! The fencing token on the wire: a relay that stalled past its lease while its request was on
//! the way is refused by the store, and a receiver that keeps the largest token it applied per
//! key refuses its late request too, after the request sent in its place was applied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::FENCE_HEADER;
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::run;
use tokio::sync::oneshot;

use crate::{World, receiver, route};

/// A receiver that applies every request it is sent (it keeps no keys: a plain receiver) and
/// checks fences as a storage service does: per `Idempotency-Key` it keeps the largest token
/// it applied and answers 409 to a smaller one. Its first request is held until the test lets
/// it go, after saying it arrived.
#[derive(Default)]
struct Fenced {
    /// Per key, the largest token applied.
    top: Mutex<HashMap<String, i64>>,
    /// Each request applied: its key, body and token.
    applied: Mutex<Vec<(String, Vec<u8>, i64)>>,
    refused: Mutex<Vec<i64>>,
    hold: Mutex<Option<(oneshot::Sender<i64>, oneshot::Receiver<()>)>>,
}

async fn hook(State(r): State<Arc<Fenced>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(key), Some(fence)) = (
        text("idempotency-key"),
        text(FENCE_HEADER).and_then(|v| v.parse::<i64>().ok()),
    ) else {
        return StatusCode::BAD_REQUEST;
    };
    let held = r.hold.lock().unwrap().take();
    if let Some((arrived, release)) = held {
        arrived.send(fence).unwrap();
        release.await.unwrap();
    }
    let mut top = r.top.lock().unwrap();
    if top.get(key).is_some_and(|&t| fence < t) {
        r.refused.lock().unwrap().push(fence);
        return StatusCode::CONFLICT;
    }
    top.insert(key.to_owned(), fence);
    let applied = (key.to_owned(), body.to_vec(), fence);
    r.applied.lock().unwrap().push(applied);
    StatusCode::OK
}

#[test]
fn a_stalled_relays_late_request_is_refused_by_its_fence_after_the_one_sent_in_its_place() {
    run(async {
        let w = World::new();
        let fenced = Arc::new(Fenced::default());
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *fenced.hold.lock().unwrap() = Some((arrived_tx, release_rx));
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(fenced.clone());
        let addr = receiver::serve(app).await;
        w.accept("evt_1", &["hooks"]).await;

        // Relay A claims and sends; its request is held on the way (a stall, a slow network).
        let mut slow = route("hooks", addr, true);
        slow.timeout = Duration::from_secs(30);
        let a = Relay::new(
            w.inbox.clone(),
            vec![slow],
            Arc::new(w.clock.clone()),
            RelayOptions {
                lease: Duration::from_secs(60),
                ..RelayOptions::default()
            },
        );
        let a_round = tokio::spawn(async move { a.run_once().await });
        let fence_a = arrived.await.unwrap();

        // A's lease runs out. Relay B takes the delivery over: A's attempt counts as one sent
        // without an answer, and B sends it again after the backoff, under a claim of its own.
        w.clock.advance(Duration::from_secs(61));
        let b = w.relay(vec![route("hooks", addr, true)]);
        let out = b.run_once().await.unwrap();
        assert_eq!((out.claimed, out.retrying), (1, 1), "{out:?}");
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(b.run_once().await.unwrap().delivered, 1);
        let applied = fenced.applied.lock().unwrap().clone();
        assert_eq!(applied.len(), 1, "{applied:?}");
        assert!(applied[0].2 > fence_a, "{applied:?} against A's {fence_a}");

        // A's request arrives at last. This receiver keeps no keys and would apply it a
        // second time; its fence is smaller than the one applied for the key: refused. The
        // store refuses A's record of the answer.
        release.send(()).unwrap();
        let late = a_round.await.unwrap().unwrap();
        assert_eq!(late.fenced, 1, "{late:?}");
        assert_eq!(*fenced.refused.lock().unwrap(), vec![fence_a]);
        assert_eq!(fenced.applied.lock().unwrap().len(), 1, "applied once");
        assert_eq!(w.delivery("evt_1").await.state, DeliveryState::Delivered);
    });
}
