//! The receiver's reply lost after it applied a delivery: dropped by the testkit's TCP proxy,
//! or sent only after the route's timeout by a receiver that stalls once it did its work. On
//! an idempotent route the relay retries with the same key and the receiver counts one effect;
//! on a plain route each delivery is parked uncertain and never sent again.

use std::sync::Arc;
use std::time::Duration;

use oncebox_testkit::checker::check;
use oncebox_testkit::child::until_async;
use oncebox_testkit::history::{History, key};
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::receiver::Receiver;

use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, StoreCounts, block_on};

pub const RECEIVER_REPLY_DROPPED_IDEMPOTENT: Scenario = Scenario {
    name: "net: receiver reply dropped, idem",
    backend: "sqlite",
    run: || Some(reply_lost(true, Lost::Dropped)),
};

pub const RECEIVER_REPLY_DROPPED_PLAIN: Scenario = Scenario {
    name: "net: receiver reply dropped, plain",
    backend: "sqlite",
    run: || Some(reply_lost(false, Lost::Dropped)),
};

pub const RECEIVER_TOO_SLOW_IDEMPOTENT: Scenario = Scenario {
    name: "net: receiver past timeout, idem",
    backend: "sqlite",
    run: || Some(reply_lost(true, Lost::Late)),
};

pub const RECEIVER_TOO_SLOW_PLAIN: Scenario = Scenario {
    name: "net: receiver past timeout, plain",
    backend: "sqlite",
    run: || Some(reply_lost(false, Lost::Late)),
};

/// How the receiver's answer to an applied request is lost.
#[derive(Clone, Copy, PartialEq)]
enum Lost {
    /// The proxy drops it.
    Dropped,
    /// The receiver sends it after the route's timeout.
    Late,
}

/// The route's timeout, and how long the stalling receiver takes past it.
const TIMEOUT: Duration = Duration::from_millis(500);
const STALL: Duration = Duration::from_secs(2);

fn route_config(receiver: std::net::SocketAddr, idempotent: bool) -> String {
    format!(
        r#"
[sources.shop]
signature = "none"
event_id = {{ pointer = "/id" }}
[routes.hooks]
sources = ["shop"]
url = "http://{receiver}/hook"
idempotent = {idempotent}
timeout = "{timeout}ms"
backoff = {{ base = "50ms", cap = "200ms" }}
[relay]
poll = "20ms"
"#,
        timeout = TIMEOUT.as_millis()
    )
}

/// Events delivered while every answer of the receiver's is lost after it applied the request.
/// On an idempotent route the relay retries with the same key once the fault heals and the
/// receiver counts one effect per key; on a plain route each delivery is parked as uncertain
/// (unresolved: the events, on purpose) and never re-sent (no second application).
fn reply_lost(idempotent: bool, lost: Lost) -> Report {
    // Fewer than the relay's circuit threshold (10 failures in a row), so the healed route is
    // not left alone for the circuit's cooldown.
    let events = scale(8);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    block_on(Duration::from_secs(120), async {
        let (receiver, at) = Receiver::start().await;
        let proxy = Proxy::start(at).await;
        match lost {
            Lost::Dropped => proxy.set(Mode::DropReply),
            Lost::Late => receiver.slow(TIMEOUT + STALL),
        }
        let heal = || {
            proxy.set(Mode::Pass);
            receiver.slow(Duration::ZERO);
        };
        std::fs::write(
            dir.path().join("oncebox.toml"),
            route_config(proxy.addr(), idempotent),
        )
        .unwrap();
        let database = format!("sqlite://{}", db.display());
        let mut server = world::serve(dir.path(), &database, "127.0.0.1:0", &[]).start();
        let base = world::url(&server);
        let history = Arc::new(History::new());
        let c = world::client();
        for i in 0..events {
            world::deliver_until_done(&c, &history, &base, "shop", &format!("d{i}"), "v1").await;
        }
        until_async(
            "every event applied once behind the proxy",
            PATIENCE,
            || receiver.per_key().len() >= events,
        )
        .await;
        let lost_replies = || match lost {
            Lost::Dropped => Stats::get(&proxy.stats.dropped_replies),
            Lost::Late => receiver.slowed() as u64,
        };
        // The receiver counts an application before it answers, and the proxy decides an
        // answer's fate as it passes: healed before then, the answer would go through and no
        // reply would have been lost.
        until_async("every event's answer lost", PATIENCE, || {
            lost_replies() >= events as u64
        })
        .await;
        let lost_replies = lost_replies();
        let store = StoreCounts::new(&db, None).await;
        if idempotent {
            heal();
            // Every delivery recorded once the network healed.
            store.until_outbox("delivered", events).await;
        } else {
            store.until_outbox("uncertain", events).await;
            // The network healed, a later event goes through the same relay and route: by the
            // time it is applied, the relay has had its rounds to send a parked one again,
            // which the receiver would count as a second application below.
            heal();
            world::deliver_until_done(&c, &history, &base, "shop", "after", "v1").await;
            until_async("the later event applied", PATIENCE, || {
                receiver.per_key().len() > events
            })
            .await;
            store.until_outbox("delivered", 1).await;
        }
        server.terminate();
        let mut fin = store.fin(true).await;
        // The receiver's effects: one per key where it honours the key, else every application.
        fin.effects = receiver
            .applied()
            .into_iter()
            .map(|(k, bodies)| {
                let (source, id) = k.split_once(':').unwrap_or(("?", &k));
                let n = if idempotent { 1 } else { bodies.len() };
                (
                    key(source, id),
                    bodies.iter().take(n).map(|b| world::tag_of(b)).collect(),
                )
            })
            .collect();
        Report {
            figures: check(&history.ops(), &fin),
            exercised: lost_replies,
            what: match lost {
                Lost::Dropped => {
                    format!("{lost_replies} replies dropped after the receiver applied them")
                }
                Lost::Late => format!(
                    "{lost_replies} requests applied and answered only after the route's timeout"
                ),
            },
            expected_unresolved: if idempotent { 0 } else { events },
        }
    })
}
