//! The outbox half of the crash, kill and database-fault scenarios: their gateways route every
//! event to one route, [`ROUTE`], with no relay running, so each stored event must hold exactly
//! one pending delivery there once the run is drained. The gateway commits an event's record and its
//! deliveries in one transaction; a crash between two separate commits would leave a record
//! without its delivery (the receiver never hears of an acknowledged event) or a delivery
//! without its record (the retry is stored and queued again).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use oncebox_core::delivery::{Backoff, RetryPolicy};
use oncebox_testkit::checker::{Figures, Final};
use oncebox_testkit::history::{Key, Op};

use crate::world::StoreCounts;

/// The route's name, the outbox's `destination`.
pub const ROUTE: &str = "sink";

/// Where the route points: a port nobody listens on. No relay runs, so nothing is ever sent;
/// the URL only has to pass validation, and if a relay did run it would reach no receiver.
const URL: &str = "http://127.0.0.1:9/hook";

/// The route for a gateway built in this process, taking every event of `sources`.
pub fn route(sources: &[&str]) -> oncebox_core::route::Route {
    oncebox_core::route::Route {
        name: ROUTE.into(),
        sources: sources
            .iter()
            .map(|s| oncebox_core::Source::new(*s).expect("a valid source name"))
            .collect(),
        filter: None,
        url: URL.into(),
        timeout: Duration::from_secs(1),
        signing_secret: None,
        idempotent: true,
        status_url: None,
        retry: RetryPolicy {
            max_attempts: 5,
            max_age: Duration::from_secs(3600),
            backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(1),
            },
        },
        concurrency: 1,
        rate: None,
        ca_pem: None,
    }
}

/// The same route as `oncebox.toml` declares it for `oncebox serve` (run with `--no-relay`).
/// No `[sources]`: the gateway stays in zero-configuration mode, taking any source unsigned.
pub fn toml(source: &str) -> String {
    format!("[routes.{ROUTE}]\nsources = [\"{source}\"]\nurl = \"{URL}\"\nidempotent = true\n")
}

/// The flags an `oncebox serve` started in a directory [`configure`]d needs: no relay, so
/// every delivery stays queued to be counted.
pub const NO_RELAY: &[&str] = &["--no-relay"];

/// Writes `dir/oncebox.toml` routing every event of `source` to [`ROUTE`], for an `oncebox
/// serve` started there with [`NO_RELAY`].
pub fn configure(dir: &Path, source: &str) {
    std::fs::write(dir.join("oncebox.toml"), toml(source)).expect("write oncebox.toml");
}

/// The figures of a drained run whose gateway routed every event to [`ROUTE`]: the checker's
/// over `ops` and what `store` holds, with what the outbox breaks added; and how many
/// deliveries were queued.
pub async fn figures(ops: &[Op], store: &StoreCounts) -> (Figures, usize) {
    let fin = store.fin(false).await;
    let mut figures = oncebox_testkit::checker::check(ops, &fin);
    let queued = check(&mut figures, &fin, store.queued(ROUTE).await);
    (figures, queued)
}

/// Adds to `figures` what the outbox breaks, given `fin` (the inbox read back: each completed
/// record one effect, its payload's tag) and `queued` (the deliveries on [`ROUTE`], as key and
/// payload tag): a stored event with no delivery is an L (acknowledged, yet its effect will
/// never reach the receiver); two deliveries, one of another payload than the event stored, or
/// one for an event not stored are a D (the receiver would apply the key again, or apply what
/// the inbox does not account for). Returns how many deliveries there were.
pub fn check(figures: &mut Figures, fin: &Final, queued: Vec<(Key, String)>) -> usize {
    let total = queued.len();
    let mut by_key: BTreeMap<Key, Vec<String>> = BTreeMap::new();
    for (k, tag) in queued {
        by_key.entry(k).or_default().push(tag);
    }
    let name = |k: &Key| format!("{}/{}", k.0, k.1);
    for (k, stored) in &fin.effects {
        let tags = by_key.remove(k).unwrap_or_default();
        match tags.len() {
            0 => figures
                .l
                .push(format!("{}: stored with no delivery on {ROUTE}", name(k))),
            1 => {}
            n => figures
                .d
                .push(format!("{}: {n} deliveries on {ROUTE}", name(k))),
        }
        if let Some(other) = tags.iter().find(|t| !stored.contains(t)) {
            figures.d.push(format!(
                "{}: delivery of payload {other} queued, {stored:?} stored",
                name(k)
            ));
        }
    }
    for (k, tags) in by_key {
        figures.d.push(format!(
            "{}: {} deliveries on {ROUTE} for an event not stored",
            name(&k),
            tags.len()
        ));
    }
    total
}
