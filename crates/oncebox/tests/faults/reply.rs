//! The receiver's reply dropped after it applied a delivery, through the testkit's TCP proxy:
//! on an idempotent route the relay retries with the same key and the receiver counts one
//! effect; on a plain route each delivery is parked uncertain and never sent again.

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
    run: || Some(reply_dropped(true)),
};

pub const RECEIVER_REPLY_DROPPED_PLAIN: Scenario = Scenario {
    name: "net: receiver reply dropped, plain",
    backend: "sqlite",
    run: || Some(reply_dropped(false)),
};

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
timeout = "2s"
backoff = {{ base = "50ms", cap = "200ms" }}
[relay]
poll = "20ms"
"#
    )
}

/// Events delivered through a proxy that drops every reply after the receiver applied the
/// request. On an idempotent route the relay retries with the same key once the network heals
/// and the receiver counts one effect per key; on a plain route each delivery is parked as
/// uncertain (unresolved: the events, on purpose) and never re-sent (no second application).
fn reply_dropped(idempotent: bool) -> Report {
    // Fewer than the relay's circuit threshold (10 failures in a row), so the healed route is
    // not left alone for the circuit's cooldown.
    let events = scale(8);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("relay.db");
    block_on(Duration::from_secs(120), async {
        let (receiver, at) = Receiver::start().await;
        let proxy = Proxy::start(at).await;
        proxy.set(Mode::DropReply);
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
        let dropped = Stats::get(&proxy.stats.dropped_replies);
        let store = StoreCounts::new(&db, None).await;
        if idempotent {
            proxy.set(Mode::Pass);
            // Every delivery recorded once the network healed.
            store.until_outbox("delivered", events).await;
        } else {
            store.until_outbox("uncertain", events).await;
            // The network healed, a later event goes through the same relay and route: by the
            // time it is applied, the relay has had its rounds to send a parked one again,
            // which the receiver would count as a second application below.
            proxy.set(Mode::Pass);
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
            exercised: dropped,
            what: format!("{dropped} replies dropped after the receiver applied them"),
            expected_unresolved: if idempotent { 0 } else { events },
        }
    })
}
