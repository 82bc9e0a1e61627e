//! `process` inside the writer: claim the key, run the handler on the same transaction, store
//! the first response — or answer from the stored record without running the handler.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use oncebox_core::{
    Event, Fingerprint, LeaseSeen, OutboxMessage, ProcessError, Processed, Response, ResponseKind,
    Timestamp, Unavailable, lease_seen,
};
use rusqlite::params;

use crate::crash;
use crate::error::unavailable;
use crate::stmts::Sql;
use crate::tx::{HandlerError, Tx};
use crate::writer::{Body, Cx, Fatal, RAN_TWICE};

mod faults;
mod records;
pub(crate) use faults::{RAN_COMMIT, ROLLED_BACK};
use faults::{ended_by_handler, kept_with};
pub(crate) use records::{existing, finish};
use records::{record_conflict, record_terminal, stored_payload_matches};

/// The handler a caller gives `process`; it runs on the writer thread inside the event's
/// savepoint, so it must be quick and must not block on anything but this connection.
pub type Handler = Box<dyn FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send>;

/// A key's stored record, as the claim found it.
pub(crate) struct Existing {
    pub id: i64,
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub response: Option<Vec<u8>>,
    pub lease_expires_at: Option<i64>,
    pub received_at: i64,
}

/// What the claim decided.
pub(crate) enum Claim {
    /// The key is ours: a new record in state `processing`, or an expired lease taken over.
    /// Carries the record's row id, so finishing it needs no second index lookup.
    Fresh(i64),
    /// An expired lease taken over: ours now, but its holder may have run the outside effect.
    TakenOver(i64),
    /// Answered from the record; the handler must not run.
    Answered(Result<Processed, ProcessError>),
}

/// `process`'s request for a handler that runs once: it can run again (another request's
/// statement ended the transaction) only while its handler has not run.
pub(crate) struct Request {
    pub event: Event,
    pub handler: Option<Handler>,
}

impl Request {
    pub fn new<F>(event: Event, handler: F) -> Request
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + 'static,
    {
        Request {
            event,
            handler: Some(Box::new(handler)),
        }
    }
}

impl Body<Processed, ProcessError> for Request {
    fn call(&mut self, cx: &mut Cx<'_, '_>) -> Result<Result<Processed, ProcessError>, Fatal> {
        run(cx, &self.event, &mut self.handler)
    }

    fn again(&self) -> bool {
        self.handler.is_some()
    }
}

/// Claims the key, and runs `handler` (taking it) only for a key that is ours.
pub(crate) fn run(
    cx: &mut Cx<'_, '_>,
    event: &Event,
    handler: &mut Option<Handler>,
) -> Result<Result<Processed, ProcessError>, Fatal> {
    cx.savepoint()?;
    // A key without a record is written once, already terminal, after the handler: the single
    // writer holds the write lock from this read to the commit, so nobody can insert the key in
    // between, and a claim row followed by an update would write the record twice.
    let claimed = match existing(cx, &event.key)? {
        None => None,
        Some(Err(unreadable)) => {
            cx.release()?;
            return Ok(Err(unreadable));
        }
        Some(Ok(found)) => match decide(cx, event, found, None)? {
            Claim::Fresh(row) | Claim::TakenOver(row) => {
                crash::point!("after-inbox-insert");
                Some(row)
            }
            Claim::Answered(answer) => {
                cx.release()?;
                return Ok(answer);
            }
        },
    };
    let Some(handler) = handler.take() else {
        return Err(Fatal(Unavailable::Storage(RAN_TWICE.into())));
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        handler(&mut Tx::new(cx.conn, &event.key, cx.now, event.meta.hops()))
    }))
    .unwrap_or_else(|panic| {
        Err(HandlerError::failed(format!(
            "the handler panicked: {}",
            oncebox_core::consume::panic_message(&*panic)
        )))
    });
    if cx.ended() {
        return ended_by_handler(cx, outcome);
    }
    crash::point!("after-effect");
    let answer = match outcome {
        // SQLite would refuse the commit for it, and the whole batch with it: the handler's
        // work goes, the key stays free, and its caller hears a handler failure, as from
        // PostgreSQL, which checks at the handler's own commit.
        Ok(response) if response.kind == ResponseKind::Completed && cx.deferred_violations() => {
            cx.rollback_to()?;
            Err(ProcessError::Handler(crate::writer::DEFERRED_FK.into()))
        }
        Ok(response) if response.kind == ResponseKind::Completed => {
            let kept = match claimed {
                Some(row) => finish(cx, row, &response),
                None => record_terminal(cx, event, &response),
            };
            if claimed.is_none() && kept.is_ok() {
                crash::point!("after-inbox-insert");
            }
            kept_with(cx, kept, response)?
        }
        // A refusal or a stale verdict keeps nothing of the handler's work, only the record.
        Ok(response) => {
            cx.rollback_to()?;
            let kept = record_terminal(cx, event, &response);
            // A handler that answers `Stale` itself chose the body to store and replay.
            kept_with(cx, kept, response)?
        }
        Err(HandlerError::Stale) => {
            cx.rollback_to()?;
            record_terminal(cx, event, &Response::stale())?;
            Ok(Processed::Stale)
        }
        Err(HandlerError::Sql(e)) => match unavailable(&e) {
            Some(why) => return Err(Fatal(why)),
            None => {
                cx.rollback_to()?;
                Err(ProcessError::Handler(Box::new(e)))
            }
        },
        Err(HandlerError::Failed(e)) => match crate::error::storage_underneath(&*e) {
            Some(why) => return Err(Fatal(why)),
            None => {
                cx.rollback_to()?;
                Err(ProcessError::Handler(e))
            }
        },
    };
    cx.release()?;
    Ok(answer)
}

