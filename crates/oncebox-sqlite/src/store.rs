//! `EventStore` on SQLite: the gateway's verbs as `process` with a handler that applies the
//! ordering guard, and listings read from reader connections.

use oncebox_core::store::{
    Activity, ConflictFilter, ConflictRecord, EventFilter, EventStore, Ingest, Page, Stats,
    StoredEvent,
};
use std::sync::Arc;

use oncebox_core::{
    Event, Fingerprint, Key, Meta, OutboxMessage, ProcessError, Processed, Response, ResponseKind,
    Retention, Source, Timestamp, Unavailable,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::Error;
use crate::inbox::{Inbox, Look};
use crate::process;
use crate::tx::{HandlerError, Tx};
use crate::writer::{Cx, again};

/// Listings never return more than this many events at once.
pub const MAX_PAGE: usize = 500;

pub(crate) fn unavailable(e: Error) -> Unavailable {
    match e {
        Error::Unavailable(u) => u,
        Error::Sql(e) => Unavailable::Storage(e.to_string()),
    }
}

const COLUMNS: &str = "i.id, i.source, i.event_id, i.state, i.response, i.payload, i.content_type,
    i.headers, i.fingerprint, i.received_at, i.completed_at,
    (SELECT count(*) FROM oncebox_conflicts c WHERE c.source = i.source AND c.event_id = i.event_id)";

/// [`COLUMNS`] for listings: no response, payload or headers. A page holds up to 500 events
/// of up to `max_body` each, and nothing that lists them shows those (one event's view does).
const LISTED: &str = "i.id, i.source, i.event_id, i.state, NULL, NULL, i.content_type,
    NULL, i.fingerprint, i.received_at, i.completed_at,
    (SELECT count(*) FROM oncebox_conflicts c WHERE c.source = i.source AND c.event_id = i.event_id)";

fn stored(r: &Row<'_>) -> rusqlite::Result<Option<StoredEvent>> {
    let (source, event_id): (String, String) = (r.get(1)?, r.get(2)?);
    // Rows are written only from validated keys; one that no longer validates is skipped
    // rather than shown under a made-up name.
    let Ok(key) = Key::parse(&source, &event_id) else {
        return Ok(None);
    };
    let state: String = r.get(3)?;
    let response = ResponseKind::parse(&state).map(|kind| Response {
        kind,
        body: r
            .get::<_, Option<Vec<u8>>>(4)
            .ok()
            .flatten()
            .unwrap_or_default(),
    });
    let headers: Option<String> = r.get(7)?;
    Ok(Some(StoredEvent {
        seq: r.get(0)?,
        key,
        state,
        response,
        payload: r.get::<_, Option<Vec<u8>>>(5)?.unwrap_or_default(),
        meta: Meta::from_header_lines(r.get(6)?, headers),
        fingerprint: Fingerprint::from_slice(&r.get::<_, Vec<u8>>(8)?),
        received_at: Timestamp(r.get(9)?),
        completed_at: r.get::<_, Option<i64>>(10)?.map(Timestamp),
        conflicts: r.get(11)?,
    }))
}

fn one(c: &Connection, key: &Key) -> rusqlite::Result<Option<StoredEvent>> {
    c.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM oncebox_inbox i WHERE i.source = ?1 AND i.event_id = ?2"
    ))?
    .query_row(params![key.source.as_str(), key.event_id.as_str()], stored)
    .optional()
    .map(Option::flatten)
}

