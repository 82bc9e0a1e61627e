//! `oncebox events`, `inspect`, `stats` and `purge`: what the store holds, read straight from
//! the database, as text for people or as JSON whose field names match the admin API's.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use oncebox_core::retention::DEFAULT_RETENTION;
use oncebox_core::store::{EventFilter, EventStore, Page, StoredEvent};
use oncebox_core::{Clock, Key, RecordState, Retention, Source, SystemClock};
use oncebox_gateway::{response_document, rfc3339};
use serde::Serialize;

use crate::cli::Output;
use crate::config::Settings;
use crate::exit;
use crate::out::one_line;
use crate::progress;
use crate::store::Store;

/// One event of `events --output json`, as `GET /v1/events` shows it.
#[derive(Serialize)]
struct EventItem<'a> {
    seq: i64,
    source: &'a str,
    event_id: &'a str,
    state: &'a str,
    received_at: String,
    completed_at: Option<String>,
    fingerprint: Option<String>,
    content_type: Option<&'a str>,
    conflicts: i64,
}

/// A page of a listing: `next` is the cursor to pass as `--after`, as a string like the API's.
#[derive(Serialize)]
pub struct Listing<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

pub async fn events(
    out: &mut impl Write,
    store: &Store,
    filter: EventFilter,
    output: Output,
) -> Result<()> {
    let page = EventStore::events(store, filter).await?;
    match output {
        Output::Json => {
            let listing = Listing {
                items: page.items.iter().map(event_item).collect(),
                next: page.next.map(|n| n.to_string()),
            };
            writeln!(out, "{}", serde_json::to_string(&listing)?)?;
        }
        Output::Text => print_events(out, &page)?,
    }
    Ok(())
}

fn event_item(e: &StoredEvent) -> EventItem<'_> {
    EventItem {
        seq: e.seq,
        source: e.key.source.as_str(),
        event_id: e.key.event_id.as_str(),
        state: &e.state,
        received_at: rfc3339(e.received_at),
        completed_at: e.completed_at.map(rfc3339),
        fingerprint: e.fingerprint.map(|f| f.to_hex()),
        content_type: e.meta.content_type.as_deref(),
        conflicts: e.conflicts,
    }
}

fn print_events(out: &mut impl Write, page: &Page<StoredEvent>) -> Result<()> {
    for e in &page.items {
        writeln!(
            out,
            "{:>8}  {:<24} {:<12} {}  {}",
            e.seq,
            rfc3339(e.received_at),
            e.state,
            e.key.source,
            e.key.event_id
        )?;
    }
    if let Some(next) = page.next {
        writeln!(out, "more: --after {next}")?;
    }
    Ok(())
}

/// `inspect --output json`: the record of one key.
#[derive(Serialize)]
struct Inspected<'a> {
    source: &'a str,
    event_id: &'a str,
    /// `processing`, `completed`, `rejected`, `stale` or `uncertain`.
    state: &'a str,
    /// The first answer, replayed for duplicates, shaped as the admin API's; only for
    /// terminal records.
    response: Option<serde_json::Value>,
    received_at: String,
    completed_at: Option<String>,
    fingerprint: Option<String>,
}

pub async fn inspect(out: &mut impl Write, store: &Store, key: &Key, output: Output) -> Result<()> {
    let Some(record) = store.record(key).await? else {
        return Err(exit::not_found(format!("no record for {key}")));
    };
    let (state, response) = match &record.state {
        RecordState::Done(r) => (r.kind.as_str(), Some(response_document(r))),
        RecordState::Processing { .. } => ("processing", None),
        RecordState::Uncertain => ("uncertain", None),
    };
    let fingerprint = record.fingerprint.map(|f| f.to_hex());
    if output == Output::Json {
        let inspected = Inspected {
            source: key.source.as_str(),
            event_id: key.event_id.as_str(),
            state,
            response,
            received_at: rfc3339(record.received_at),
            completed_at: record.completed_at.map(rfc3339),
            fingerprint,
        };
        writeln!(out, "{}", serde_json::to_string(&inspected)?)?;
        return Ok(());
    }
    writeln!(out, "key         {key}")?;
    match response {
        Some(r) => writeln!(
            out,
            "state       {state} {}",
            one_line(r["body"].as_str().unwrap_or(""))
        )?,
        None => writeln!(out, "state       {state}")?,
    }
    writeln!(out, "received_at {}", rfc3339(record.received_at))?;
    writeln!(out, "fingerprint {}", fingerprint.unwrap_or_default())?;
    Ok(())
}

pub async fn stats(out: &mut impl Write, store: &Store, output: Output) -> Result<()> {
    let stats = EventStore::stats(store).await?;
    if output == Output::Json {
        writeln!(out, "{}", oncebox_gateway::stats_document(&stats))?;
        return Ok(());
    }
    for (state, n) in stats.every_state() {
        writeln!(out, "{state:<12} {n}")?;
    }
    writeln!(out, "{:<12} {}", "conflicts", stats.conflicts)?;
    writeln!(out, "{:<12} {}", "outbox", stats.outbox)?;
    // Rows no purge removes: the application's to watch.
    let k = stats.kept;
    writeln!(
        out,
        "kept         actions {}, versions {}, offsets {}",
        k.actions, k.versions, k.offsets
    )?;
    Ok(())
}

