//! The key's record inside the writer's transaction: read back (`existing`), finished with its
//! response, written terminal at once, and a conflict kept for audit.

use oncebox_core::{Event, Key, ProcessError, Response, Unavailable};
use rusqlite::{OptionalExtension, params};

use super::Existing;
use crate::lenient::{bytes, optional_bytes, unreadable};
use crate::stmts::Sql;
use crate::writer::{Cx, Fatal};

/// Whether the record `row`, whose fingerprint differs, is `event` fingerprinted the way an
/// earlier version took it: read only for events that say it may be (`Event::recheck`).
pub(super) fn stored_payload_matches(
    cx: &Cx<'_, '_>,
    row: i64,
    event: &Event,
) -> rusqlite::Result<bool> {
    if event.recheck.is_none() {
        return Ok(false);
    }
    let payload = cx
        .conn
        .prepare_cached("SELECT payload FROM oncebox_inbox WHERE id = ?1")?
        .query_row([row], |r| optional_bytes(r, 0))?;
    Ok(payload.is_some_and(|p| event.matches_payload(&p)))
}

/// The key's record, or why it no longer reads: a value of another type than oncebox writes.
pub(crate) fn existing(
    cx: &Cx<'_, '_>,
    key: &Key,
) -> rusqlite::Result<Option<Result<Existing, ProcessError>>> {
    let read = cx
        .stmt(Sql::Existing)?
        .query_row(params![key.source.as_str(), key.event_id.as_str()], |r| {
            Ok(Existing {
                id: r.get(0)?,
                fingerprint: bytes(r, 1)?,
                state: r.get(2)?,
                response: optional_bytes(r, 3)?,
                lease_expires_at: r.get(4)?,
                received_at: r.get(5)?,
            })
        })
        .optional();
    match read {
        Ok(found) => Ok(found.map(Ok)),
        // Answered for this key alone: as an error of the batch it would roll back every
        // event beside it, each time the sender retried.
        Err(e) if unreadable(&e) => Ok(Some(Err(ProcessError::Unavailable(Unavailable::Storage(
            format!("the stored record of {key} no longer reads: {e}"),
        ))))),
        Err(e) => Err(e),
    }
}

/// Marks the claimed record (by row id) terminal with its response.
pub(crate) fn finish(cx: &Cx<'_, '_>, row: i64, response: &Response) -> rusqlite::Result<()> {
    let body = (!response.body.is_empty()).then_some(&response.body);
    cx.stmt(Sql::Finish)?.execute(params![
        row,
        response.kind.as_str(),
        body,
        cx.stamp.millis()
    ])?;
    Ok(())
}

/// Writes a terminal record after the savepoint was rolled back (the claim went with it).
pub(super) fn record_terminal(
    cx: &Cx<'_, '_>,
    event: &Event,
    response: &Response,
) -> rusqlite::Result<()> {
    let body = (!response.body.is_empty()).then_some(&response.body);
    cx.stmt(Sql::RecordTerminal)?.execute(params![
        event.key.source.as_str(),
        event.key.event_id.as_str(),
        &event.fingerprint.as_bytes()[..],
        response.kind.as_str(),
        body,
        event.payload,
        cx.now.millis(),
        event.meta.content_type,
        event.meta.header_lines(),
        cx.stamp.millis()
    ])?;
    Ok(())
}

pub(super) fn record_conflict(cx: &Cx<'_, '_>, event: &Event, stored: &[u8]) -> Result<(), Fatal> {
    cx.conn
        .prepare_cached(
            "INSERT INTO oncebox_conflicts (source, event_id, stored_fingerprint,
               offered_fingerprint, payload, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            event.key.source.as_str(),
            event.key.event_id.as_str(),
            stored,
            &event.fingerprint.as_bytes()[..],
            event.payload,
            cx.now.millis()
        ])?;
    Ok(())
}
