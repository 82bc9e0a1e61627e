//! A connection that stalls (a proxy holds every byte) under a running consumer: a short stall
//! costs a missed heartbeat, which the consumer counts and pulls on through; a stall that lasts
//! ends `run` with the errors named, so the caller binds again.

use std::time::Duration;

use oncebox_nats::{ConsumeError, Consumer};
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::{run, service_url};

use crate::support::{World, start};

#[test]
fn a_stall_is_pulled_through_and_a_lasting_one_ends_the_run() {
    let Some(url) = service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let server = url.trim_start_matches("nats://");
        let server = tokio::net::lookup_host(server)
            .await
            .expect("the NATS address")
            .next()
            .expect("an address");
        let proxy = Proxy::start(server).await;
        let mut options = w.options();
        // The client reports a missed heartbeat after two: one second of silence.
        options.heartbeat = Duration::from_millis(500);
        let apply = w.db.checked();
        let mut consumer = start(
            &format!("nats://{}", proxy.addr()),
            Consumer::new(apply.clone(), options),
        );
        w.publish(Some("evt_before"), r#"{"n":1}"#).await;
        w.wait(&mut consumer, |c| c.applied == 1).await;

        // Nothing moves either way; the server's heartbeats wait in the proxy.
        proxy.set(Mode::BlackHole);
        let stalled = w.wait(&mut consumer, |c| c.pull_errors >= 1).await;
        proxy.set(Mode::Pass);
        assert!(Stats::get(&proxy.stats.held) >= 1, "the proxy held traffic");
        // The consumer goes on: a message published after the stall is applied.
        w.publish(Some("evt_after"), r#"{"n":2}"#).await;
        let after = w.wait(&mut consumer, |c| c.applied == 2).await;
        assert_eq!(w.db.effects("evt_after"), 1);

        // A stall that lasts: a missed heartbeat every second, and the fifth ends the run.
        proxy.set(Mode::BlackHole);
        let ended = consumer.ended(Duration::from_secs(30)).await;
        proxy.set(Mode::Pass);
        eprintln!(
            "nats stall: {} pull error(s) in a short stall, applied {} after it; a lasting stall ended the run with {ended:?}",
            stalled.pull_errors, after.applied
        );
        match ended {
            Err(ConsumeError::Pull(why)) => {
                assert!(why.contains("5 pull errors"), "{why}");
            }
            other => panic!("a lasting stall should end the run with a pull error: {other:?}"),
        }
        w.cleanup().await;
    });
}