fn page(
    c: &Connection,
    source: Option<&Source>,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Page<StoredEvent>> {
    let limit = limit.clamp(1, MAX_PAGE);
    let mut q = c.prepare_cached(&format!(
        "SELECT {LISTED} FROM oncebox_inbox i
         WHERE (?1 IS NULL OR i.source = ?1) AND i.id > ?2 ORDER BY i.id LIMIT ?3"
    ))?;
    // One row more than asked tells whether there is a next page.
    let rows = q.query_map(
        params![source.map(Source::as_str), after, limit as i64 + 1],
        |r| Ok((r.get(0)?, stored(r)?)),
    )?;
    Page::from_rows(rows, limit)
}

fn stats(c: &Connection) -> rusqlite::Result<Stats> {
    let mut q = c.prepare_cached(
        "SELECT state, count(*) FROM oncebox_inbox GROUP BY state ORDER BY state",
    )?;
    let states = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let conflicts = c.query_row("SELECT count(*) FROM oncebox_conflicts", [], |r| r.get(0))?;
    let outbox = c.query_row("SELECT count(*) FROM oncebox_outbox", [], |r| r.get(0))?;
    let count =
        |table: &str| c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0));
    let kept = oncebox_core::store::Kept {
        actions: count("oncebox_actions")?,
        versions: count("oncebox_versions")?,
        offsets: count("oncebox_offsets")?,
    };
    Ok(Stats {
        states,
        conflicts,
        outbox,
        kept,
    })
}

/// What the writer reads of an event it ingests, while the request keeps it (`ingest_unordered`).
struct Unordered {
    event: Event,
    accepted: Response,
    messages: Vec<OutboxMessage>,
}

impl Inbox {
    /// An event without an ordering guard: a new key needs one write; a known key (duplicate,
    /// conflict, lease) takes the general path in the same writer request.
    ///
    /// The request keeps the event and its answer, and the writer only reads them (`Arc`):
    /// everything the request allocated is freed by the request again, and the writer
    /// allocates nothing to answer a new key. Handed to the writer, the event's blocks were
    /// freed there and collected back by the request threads' allocator, a cache miss per
    /// block on both sides (about 1 µs of request-thread CPU per new event in the gateway
    /// benchmark's profile, beside the writer's own frees).
    async fn ingest_unordered(
        &self,
        event: Event,
        accepted: Vec<u8>,
        messages: Vec<OutboxMessage>,
    ) -> Result<Processed, ProcessError> {
        // Before anything is read of the key: an answer read before a purge is not remembered
        // after it.
        let since = self.recent_generation();
        let look = self.committed_duplicate(&event);
        if let Look::Found(first) = look {
            return Ok(Processed::Duplicate(first));
        }
        let ours = Arc::new(Unordered {
            event,
            accepted: Response::completed(accepted),
            messages,
        });
        let theirs = Arc::clone(&ours);
        // `None`: applied, with the answer the request holds.
        let out = self
            .submit_fated(again(move |cx: &mut Cx<'_, '_>| {
                let u = &*theirs;
                let new = process::ingest_new(cx, &u.event, &u.accepted, &u.messages)?;
                if new {
                    return Ok(Ok(None));
                }
                let (accepted, messages) = (u.accepted.clone(), u.messages.clone());
                let handler = move |tx: &mut Tx<'_>| {
                    for m in &messages {
                        // A new event's own deliveries, under its own keys: queued now.
                        let _ = tx.enqueue_anew(m)?;
                    }
                    Ok(accepted)
                };
                let mut handler: Option<process::Handler> = Some(Box::new(handler));
                process::run(cx, &u.event, &mut handler).map(|out| out.map(Some))
            }))
            .await;
        // The writer let go of its share before answering (`writer/job.rs`). Only a request
        // whose answer the caller stopped waiting for (a passed deadline, a closed store) may
        // still be held: its answer is a failure, so the answer is never copied there.
        match Arc::try_unwrap(ours) {
            Ok(Unordered {
                event, accepted, ..
            }) => {
                let out = out.map(|done| done.unwrap_or(Processed::Applied(accepted)));
                self.unordered_answer(out, &look, &event, since)
            }
            Err(shared) => {
                let out = out.map(|done| {
                    done.unwrap_or_else(|| Processed::Applied(shared.accepted.clone()))
                });
                self.unordered_answer(out, &look, &shared.event, since)
            }
        }
    }

    /// What `ingest_unordered` answers once the writer did: told to the look's gate, a
    /// committed duplicate read when the writer could not answer, remembered when committed.
    fn unordered_answer(
        &self,
        out: Result<Processed, ProcessError>,
        look: &Look,
        event: &Event,
        since: u64,
    ) -> Result<Processed, ProcessError> {
        if matches!(look, Look::Skipped) {
            self.skipped_look(&out);
        }
        // When the look was skipped and the writer cannot answer (the file locked, say), a
        // committed duplicate is still answered from a reader.
        let out = self.or_committed(out, &event.key, &event.fingerprint);
        self.settled(out, &event.key, event.fingerprint, since)
    }
}

