//! The storage seam of the gateway: the few domain verbs a backend offers to store verified
//! events once and show them to operators. Each backend implements it with its own SQL.

use std::future::Future;

use crate::clock::Timestamp;
use crate::event::{Event, Meta, OutboxMessage};
use crate::fingerprint::Fingerprint;
use crate::key::{Key, Source};
use crate::outcome::{ProcessError, Processed, Response, Unavailable};
use crate::retention::Retention;

/// The ordering guard's reading of an event: an event older than the newest version applied
/// for its entity is stored as stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub entity: String,
    pub version: i64,
}

/// A field the ordering guard reads has the wrong type: the entity must be a string or a
/// number, the version an integer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} is not {expected}")]
pub struct OrderFieldInvalid {
    /// The field's JSON pointer.
    pub field: String,
    /// What it must be: "a string" or "an integer".
    pub expected: &'static str,
}

/// One verified event to store, with the answers to keep for it.
#[derive(Debug, Clone)]
pub struct Ingest {
    pub event: Event,
    pub order: Option<Order>,
    /// The first answer for a new event, replayed for its duplicates.
    pub accepted: Vec<u8>,
    /// The answer when the ordering guard finds it stale, replayed likewise.
    pub stale: Vec<u8>,
    /// Routes that receive the event: one delivery each, committed with the event (a stale
    /// event gets none).
    pub routes: Vec<String>,
}

impl Ingest {
    /// The content type the event's deliveries carry: its own, or, when it has none or one no
    /// header can carry on (blank or past 1024 bytes), JSON's if the payload is JSON and
    /// `application/octet-stream` if not: a raw source's bytes are not labelled JSON.
    pub fn delivered_content_type(&self) -> &str {
        let own = self.event.meta.content_type.as_deref();
        match own.filter(|c| crate::event::header_field(c).is_ok()) {
            Some(own) => own,
            None if crate::json::parse(&self.event.payload).is_ok() => "application/json",
            None => "application/octet-stream",
        }
    }

    /// Whether each delivery this event queues could be sent: a route name a relay can name,
    /// the key as a header value (no space at its end). Checked by the stores before any write,
    /// so such an event fails alone as [`Invalid`](crate::Invalid), not its batch-mates with it
    /// as a storage error on every try.
    pub fn check(&self) -> Result<(), crate::Invalid> {
        use crate::event::{InvalidMessage, destination};
        if self.routes.is_empty() {
            return Ok(());
        }
        for route in &self.routes {
            destination(route).map_err(InvalidMessage::Destination)?;
        }
        // The key `{source}:{event_id}` as a header value: a source name and an event id are
        // short and hold no control character, so only an id's last space or tab is left to
        // refuse (a header loses it on the wire).
        if self.event.key.event_id.as_str().ends_with([' ', '\t']) {
            let why = "starts or ends with whitespace";
            return Err(InvalidMessage::IdempotencyKey(why).into());
        }
        Ok(())
    }

    /// The event's deliveries, one per route, each keyed `{source}:{event_id}` for every
    /// attempt, forever (do not change), with [`Ingest::delivered_content_type`].
    pub fn messages(&self) -> Vec<OutboxMessage> {
        let content_type = self.delivered_content_type().to_owned();
        self.routes
            .iter()
            .map(|route| OutboxMessage {
                destination: route.clone(),
                idempotency_key: self.event.key.to_string(),
                payload: self.event.payload.clone(),
                content_type: content_type.clone(),
            })
            .collect()
    }
}

/// A stored event as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Arrival order; the listing cursor.
    pub seq: i64,
    pub key: Key,
    /// `processing`, `completed`, `rejected`, `stale` or `uncertain`.
    pub state: String,
    pub response: Option<Response>,
    pub payload: Vec<u8>,
    pub meta: Meta,
    pub fingerprint: Option<Fingerprint>,
    pub received_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    /// Attempts to reuse the key with another payload.
    pub conflicts: i64,
}

/// Which events to list, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub source: Option<Source>,
    /// Only events after this `seq`.
    pub after: Option<i64>,
    pub limit: usize,
}

/// A page of a listing; `next` is the cursor of the following page, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<i64>,
}

