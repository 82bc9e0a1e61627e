//! The gauges the relay publishes count the deliveries in each state as the store holds them
//! now: a state whose last delivery moved on reads 0, not the count last seen; and they are
//! published every 10 s of time passing, whatever the wall clock does.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use oncebox_core::Clock;
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::run;

use crate::{World, receiver, route};

/// The value of `oncebox_deliveries{state="<state>"}` in a Prometheus rendering.
fn gauge(rendered: &str, state: &str) -> Option<f64> {
    let name = format!("oncebox_deliveries{{state=\"{state}\"}} ");
    rendered
        .lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_state_left_empty_reads_zero() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // The test's own recorder, on this thread: `run` polls the test on it, and the gauges
    // are set from the awaited calls below, not from spawned tasks.
    let _local = metrics::set_default_local_recorder(&recorder);
    run(async {
        let w = World::new();
        let (_rx, addr) = receiver::start().await;
        w.accept("e1", &["hooks"]).await;
        w.accept("e2", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        relay.publish_gauges().await.unwrap();
        let before = handle.render();
        assert_eq!(gauge(&before, "pending"), Some(2.0), "{before}");
        assert_eq!(
            gauge(&before, "uncertain"),
            Some(0.0),
            "every state is published"
        );
        let round = relay.run_once().await.unwrap();
        assert_eq!(round.delivered, 2, "{round:?}");
        relay.publish_gauges().await.unwrap();
        let after = handle.render();
        assert_eq!(gauge(&after, "pending"), Some(0.0), "{after}");
        assert_eq!(gauge(&after, "delivered"), Some(2.0), "{after}");
    });
}

/// Waits, polling the rendering, until `state` reads `value`; fails after 10 s.
async fn until_gauge(handle: &PrometheusHandle, state: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rendered = handle.render();
        if gauge(&rendered, state) == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{state} never read {value}: {rendered}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The running relay's gauges after the wall clock was set an hour back: published again once
/// 10 s have passed. Scheduled by the wall clock, they were not for that hour, and an alert on
/// a state neither fired nor cleared.
#[test]
fn gauges_go_on_after_the_wall_clock_is_set_back() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let relay = w.relay(vec![route("hooks", addr, true)]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let test = async {
            // The first publishing, of an empty store; the manual clock stands still, so the
            // next is due only when the test moves it.
            until_gauge(&handle, "pending", 0.0).await;
            w.accept("e1", &["hooks"]).await;
            let deadline = Instant::now() + Duration::from_secs(10);
            while w.delivery("e1").await.state != DeliveryState::Delivered {
                assert!(Instant::now() < deadline, "e1 never delivered");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(rx.seen.lock().unwrap().len(), 1);
            assert_eq!(gauge(&handle.render(), "delivered"), Some(0.0));
            // An hour back, then 11 s of time passing.
            w.clock.set(w.clock.now().minus(Duration::from_secs(3600)));
            w.clock.advance(Duration::from_secs(11));
            until_gauge(&handle, "delivered", 1.0).await;
            let _ = stop.send(());
        };
        let ((), ()) = tokio::join!(
            relay.run(async {
                let _ = stopped.await;
            }),
            test
        );
    });
}
