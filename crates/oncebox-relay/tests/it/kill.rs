//! A relay process SIGKILLed after the receiver's 2xx but before recording it: the delivery is
//! claimed again after the lease and re-sent with the same key; an idempotent receiver counts
//! one effect.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::DeliveryState;
use oncebox_core::{Clock, ManualClock, SystemClock};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::{World, receiver, route};

const CHILD: &str = "ONCEBOX_RELAY_CHILD";

/// The child's side: `ONCEBOX_RELAY_CHILD=<db path>|<receiver addr>`. One relay round with the
/// crash point armed; the parent runs it with `--include-ignored`.
#[test]
#[ignore = "entry point of the relay kill test's child process"]
fn relay_child_process() {
    let spec = std::env::var(CHILD).expect("run by the relay kill test");
    let (path, addr) = spec.split_once('|').expect("path|addr");
    fail::cfg("relay-before-record", "return").expect("arm crash point");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let inbox = Inbox::open(Options::new(path)).unwrap();
        let relay = Relay::new(
            inbox,
            vec![route("hooks", addr.parse().unwrap(), true)],
            Arc::new(SystemClock),
            RelayOptions::default(),
        );
        let _ = relay.run_once().await;
    });
    unreachable!("the crash point kills the process before the round ends");
}

#[test]
fn relay_killed_between_the_receivers_2xx_and_its_record_resends_the_same_key() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_kill", &["hooks"]).await;
        let path = w.path();
        let status = tokio::task::spawn_blocking(move || {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "kill::relay_child_process",
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, format!("{}|{addr}", path.display()))
                .status()
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "the relay died by SIGKILL at the crash point"
        );
        assert_eq!(
            rx.hits_of("shop:evt_kill"),
            1,
            "the receiver had answered 2xx"
        );
        assert_eq!(
            w.delivery("evt_kill").await.state,
            DeliveryState::InFlight,
            "nothing recorded"
        );

        // A day later on the relay's clock the dead relay's lease has long expired. Its
        // attempt is recorded as one without an answer, and sent again after the backoff.
        let later = ManualClock::new(SystemClock.now().plus(Duration::from_secs(24 * 3600)));
        // The event was accepted on the test world's clock, months before the relays' system
        // clock: the route keeps keys longer than that, so its `max_age` allows the resend
        // (`max_age.rs` has a delivery held back past it).
        let mut hooks = route("hooks", addr, true);
        hooks.retry.max_age = Duration::from_secs(100 * 365 * 24 * 3600);
        let relay = Relay::new(
            w.inbox.clone(),
            vec![hooks],
            Arc::new(later.clone()),
            RelayOptions::default(),
        );
        let out = relay.run_once().await.unwrap();
        assert_eq!(out.retrying, 1, "{out:?}");
        later.advance(Duration::from_secs(3600));
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        // Both requests carried the one key (hits are counted per key), which a receiver
        // honouring it applies once.
        assert_eq!(rx.hits_of("shop:evt_kill"), 2, "re-sent");
        assert_eq!(rx.requests()[1].headers["oncebox-attempt"], "2");
        let seen = rx.requests();
        assert_eq!(
            seen[0].headers["idempotency-key"],
            seen[1].headers["idempotency-key"]
        );
        assert_eq!(w.delivery("evt_kill").await.state, DeliveryState::Delivered);
    });
}