impl<T> Page<T> {
    /// A page of at most `limit` items from rows fetched in cursor order with `LIMIT limit + 1`,
    /// each its cursor and its item (`None`: a row that no longer parses, skipped). The extra
    /// row only tells that a next page exists, and the cursor is the last row read, skipped or
    /// not: a page ending in skipped rows, or made only of them, still leads past them instead
    /// of ending the listing.
    pub fn from_rows<E>(
        rows: impl IntoIterator<Item = Result<(i64, Option<T>), E>>,
        limit: usize,
    ) -> Result<Page<T>, E> {
        let mut items = Vec::with_capacity(limit);
        let (mut read, mut last) = (0, None);
        for row in rows {
            if read == limit {
                return Ok(Page { items, next: last });
            }
            let (cursor, item) = row?;
            read += 1;
            last = Some(cursor);
            items.extend(item);
        }
        Ok(Page { items, next: None })
    }
}

/// Counts for operators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Inbox records per state.
    pub states: Vec<(String, i64)>,
    pub conflicts: i64,
    pub outbox: i64,
    /// Rows no purge removes, whose growth is the application's to watch.
    pub kept: Kept,
}

/// Every state an inbox record is stored in, in the order of its life.
pub const RECORD_STATES: [&str; 5] = ["processing", "uncertain", "completed", "rejected", "stale"];

impl Stats {
    /// Records per state, every state of [`RECORD_STATES`] named (0 where none is counted),
    /// then any other state found (a row edited by hand). A listing of the counted states
    /// alone changed its names from run to run: `jq .events.completed` read `null` for none.
    pub fn every_state(&self) -> Vec<(String, i64)> {
        let counted = |name: &str| self.states.iter().find(|(s, _)| s == name).map(|(_, n)| *n);
        let known = RECORD_STATES
            .iter()
            .map(|name| ((*name).to_owned(), counted(name).unwrap_or(0)));
        let other = self
            .states
            .iter()
            .filter(|(s, _)| !RECORD_STATES.contains(&s.as_str()))
            .cloned();
        known.chain(other).collect()
    }
}

/// Rows kept forever, because removing one would let what it guards happen again: action keys
/// (`Tx::once`), entity versions (`Tx::advance`, ordering guards) and offset watermarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    pub actions: i64,
    pub versions: i64,
    pub offsets: i64,
}

/// An attempt to reuse a key with another payload, kept for audit (the stored payload won).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRecord {
    /// Order of recording; the listing cursor.
    pub seq: i64,
    pub key: Key,
    pub stored_fingerprint: Option<Fingerprint>,
    pub offered_fingerprint: Option<Fingerprint>,
    /// The refused payload, as offered.
    pub payload: Vec<u8>,
    pub at: Timestamp,
}

/// Which conflicts to list, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConflictFilter {
    pub key: Option<Key>,
    /// Only conflicts after this `seq`.
    pub after: Option<i64>,
    pub limit: usize,
}

/// What arrived, for the operators' overview.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// Records per `(source, state)`, plus refused conflicting payloads per source under the
    /// state `conflict`; ordered by source, then state.
    pub counts: Vec<(String, String, i64)>,
    /// Events received since the asked instant per `(bucket start, source)`, ordered; empty
    /// buckets are absent.
    pub buckets: Vec<(Timestamp, String, i64)>,
}

/// What the gateway needs of a backend.
pub trait EventStore: Clone + Send + Sync + 'static {
    /// Stores the event once: a new key commits its record (and the ordering guard's version)
    /// before answering `Applied`; a committed key answers `Duplicate` with the stored answer.
    fn ingest(
        &self,
        ingest: Ingest,
    ) -> impl Future<Output = Result<Processed, ProcessError>> + Send;
    fn event(
        &self,
        key: &Key,
    ) -> impl Future<Output = Result<Option<StoredEvent>, Unavailable>> + Send;
    /// A page of events without their payloads, headers and response bodies (empty here;
    /// [`EventStore::event`] has them): a listing shows none of them.
    fn events(
        &self,
        filter: EventFilter,
    ) -> impl Future<Output = Result<Page<StoredEvent>, Unavailable>> + Send;
    fn stats(&self) -> impl Future<Output = Result<Stats, Unavailable>> + Send;
    fn purge(
        &self,
        now: Timestamp,
        retention: &Retention,
    ) -> impl Future<Output = Result<u64, Unavailable>> + Send;
    /// Refused conflicting payloads, oldest first.
    fn conflicts(
        &self,
        filter: ConflictFilter,
    ) -> impl Future<Output = Result<Page<ConflictRecord>, Unavailable>> + Send;
    /// Counts per source and state, and arrivals since `since` in buckets of `bucket`.
    fn activity(
        &self,
        since: Timestamp,
        bucket: std::time::Duration,
    ) -> impl Future<Output = Result<Activity, Unavailable>> + Send;
    /// Whether the store can take writes now (for `/readyz`).
    fn ready(&self) -> impl Future<Output = Result<(), Unavailable>> + Send;
}

