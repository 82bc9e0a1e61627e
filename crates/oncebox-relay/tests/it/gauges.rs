//! The gauges the relay publishes count the deliveries in each state as the store holds them
//! now: a state whose last delivery moved on reads 0, not the count last seen.

use metrics_exporter_prometheus::PrometheusBuilder;
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