/// The retention a purge uses for sources without their own: with `[sources]`, those the
/// configuration does not name are kept ([`UNNAMED_KEPT`]). With no sources in the
/// configuration (none found where this runs: a cron job in another directory, an unset
/// `ONCEBOX_CONFIG`), the default would apply to every source whatever the gateway's own
/// configuration promises them, and could delete records their senders may still redeliver:
/// the retention must then be given.
pub fn purge_retention(settings: &Settings, given: Option<Duration>) -> Result<Option<Duration>> {
    match given {
        Some(retention) => {
            // `--retention` reaches every source the file does not name: all of them without
            // [sources], and with [sources] those of other gateways sharing the database (a
            // PostgreSQL serving several). Nothing says which of those are Stripe, GitHub or
            // Standard Webhooks ones, whose senders redeliver for days. Warned, not refused:
            // the file refuses a short retention only for a source whose preset it names, and
            // warns where the sender is only likely, as here. The sources it names keep their
            // own retention, checked against their presets when it was read.
            let (horizon, senders) = crate::config::longest_horizon();
            if retention < horizon {
                let reached = if settings.gateway.open_sources {
                    "no configuration naming [sources] was read (--config or ONCEBOX_CONFIG) to \
                     tell which sources use them"
                        .to_owned()
                } else {
                    let named: Vec<&str> = settings
                        .gateway
                        .sources
                        .keys()
                        .map(Source::as_str)
                        .collect();
                    format!(
                        "it applies to every source the configuration does not name in \
                         [sources] (it names {}), such as another gateway's sharing this \
                         database, whichever preset they use",
                        listed(&named)
                    )
                };
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: --retention {} is shorter than the {} that senders of the {} \
                     presets may redeliver for, and {reached}: a redelivery after the purge is \
                     taken as a new event and applied again",
                    humantime::format_duration(retention),
                    humantime::format_duration(horizon),
                    listed(&senders),
                );
            }
            // Warned as the same retention in the file is: a flag is no more deliberate.
            if retention < crate::config::SHORT_RETENTION {
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: --retention {} is shorter than a day; a sender's retry or an \
                     operator's resend after the purge is taken as a new event and applied again",
                    humantime::format_duration(retention)
                );
            }
            Ok(Some(retention))
        }
        None if settings.gateway.open_sources => anyhow::bail!(
            "the configuration names no [sources], so a purge cannot know the retention the \
             gateway keeps for them: run it with the gateway's configuration (--config or \
             ONCEBOX_CONFIG), or give --retention for every source"
        ),
        None => Ok(None),
    }
}

/// `a`, `a and b`, `a, b and c`.
fn listed(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// What a purge run with `[sources]` keeps the records of sources it does not name for: as good
/// as for ever. Such a source is another gateway's sharing the database (a PostgreSQL serving
/// several), whose retention and preset this configuration cannot know; purged after the
/// default 7 days, a Stripe source kept for 30 there would take a redelivery after the purge
/// as a new event. A source removed from the file keeps its records until a purge with
/// `--retention` reaches them.
pub(crate) const UNNAMED_KEPT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a purge keeps each source for: a named source its own retention; a consumer's source
/// the configuration does not name in `[sources]` the default 7 days (its messages are this
/// configuration's, as a named source's events are), or `given` (`--retention`, which reaches
/// every source the file does not name) when that is longer; any other source `given`, or
/// without one 7 days where the configuration names no `[sources]` and for good
/// ([`UNNAMED_KEPT`]) where it does.
///
/// A consumer's source is never kept shorter than 7 days: `oncebox consume` starts a new NATS
/// durable that far back (`consume::new_durable_horizon`), and cannot know of a shorter
/// `--retention` a cron job purges by, so the durable would read again messages whose records
/// were purged, and apply them again.
pub fn retention(settings: &Settings, given: Option<Duration>) -> Retention {
    let others = match given {
        Some(given) => given,
        None if settings.gateway.open_sources => DEFAULT_RETENTION,
        None => UNNAMED_KEPT,
    };
    let mut retention = Retention::new(others);
    let consumers = given.map_or(DEFAULT_RETENTION, |g| g.max(DEFAULT_RETENTION));
    for c in &settings.consumers {
        let _ = retention.set(c.rules.source.clone(), consumers, None);
    }
    for (source, policy) in &settings.gateway.sources {
        // The configuration was validated against each preset's horizon when it was loaded.
        let _ = retention.set(source.clone(), policy.retention, None);
    }
    retention
}

pub async fn purge(
    out: &mut impl Write,
    store: &Store,
    settings: &Settings,
    given: Option<Duration>,
    output: Output,
) -> Result<()> {
    let retention = retention(settings, given);
    // One store call does the whole purge in chunks; the spinner says it is alive.
    let spinner = progress::spinner("purging", false);
    let deleted = EventStore::purge(store, SystemClock.now(), &retention).await;
    spinner.finish_and_clear();
    let deleted = deleted?;
    match output {
        Output::Json => writeln!(out, "{}", serde_json::json!({ "purged": deleted }))?,
        Output::Text => writeln!(out, "purged {deleted} records")?,
    }
    Ok(())
}

/// The `--source` of a listing, checked.
pub fn source(name: Option<String>) -> Result<Option<Source>> {
    Ok(name.map(Source::new).transpose()?)
}
