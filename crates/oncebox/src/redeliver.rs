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
    /// Redeliver every stored event of this source instead of one; with --since, --all or
    /// --dry-run. Forgotten, a window would send the source's whole history again, delivered
    /// and uncertain deliveries too.
    #[arg(long = "source", value_name = "SOURCE", conflicts_with = "event_id")]
    all_of: Option<String>,
    /// With --source: every stored event of the source, however old.
    #[arg(long, requires = "all_of", conflicts_with = "since")]
    all: bool,
    /// With --source: only events received since then, as a time ago (`2h`, `3d`) or an
    /// RFC 3339 time with its zone (`2024-05-01T00:00:00Z`, `2024-05-01T02:00:00+02:00`).
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

impl RedeliverArgs {
    /// The output asked for.
    pub fn output(&self) -> Output {
        self.output.output
    }

    /// Refuses `--source` with no window, before the store is opened: `--since`, `--all` or
    /// `--dry-run` must say how much of the source's history is meant. (Checked here rather
    /// than by clap, whose usage line then showed the window as needed for one event too.)
    pub fn check(&self) -> Result<()> {
        if self.all_of.is_some() && self.since.is_none() && !self.all && !self.dry_run {
            return Err(exit::usage(
                "redeliver --source needs --since (a window), --all (every stored event of the \
                 source, however old) or --dry-run (count only)",
            ));
        }
        Ok(())
    }
}

/// A `--since` bound: a time ago is resolved against the clock when the command runs.
#[derive(Debug, Clone, Copy)]
enum Since {
    Ago(Duration),
    At(Timestamp),
}

/// A time ago, or an RFC 3339 time with its zone: `Z` or an offset. One without a zone is
/// refused rather than read as UTC: an operator east or west of it would redeliver hours of
/// events too many or miss as many.
fn parse_since(s: &str) -> Result<Since, String> {
    if let Ok(ago) = humantime::parse_duration(s) {
        return Ok(Since::Ago(ago));
    }
    let neither = || format!("{s:?} is neither a time ago (2h, 3d) nor an RFC 3339 time");
    let (local, offset_s) = if let Some(local) = s.strip_suffix(['Z', 'z']) {
        (local, 0)
    } else if let Some((local, offset_s)) = utc_offset(s) {
        (local, offset_s)
    } else if humantime::parse_rfc3339_weak(s).is_ok() {
        return Err(format!(
            "{s:?} has no zone: end it with Z for UTC, or with its offset (+02:00)"
        ));
    } else {
        return Err(neither());
    };
    let at = humantime::parse_rfc3339_weak(local).map_err(|_| neither())?;
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_millis();
    let ms = i64::try_from(ms)
        .unwrap_or(i64::MAX)
        .saturating_sub(offset_s * 1000);
    if ms < 0 {
        return Err(format!("{s:?} is before 1970"));
    }
    Ok(Since::At(Timestamp(ms)))
}

/// `s` without its trailing `+HH:MM` or `-HH:MM`, and that offset east of UTC in seconds.
fn utc_offset(s: &str) -> Option<(&str, i64)> {
    let at = s.len().checked_sub(6)?;
    let (local, offset) = (s.get(..at)?, s.get(at..)?.as_bytes());
    let sign = match offset[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = [offset[1], offset[2], offset[4], offset[5]];
    if offset[3] != b':' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let [h1, h2, m1, m2] = digits.map(|d| i64::from(d - b'0'));
    let (hours, minutes) = (h1 * 10 + h2, m1 * 10 + m2);
    (hours < 24 && minutes < 60).then_some((local, sign * (hours * 3600 + minutes * 60)))
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
    if summary.events == 0 {
        return Err(exit::refused("nothing to redeliver: no event matches"));
    }
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
    let mut listed = 0_u64;
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
            listed += 1;
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
    // A source with no events is unknown to the store (3, as an unknown event is); one whose
    // events the filters all pass over has nothing to redeliver (5, as a run with no
    // deliveries due): a script run every hour then tells a quiet hour from a wrong name.
    if listed == 0 {
        return Err(exit::not_found(format!("no events of {source}")));
    }
    if keys.is_empty() {
        // Answered with its summary as any run with nothing due (5): a script reading the
        // JSON gets the same document whichever way nothing matched.
        return Ok(Summary {
            events: 0,
            deliveries: 0,
            dry_run: args.dry_run,
        });
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

#[cfg(test)]
mod tests {
    use super::{Since, parse_since};

    fn at(s: &str) -> i64 {
        match parse_since(s) {
            Ok(Since::At(t)) => t.0,
            other => panic!("{s}: {other:?}"),
        }
    }

    /// One instant, however its zone is written; a time without one is refused.
    #[test]
    fn since_reads_a_times_zone_and_refuses_one_without() {
        let utc = at("2024-05-01T00:00:00Z");
        assert_eq!(utc, 1_714_521_600_000);
        assert_eq!(at("2024-05-01T02:00:00+02:00"), utc);
        assert_eq!(at("2024-04-30T19:30:00-04:30"), utc);
        assert_eq!(at("2024-05-01 00:00:00.250z"), utc + 250);
        for no_zone in ["2024-05-01T00:00:00", "2024-05-01 02:00:00"] {
            let refused = parse_since(no_zone).unwrap_err();
            assert!(refused.contains("has no zone"), "{refused}");
        }
        for bad in [
            "2024-05-01T00:00:00+24:00",
            "2024-05-01T00:00:00+02:60",
            "2024-05-01T00:00:00+0200",
            "yesterday",
            "+02:00",
            "1970-01-01T00:30:00+01:00",
        ] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
        assert!(matches!(parse_since("2h"), Ok(Since::Ago(_))));
    }
}