#[cfg(test)]
mod tests {
    use super::{Ingest, Page, Stats};
    use crate::{Event, Key, Meta};

    #[test]
    fn stats_name_every_state_and_keep_unknown_ones() {
        let stats = Stats {
            states: vec![("completed".into(), 3), ("edited".into(), 1)],
            ..Stats::default()
        };
        let every = stats.every_state();
        let named: Vec<(&str, i64)> = every.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        assert_eq!(
            named,
            [
                ("processing", 0),
                ("uncertain", 0),
                ("completed", 3),
                ("rejected", 0),
                ("stale", 0),
                ("edited", 1)
            ]
        );
    }

    /// Every delivery of a stored event can be queued: a content type no header carries on
    /// (the gateway takes any the request had) becomes JSON's for a JSON payload and
    /// `application/octet-stream` for any other, so queuing never refuses it.
    #[test]
    fn deliveries_carry_the_events_content_type_or_the_payloads() {
        let raw = Event::new(
            Key::parse("shop", "e2").unwrap(),
            b"no \xff json".to_vec(),
            &crate::FingerprintMode::Raw,
        )
        .unwrap();
        for given in [None, Some("")] {
            let ingest = Ingest {
                event: raw.clone().with_meta(Meta::new(given.map(str::to_owned))),
                order: None,
                accepted: Vec::new(),
                stale: Vec::new(),
                routes: vec!["hooks".to_owned()],
            };
            let sent = &ingest.messages()[0];
            assert_eq!(sent.content_type, "application/octet-stream", "{given:?}");
            assert_eq!(sent.check(), Ok(()));
        }
        let ingest = |content_type: Option<&str>| Ingest {
            event: Event::json(Key::parse("shop", "e1").unwrap(), "{}")
                .unwrap()
                .with_meta(Meta::new(content_type.map(str::to_owned))),
            order: None,
            accepted: Vec::new(),
            stale: Vec::new(),
            routes: vec!["hooks".to_owned()],
        };
        let long = format!("text/plain; x={}", "a".repeat(1024));
        for (given, sent) in [
            (
                Some("text/plain; charset=utf-8"),
                "text/plain; charset=utf-8",
            ),
            (None, "application/json"),
            (Some(""), "application/json"),
            (
                Some("text/plain;\tcharset=utf-8"),
                "text/plain;\tcharset=utf-8",
            ),
            (Some(long.as_str()), "application/json"),
        ] {
            let messages = ingest(given).messages();
            assert_eq!(messages[0].content_type, sent, "{given:?}");
            assert_eq!(messages[0].idempotency_key, "shop:e1");
            assert_eq!(messages[0].check(), Ok(()));
        }
    }

    fn rows(spec: &[(i64, bool)]) -> Vec<Result<(i64, Option<i64>), ()>> {
        spec.iter()
            .map(|&(id, ok)| Ok((id, ok.then_some(id))))
            .collect()
    }

    #[test]
    fn a_page_cursor_leads_past_skipped_rows() {
        // limit 2, three rows fetched: a next page, after the second row.
        let p = Page::from_rows(rows(&[(1, true), (2, true), (3, true)]), 2).unwrap();
        assert_eq!((p.items, p.next), (vec![1, 2], Some(2)));
        // A skipped row still counts as read: the page is short but the listing goes on.
        let p = Page::from_rows(rows(&[(1, true), (2, false), (3, true)]), 2).unwrap();
        assert_eq!((p.items, p.next), (vec![1], Some(2)));
        // A page of skipped rows only: empty, and still a cursor past them.
        let p = Page::from_rows(rows(&[(1, false), (2, false), (3, true)]), 2).unwrap();
        assert_eq!((p.items, p.next), (vec![], Some(2)));
        // The last page: no extra row, no cursor.
        let p = Page::from_rows(rows(&[(5, true), (6, false)]), 2).unwrap();
        assert_eq!((p.items, p.next), (vec![5], None));
        let failed: Vec<Result<(i64, Option<i64>), &str>> = vec![Ok((1, Some(1))), Err("io")];
        assert_eq!(Page::from_rows(failed, 2), Err("io"));
    }
}