impl EventStore for Inbox {
    async fn ingest(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        // The event first, with the answer its record keeps: its deliveries copy the payload
        // once per route.
        self.refuse_too_large_answered(&ingest.event, &[&ingest.accepted, &ingest.stale])?;
        ingest.check().map_err(ProcessError::Invalid)?;
        let messages = ingest.messages();
        self.refuse_too_large_deliveries(&ingest.event, &messages)?;
        let Ingest {
            event,
            order,
            accepted,
            stale,
            ..
        } = ingest;
        // Entities are namespaced by source: two senders' order ids are unrelated.
        let namespace = event.key.source.as_str().to_owned();
        let Some(order) = order else {
            return self.ingest_unordered(event, accepted, messages).await;
        };
        // Code that can run again: a batch-mate's statement ending the transaction does not
        // fail it.
        self.process_again(event, move |tx| {
            match tx.advance(&namespace, &order.entity, order.version) {
                // Stale: only the record is kept, and no delivery is queued.
                Err(HandlerError::Stale) => {
                    return Ok(Response {
                        kind: ResponseKind::Stale,
                        body: stale.clone(),
                    });
                }
                other => other?,
            }
            for m in &messages {
                // A new event's own deliveries, under its own keys: queued now.
                let _ = tx.enqueue_anew(m)?;
            }
            Ok(Response::completed(accepted.clone()))
        })
        .await
    }

    async fn event(&self, key: &Key) -> Result<Option<StoredEvent>, Unavailable> {
        let key = key.clone();
        self.read(move |c| one(c, &key)).await.map_err(unavailable)
    }

    async fn events(&self, filter: EventFilter) -> Result<Page<StoredEvent>, Unavailable> {
        self.read(move |c| {
            page(
                c,
                filter.source.as_ref(),
                filter.after.unwrap_or(0),
                filter.limit,
            )
        })
        .await
        .map_err(unavailable)
    }

    async fn stats(&self) -> Result<Stats, Unavailable> {
        self.read(stats).await.map_err(unavailable)
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Unavailable> {
        Inbox::purge(self, now, retention)
            .await
            .map_err(unavailable)
    }

    async fn conflicts(&self, filter: ConflictFilter) -> Result<Page<ConflictRecord>, Unavailable> {
        self.read(move |c| crate::read::conflicts(c, &filter))
            .await
            .map_err(unavailable)
    }

    async fn activity(
        &self,
        since: Timestamp,
        bucket: std::time::Duration,
    ) -> Result<Activity, Unavailable> {
        let bucket_ms = i64::try_from(bucket.as_millis()).unwrap_or(i64::MAX);
        self.read(move |c| crate::read::activity(c, since, bucket_ms))
            .await
            .map_err(unavailable)
    }

    /// Ready when the writer can commit a write now: a locked or failing file, a full disk, or
    /// a stuck writer makes the gateway unready instead of answering 503s one by one. The probe
    /// changes a row of its own: a transaction that changes nothing writes nothing to the log,
    /// and its `COMMIT` succeeded on a full disk while every event was refused.
    async fn ready(&self) -> Result<(), Unavailable> {
        self.write(|c| {
            c.execute(
                "INSERT INTO oncebox_meta (name, value) VALUES ('ready_probe', 1) \
                 ON CONFLICT (name) DO UPDATE SET value = value + 1",
                [],
            )
            .map(drop)
        })
        .await
        .map_err(unavailable)
        // The probe's own commit unconfirmed is storage trouble, not an event's: nobody will
        // send the probe again to learn what became of it.
        .map_err(|e| match e {
            Unavailable::CommitUnknown(why) => Unavailable::Storage(why),
            other => other,
        })
    }
}