/// Claims the key with `INSERT … ON CONFLICT DO NOTHING`; on conflict, decides from the stored
/// record read back inside this transaction (never from an error or a timeout: G3). `lease`
/// is `Some((token, expires_at))` for the two-phase form.
pub(crate) fn claim(
    cx: &mut Cx<'_, '_>,
    event: &Event,
    lease: Option<(i64, i64)>,
) -> Result<Claim, Fatal> {
    let key = &event.key;
    let (token, expires) = lease.unzip();
    let inserted = cx
        .conn
        .prepare_cached(
            "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload, received_at,
               lease_token, lease_expires_at, content_type, headers)
             VALUES (?1, ?2, ?3, 'processing', ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (source, event_id) DO NOTHING",
        )?
        .execute(params![
            key.source.as_str(),
            key.event_id.as_str(),
            &event.fingerprint.as_bytes()[..],
            event.payload,
            cx.now.millis(),
            token,
            expires,
            event.meta.content_type,
            event.meta.header_lines()
        ])?;
    if inserted == 1 {
        return Ok(Claim::Fresh(cx.conn.last_insert_rowid()));
    }
    let existing = match existing(cx, key)? {
        Some(Ok(found)) => found,
        Some(Err(unreadable)) => return Ok(Claim::Answered(Err(unreadable))),
        None => {
            return Err(Fatal(oncebox_core::Unavailable::Storage(
                "claimed key vanished".into(),
            )));
        }
    };
    decide(cx, event, existing, lease)
}

/// `process` (which holds no lease of its own) finding a two-phase lease expired unfinished:
/// its holder may have made the outside call before it stopped, and a handler run now could
/// repeat the event's effect without knowing it, where `begin` would say `taken_over`. The key
/// is parked uncertain instead, fencing the old holder, for `resolve` (as a relay parks a
/// delivery taken over from a relay that stopped mid-attempt).
const PARK_EXPIRED: &str = "UPDATE oncebox_inbox SET state = 'uncertain', lease_token = NULL,
                              lease_expires_at = NULL WHERE id = ?1";

