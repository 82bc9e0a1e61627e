//! The fencing token on the wire: a relay that stalled past its lease while its request was on
//! the way is refused by the store, and a receiver that keeps the largest token it wrote with
//! refuses its late request too, after later claims were written.

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

/// A receiver that writes each request's body over one record (the state of one order, say:
/// the last write wins) and checks fences as a storage service does: it keeps the largest
/// token it wrote with and answers 409 to a smaller one. Its first request is held until the
/// test lets it go, after saying it arrived.
#[derive(Default)]
struct Record {
    /// The record and the token it was written with.
    written: Mutex<Option<(Vec<u8>, i64)>>,
    refused: Mutex<Vec<i64>>,
    hold: Mutex<Option<(oneshot::Sender<i64>, oneshot::Receiver<()>)>>,
}

async fn hook(State(r): State<Arc<Record>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let fence = headers.get(FENCE_HEADER).and_then(|v| v.to_str().ok());
    let Some(fence) = fence.and_then(|v| v.parse::<i64>().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let held = r.hold.lock().unwrap().take();
    if let Some((arrived, release)) = held {
        arrived.send(fence).unwrap();
        release.await.unwrap();
    }
    let mut written = r.written.lock().unwrap();
    if written.as_ref().is_some_and(|(_, top)| fence < *top) {
        r.refused.lock().unwrap().push(fence);
        return StatusCode::CONFLICT;
    }
    *written = Some((body.to_vec(), fence));
    StatusCode::OK
}

#[test]
fn a_stalled_relays_late_request_is_refused_by_its_fence_after_newer_writes() {
    run(async {
        let w = World::new();
        let record = Arc::new(Record::default());
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *record.hold.lock().unwrap() = Some((arrived_tx, release_rx));
        let app = Router::new()
            .route("/hook", post(hook))
            .with_state(record.clone());
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
        // Then a later event of the same order is written over it.
        w.clock.advance(Duration::from_secs(61));
        let b = w.relay(vec![route("hooks", addr, true)]);
        let out = b.run_once().await.unwrap();
        assert_eq!((out.claimed, out.retrying), (1, 1), "{out:?}");
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(b.run_once().await.unwrap().delivered, 1);
        w.accept("evt_2", &["hooks"]).await;
        assert_eq!(b.run_once().await.unwrap().delivered, 1);
        let newest = record.written.lock().unwrap().clone().unwrap();
        assert_eq!(newest.0, br#"{"id":"evt_2"}"#);
        assert!(newest.1 > fence_a, "{newest:?} against A's {fence_a}");

        // A's request arrives at last. Without its fence it would put the older event back
        // over the newer; the receiver refuses it, and the store refuses A's record.
        release.send(()).unwrap();
        let late = a_round.await.unwrap().unwrap();
        assert_eq!(late.fenced, 1, "{late:?}");
        assert_eq!(*record.refused.lock().unwrap(), vec![fence_a]);
        let kept = record.written.lock().unwrap().clone().unwrap();
        assert_eq!(kept, newest, "the newer write stands");
        assert_eq!(w.delivery("evt_1").await.state, DeliveryState::Delivered);
    });
}
