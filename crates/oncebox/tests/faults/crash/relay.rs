//! The relay's crash scenario: a relay child SIGKILLed at `relay-before-record` after the
//! receiver's 2xx; the restarted relay sends again under the same key and the receiver applies it
//! once.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::SystemClock;
use oncebox_testkit::checker::check;
use oncebox_testkit::child::{Ready, Spec, killed, until_async};
use oncebox_testkit::history::{History, key};
use oncebox_testkit::receiver::Receiver;
use oncebox_testkit::seed::Seed;
use rand::Rng;

use super::CHILD;
use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, PgSchema, StoreCounts, block_on};

pub const RELAY_BEFORE_RECORD_SQLITE: Scenario = Scenario {
    name: "crash: relay-before-record",
    backend: "sqlite",
    run: || Some(relay_crash(None)),
};

pub const RELAY_BEFORE_RECORD_POSTGRES: Scenario = Scenario {
    name: "crash: relay-before-record",
    backend: "postgres",
    run: || {
        let schema = block_on(PATIENCE, world::pg_schema())?;
        Some(relay_crash(Some(&schema)))
    },
};

/// The relay of the relay crash scenario: `ROUTE` to the receiver, idempotent, a 1 s lease.
fn route(receiver: &str) -> oncebox_core::route::Route {
    use oncebox_core::delivery::{Backoff, RetryPolicy};
    oncebox_core::route::Route {
        name: "hooks".into(),
        sources: vec![oncebox_core::Source::new("shop").unwrap()],
        filter: None,
        url: format!("http://{receiver}/hook"),
        // Shorter than the lease, as configuration validation demands of `oncebox relay`.
        timeout: Duration::from_millis(500),
        signing_secret: None,
        idempotent: true,
        status_url: None,
        retry: RetryPolicy {
            max_attempts: 50,
            max_age: Duration::from_secs(3600),
            backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_millis(500),
            },
        },
        concurrency: 4,
        rate: None,
        ca_pem: None,
    }
}

const LEASE: Duration = Duration::from_secs(1);

pub(super) fn relay_child(database: &str, receiver: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let options = oncebox_relay::RelayOptions {
            lease: LEASE,
            ..oncebox_relay::RelayOptions::default()
        };
        let routes = vec![route(receiver)];
        let clock = Arc::new(SystemClock);
        if database.starts_with("postgres") {
            let opts = oncebox_postgres::Options::new(database);
            let store = oncebox_postgres::Inbox::open(opts).await.expect("open");
            oncebox_relay::Relay::new(store, routes, clock, options)
                .run(std::future::pending())
                .await;
        } else {
            let store =
                oncebox_sqlite::Inbox::open(oncebox_sqlite::Options::new(database)).expect("open");
            oncebox_relay::Relay::new(store, routes, clock, options)
                .run(std::future::pending())
                .await;
        }
    });
}

fn relay_config(receiver: std::net::SocketAddr) -> String {
    format!(
        r#"
[sources.shop]
signature = "none"
event_id = {{ pointer = "/id" }}
[routes.hooks]
sources = ["shop"]
url = "http://{receiver}/hook"
idempotent = true
timeout = "500ms"
backoff = {{ base = "100ms", cap = "500ms" }}
[relay]
lease = "1s"
poll = "20ms"
"#
    )
}

/// Events accepted with one delivery each; a relay process dies between the receiver's 2xx
/// and its record; a healthy relay then delivers everything, the dead one's claims after its
/// lease, with the same idempotency key.
fn relay_crash(schema: Option<&PgSchema>) -> Report {
    let seed = Seed::from_env("crash relay-before-record");
    let events = scale(60);
    let skip = seed.rng(1).random_range(0..events / 2);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("relay.db");
    let database = schema.map_or_else(|| sqlite.to_str().unwrap().to_owned(), |s| s.url.clone());
    block_on(Duration::from_secs(120), async {
        let (receiver, at) = Receiver::start().await;
        std::fs::write(dir.path().join("oncebox.toml"), relay_config(at)).unwrap();
        let history = Arc::new(History::new());
        let mut gw = world::serve(dir.path(), &database, "127.0.0.1:0", &["--no-relay"]).start();
        let base = world::url(&gw);
        let c = world::client();
        for i in 0..events {
            world::deliver_until_done(&c, &history, &base, "shop", &format!("r{i}"), "v1").await;
        }
        gw.terminate();
        let mut relay = Spec::new(std::env::current_exe().unwrap())
            .env(CHILD, format!("relay|{database}|{at}|{skip}"))
            .start();
        let died = killed(tokio::task::block_in_place(|| relay.wait()));
        let before = receiver.per_key();
        let mut healthy = Spec::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["--database", &database, "relay"])
            .dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env("RUST_LOG", "info")
            .ready(Ready::Stderr("relay running".into()))
            .start();
        let delivered = || receiver.per_key().len() >= events;
        until_async("every event reaches the receiver", PATIENCE, delivered).await;
        let store = StoreCounts::new(&sqlite, schema).await;
        store.until_outbox("delivered", events).await;
        let mut fin = store.fin(true).await;
        healthy.terminate();
        // The effect is the receiver's: it honours the key, so its first application counts.
        fin.effects = receiver
            .applied()
            .into_iter()
            .map(|(k, bodies)| {
                let (source, id) = k.split_once(':').unwrap_or(("?", &k));
                (key(source, id), vec![world::tag_of(&bodies[0])])
            })
            .collect();
        let resent = receiver
            .per_key()
            .iter()
            .filter(|(k, n)| **n > 1 && before.get(*k).is_some_and(|b| *b >= 1))
            .count();
        Report {
            figures: check(&history.ops(), &fin),
            exercised: u64::from(died) * resent as u64,
            what: format!(
                "relay SIGKILLed after {skip} records; {resent} keys re-sent with the same key"
            ),
            expected_unresolved: 0,
        }
    })
}
