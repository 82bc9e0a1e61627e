//! The relay SIGKILLed at random moments while it works through a backlog, on two routes at
//! once: one whose receiver honours the idempotency key, one whose receiver applies every
//! request it gets (a plain route, with a status URL). The kills land wherever they land —
//! mid-claim, mid-request, between the answer and its record — and a restarted relay takes
//! over after the lease. On the key-honouring route every event must be applied; on the plain
//! route no event may be applied twice (a delivery taken over mid-attempt is parked uncertain,
//! not sent again, and its status URL settles it). The receivers' applications are the effects
//! the checker reads: the plain receiver's every one, the other's first per key.

use std::sync::Arc;
use std::time::Duration;

use oncebox_testkit::checker::check;
use oncebox_testkit::child::{Proc, Ready, Spec, killed, until_async};
use oncebox_testkit::history::{History, key};
use oncebox_testkit::receiver::Receiver;
use oncebox_testkit::seed::Seed;
use rand::Rng;

use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, PgSchema, StoreCounts, block_on};

pub const RANDOM_RELAY_KILLS_SQLITE: Scenario = Scenario {
    name: "kills: relay SIGKILLed at random",
    backend: "sqlite",
    run: || Some(relay_kills(None)),
};

pub const RANDOM_RELAY_KILLS_POSTGRES: Scenario = Scenario {
    name: "kills: relay SIGKILLed at random",
    backend: "postgres",
    run: || {
        let schema = block_on(PATIENCE, world::pg_schema())?;
        Some(relay_kills(Some(&schema)))
    },
};

/// Attempts a relay records for a delivery it took over on the plain route and did not send
/// (`orphaned` in the relay), matched in their error text. (On the idempotent route a
/// takeover records one too, then sends again after the backoff.)
const ORPHANED: &str = "SELECT count(*) FROM oncebox_attempts a
     JOIN oncebox_outbox o ON o.id = a.delivery_id
     WHERE o.destination = 'plain' AND a.error LIKE '%stopped mid-attempt%'";

fn config(idem: std::net::SocketAddr, plain: std::net::SocketAddr) -> String {
    format!(
        r#"
[sources.a]
signature = "none"
event_id = {{ pointer = "/id" }}
[sources.b]
signature = "none"
event_id = {{ pointer = "/id" }}
[routes.idem]
sources = ["a"]
url = "http://{idem}/hook"
idempotent = true
timeout = "500ms"
backoff = {{ base = "50ms", cap = "200ms" }}
[routes.plain]
sources = ["b"]
url = "http://{plain}/hook"
idempotent = false
status_url = "http://{plain}/status/{{key}}"
timeout = "500ms"
backoff = {{ base = "50ms", cap = "200ms" }}
[relay]
lease = "1s"
poll = "20ms"
"#
    )
}

/// Events to both routes, stored first; then the relay, killed when the receivers have seen
/// each of a few random request counts and started again; then one left running until every
/// delivery is recorded delivered.
fn relay_kills(schema: Option<&PgSchema>) -> Report {
    let seed = Seed::from_env("random relay kills");
    let mut rng = seed.rng(3);
    let events = scale(150);
    let mut at: Vec<usize> = (0..scale(3))
        .map(|_| rng.random_range(1..2 * events))
        .collect();
    at.sort_unstable();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("relay.db");
    let database = schema.map_or_else(|| sqlite.to_str().unwrap().to_owned(), |s| s.url.clone());
    block_on(Duration::from_secs(180), async {
        let (idem, idem_at) = Receiver::start().await;
        let (plain, plain_at) = Receiver::start().await;
        std::fs::write(dir.path().join("oncebox.toml"), config(idem_at, plain_at)).unwrap();
        let history = Arc::new(History::new());
        let mut gw = world::serve(dir.path(), &database, "127.0.0.1:0", &["--no-relay"]).start();
        let base = world::url(&gw);
        let c = world::client();
        for i in 0..events {
            for source in ["a", "b"] {
                world::deliver_until_done(&c, &history, &base, source, &format!("e{i}"), "v1")
                    .await;
            }
        }
        gw.terminate();
        let relay = Spec::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["--database", &database, "relay"])
            .dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env("RUST_LOG", "warn,oncebox=info")
            .ready(Ready::Stderr("relay running".into()))
            .log(&dir.path().join("relay.log"));
        let requests = || idem.requests() + plain.requests();
        let mut kills = 0;
        let mut running: Proc = relay.start();
        for threshold in &at {
            until_async("the relay works through the backlog", PATIENCE, || {
                requests() >= *threshold
            })
            .await;
            kills += usize::from(killed(running.kill()));
            running = relay.start();
        }
        let store = StoreCounts::new(&sqlite, schema).await;
        // Reconciliation asks a status URL 10 s after a delivery became uncertain at the
        // earliest: the last of them settles within the patience.
        store.until_outbox("delivered", 2 * events).await;
        running.terminate();
        let orphaned = store.count(ORPHANED).await;
        let mut fin = store.fin(true).await;
        // The plain receiver applies every request; the other honours the key.
        fin.effects = plain
            .applied()
            .into_iter()
            .map(|(k, bodies)| (k, bodies.iter().map(|b| world::tag_of(b)).collect()))
            .chain(
                idem.applied()
                    .into_iter()
                    .map(|(k, bodies)| (k, vec![world::tag_of(&bodies[0])])),
            )
            .map(|(k, tags)| {
                let (source, id) = k.split_once(':').unwrap_or(("?", &k));
                (key(source, id), tags)
            })
            .collect();
        let resent = idem.per_key().values().filter(|n| **n > 1).count();
        Report {
            figures: check(&history.ops(), &fin),
            // A kill proves something only if it fell on work under way: a key the idempotent
            // route sent again, or a plain delivery taken over unsent.
            exercised: if kills > 0 {
                (resent + orphaned) as u64
            } else {
                0
            },
            what: format!(
                "{kills} kills at receiver requests {at:?}; idempotent route: {resent} keys sent \
                 again; plain route: {orphaned} deliveries taken over unsent and settled by \
                 its status URL"
            ),
            expected_unresolved: 0,
        }
    })
}
