//! `oncebox redeliver`: makes an event's deliveries due again with the same idempotency key —
//! one event, or every event of a source received in a time window (operator replay after a
//! receiver lost data or was fixed).

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use oncebox_core::delivery::DeliveryState;
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore};
use oncebox_core::store::{EventFilter, EventStore};
use oncebox_core::{Clock, Key, Source, SystemClock, Timestamp};
use serde::Serialize;

use crate::cli::{Output, OutputArg};
use crate::exit::{self, Code, WithCode};
use crate::progress;
use crate::store::Store;

/// Largest page the stores list at once.
const PAGE: usize = 500;

/// Options of `oncebox redeliver`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["source", "all_of"]))]
pub struct RedeliverArgs {
    /// Source of the one event to redeliver.
    #[arg(requires = "event_id")]
    source: Option<String>,
    /// Event id of the one event to redeliver.
    event_id: Option<String>,
    /// Redeliver every stored event of this source instead of one.
    #[arg(long = "source", value_name = "SOURCE", conflicts_with = "event_id")]
    all_of: Option<String>,
    /// With --source: only events received since then, as a time ago (`2h`, `3d`) or an
    /// RFC 3339 time (`2024-05-01T00:00:00Z`).
    #[arg(long, requires = "all_of", value_parser = parse_since)]
    since: Option<Since>,
    /// With --source: only events whose record is in this state.
    #[arg(long, requires = "all_of", value_parser = ["completed", "rejected", "stale"])]
    state: Option<String>,
    /// With --source: count what would be redelivered, change nothing.
    #[arg(long, requires = "all_of")]
    dry_run: bool,
    #[command(flatten)]
    output: OutputArg,
}

/// A `--since` bound: a time ago is resolved against the clock when the command runs.
#[derive(Debug, Clone, Copy)]
enum Since {
    Ago(Duration),
    At(Timestamp),
}

fn parse_since(s: &str) -> Result<Since, String> {
    if let Ok(ago) = humantime::parse_duration(s) {
        return Ok(Since::Ago(ago));
    }
    let at = humantime::parse_rfc3339_weak(s)
        .map_err(|_| format!("{s:?} is neither a time ago (2h, 3d) nor an RFC 3339 time"))?;
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_millis();
    Ok(Since::At(Timestamp(i64::try_from(ms).unwrap_or(i64::MAX))))
}

/// What `--output json` prints; field names are a contract.
#[derive(Serialize)]
struct Summary {
    /// Events that matched; their deliveries were made due again (not with `dry_run`).
    events: u64,
    /// Deliveries made due again; with `dry_run`, those the run would make due.
    deliveries: u64,
    dry_run: bool,
}

pub async fn run(out: &mut impl Write, store: &Store, args: RedeliverArgs) -> Result<()> {
    let output = args.output.output;
    let summary = match (&args.source, &args.event_id, &args.all_of) {
        (Some(source), Some(event_id), _) => {
            let key = Key::parse(source, event_id)?;
            one(store, &key).await?
        }
        (_, _, Some(source)) => {
            let source = Source::new(source.as_str()).code(Code::Usage)?;
            many(store, &source, &args).await?
        }
        // clap's group makes every other combination a usage error before this runs.
        _ => return Err(exit::usage("name one event (SOURCE EVENT_ID) or --source")),
    };
    match output {
        Output::Json => writeln!(out, "{}", serde_json::to_string(&summary)?)?,
        Output::Text if summary.dry_run => writeln!(
            out,
            "{} deliveries of {} events would be due again (dry run: nothing changed)",
            summary.deliveries, summary.events
        )?,
        Output::Text => writeln!(
            out,
            "{} deliveries of {} events are due again (same keys)",
            summary.deliveries, summary.events
        )?,
    }
    // A dry run ends as the run would: a script tries it first and acts on its status.
    if summary.deliveries == 0 {
        return Err(exit::refused("nothing to redeliver"));
    }
    Ok(())
}

async fn one(store: &Store, key: &Key) -> Result<Summary> {
    // `redeliver` answers 0 both for an unknown key and one without deliveries; the two mean
    // different things to a script.
    if EventStore::event(store, key).await?.is_none() {
        return Err(exit::not_found(format!("no event {key}")));
    }
    let n = DeliveryStore::redeliver(store, key, SystemClock.now()).await?;
    Ok(Summary {
        events: 1,
        deliveries: n,
        dry_run: false,
    })
}

async fn many(store: &Store, source: &Source, args: &RedeliverArgs) -> Result<Summary> {
    let now = SystemClock.now();
    let since = args.since.map(|s| match s {
        Since::Ago(d) => now.minus(d),
        Since::At(t) => t,
    });
    // First the keys, then the work: the bar then knows its length, and redeliveries made
    // while listing cannot shift the pages being read.
    let listing = progress::spinner("listing events", true);
    let mut keys = Vec::new();
    let mut after = None;
    loop {
        let filter = EventFilter {
            source: Some(source.clone()),
            after,
            limit: PAGE,
        };
        let page = EventStore::events(store, filter).await?;
        for e in page.items {
            listing.inc(1);
            let recent = since.is_none_or(|t| e.received_at >= t);
            let state = args.state.as_deref().is_none_or(|s| e.state == s);
            if recent && state {
                keys.push(e.key);
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    listing.finish_and_clear();
    if keys.is_empty() {
        return Err(exit::not_found(format!("no matching events of {source}")));
    }
    let mut summary = Summary {
        events: keys.len() as u64,
        deliveries: 0,
        dry_run: args.dry_run,
    };
    if args.dry_run {
        summary.deliveries = would_be_due(store, &keys).await?;
        return Ok(summary);
    }
    let bar = progress::bar(keys.len() as u64, "redelivering");
    for (done, key) in keys.iter().enumerate() {
        // A rerun after a failure sends the first ones again under the same keys, which
        // receivers deduplicate; the error says how far this run got.
        let n = DeliveryStore::redeliver(store, key, SystemClock.now())
            .await
            .with_context(|| {
                format!("redelivering {key}, after {done} of {} events", keys.len())
            })?;
        summary.deliveries += n;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(summary)
}

/// What `redeliver` would make due for `keys`: every delivery of each event but those in
/// flight, which it leaves alone. An event that matched no route has none.
async fn would_be_due(store: &Store, keys: &[Key]) -> Result<u64> {
    let mut n = 0;
    for key in keys {
        let mut after = None;
        loop {
            let filter = DeliveryFilter {
                key: Some(key.clone()),
                after,
                limit: PAGE,
                ..DeliveryFilter::default()
            };
            let page = DeliveryStore::deliveries(store, filter).await?;
            n += page
                .items
                .iter()
                .filter(|d| d.state != DeliveryState::InFlight)
                .count() as u64;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    Ok(n)
}