/// What a key's stored record answers: a conflict (recorded), a duplicate, uncertain, a live
/// lease — or, for an expired lease, the key taken over with `lease`'s new token.
fn decide(
    cx: &mut Cx<'_, '_>,
    event: &Event,
    existing: Existing,
    lease: Option<(i64, i64)>,
) -> Result<Claim, Fatal> {
    let (token, expires) = lease.unzip();
    if existing.fingerprint[..] != event.fingerprint.as_bytes()[..]
        && !stored_payload_matches(cx, existing.id, event)?
    {
        record_conflict(cx, event, &existing.fingerprint)?;
        let stored = Fingerprint::from_slice(&existing.fingerprint).unwrap_or(event.fingerprint);
        return Ok(Claim::Answered(Err(ProcessError::Conflict {
            stored,
            offered: event.fingerprint,
        })));
    }
    if let Some(kind) = ResponseKind::parse(&existing.state) {
        let body = existing.response.unwrap_or_default();
        return Ok(Claim::Answered(Ok(Processed::Duplicate(Response {
            kind,
            body,
        }))));
    }
    if existing.state == "uncertain" {
        return Ok(Claim::Answered(Err(ProcessError::Uncertain)));
    }
    // `processing`: a two-phase lease. Live → in progress; begun after now (the clock went
    // back) → re-anchored to one TTL from now, still in progress; expired → taken over, fenced
    // by a new token so the old holder can no longer complete.
    let expires_at = existing.lease_expires_at.unwrap_or(i64::MIN);
    let now = cx.now.millis();
    let until = match lease_seen(
        Timestamp(existing.received_at),
        Timestamp(expires_at),
        cx.now,
    ) {
        LeaseSeen::Live => Some(expires_at),
        LeaseSeen::Reanchor(until) => {
            cx.conn
                .prepare_cached(
                    "UPDATE oncebox_inbox SET received_at = ?2, lease_expires_at = ?3
                     WHERE id = ?1",
                )?
                .execute(params![existing.id, now, until.millis()])?;
            Some(until.millis())
        }
        LeaseSeen::Expired => None,
    };
    if let Some(until) = until {
        let wait = u64::try_from(until - now).unwrap_or(0);
        return Ok(Claim::Answered(Err(ProcessError::InProgress {
            retry_after: Duration::from_millis(wait),
        })));
    }
    if token.is_none() {
        cx.conn
            .prepare_cached(PARK_EXPIRED)?
            .execute([existing.id])?;
        tracing::warn!(key = %event.key, "{}", oncebox_core::PARKED_EXPIRED_LEASE);
        return Ok(Claim::Answered(Err(ProcessError::Uncertain)));
    }
    cx.conn
        .prepare_cached(
            "UPDATE oncebox_inbox SET lease_token = ?2, lease_expires_at = ?3, received_at = ?4
             WHERE id = ?1",
        )?
        .execute(params![existing.id, token, expires, cx.now.millis()])?;
    Ok(Claim::TakenOver(existing.id))
}

/// The gateway's ingest of an event without an ordering guard: the record is inserted already
/// terminal with its answer, and its deliveries queued — one write per new event instead of a
/// claim and an update. False when the key exists: the caller then goes the general way
/// (`run`), which answers duplicates, conflicts and leases exactly as `process` does.
///
/// It only reads what it is given: the caller keeps the event and its answer, and answers
/// `Applied` itself (`store.rs` says why).
///
/// No savepoint: nothing here is ever undone on its own. The insert is one statement (SQLite
/// undoes a failed statement by itself), and any later failure fails the whole batch. A
/// savepoint would only copy every page the event touches into the statement journal.
pub(crate) fn ingest_new(
    cx: &mut Cx<'_, '_>,
    event: &Event,
    accepted: &Response,
    messages: &[OutboxMessage],
) -> Result<bool, Fatal> {
    let inserted = cx.stmt(Sql::IngestNew)?.execute(params![
        event.key.source.as_str(),
        event.key.event_id.as_str(),
        &event.fingerprint.as_bytes()[..],
        (!accepted.body.is_empty()).then_some(&accepted.body),
        event.payload,
        cx.now.millis(),
        event.meta.content_type,
        event.meta.header_lines(),
        cx.stamp.millis()
    ])?;
    if inserted == 0 {
        return Ok(false);
    }
    crash::point!("after-inbox-insert");
    let mut tx = Tx::new(cx.conn, &event.key, cx.now, event.meta.hops());
    for m in messages {
        if let Err(e) = tx.enqueue_anew(m) {
            // Fixed SQL on a fresh key: a failure is the storage's, and fails the batch.
            return Err(match e {
                HandlerError::Sql(e) => Fatal(crate::error::storage(&e)),
                other => Fatal(oncebox_core::Unavailable::Storage(other.to_string())),
            });
        }
    }
    // The deliveries are this path's effect.
    crash::point!("after-effect");
    Ok(true)
}
