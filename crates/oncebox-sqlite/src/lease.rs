//! The two-phase form inside the writer: `begin` takes a fenced lease, then `complete`,
//! `release` or `uncertain`; an operator's `resolve` settles an uncertain key.

use std::time::Duration;

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ProcessError, Processed, Resolution, Response,
};
use rusqlite::{OptionalExtension, params};

use crate::process::{Claim, claim};
use crate::writer::{Cx, Fatal};

pub(crate) fn begin(
    cx: &mut Cx<'_, '_>,
    event: &Event,
    ttl: Duration,
) -> Result<Result<Begun, ProcessError>, Fatal> {
    let token = cx.next_fence()?;
    let expires_at = cx.now.plus(ttl);
    cx.savepoint()?;
    let claimed = claim(cx, event, Some((token, expires_at.millis())))?;
    cx.release()?;
    Ok(match claimed {
        Claim::Fresh(_) | Claim::TakenOver(_) => Ok(Begun::Leased(Lease {
            key: event.key.clone(),
            token,
            expires_at,
            taken_over: matches!(claimed, Claim::TakenOver(_)),
        })),
        Claim::Answered(Ok(Processed::Duplicate(r))) => Ok(Begun::Duplicate(r)),
        Claim::Answered(Ok(other)) => {
            // A claim that found a record answers Duplicate or an error; nothing else.
            Err(ProcessError::Handler(
                format!("unexpected claim answer {other:?}").into(),
            ))
        }
        Claim::Answered(Err(e)) => Err(e),
    })
}

/// Completes only while the lease is live and still this holder's: an expired holder is fenced
/// even if nobody has taken over yet, because someone may be about to. The completing token
/// stays on the record, so the holder repeating its completion (its reply was lost) is told
/// `Ok` again, and the first response stays.
pub(crate) fn complete(
    cx: &mut Cx<'_, '_>,
    lease: &Lease,
    response: &Response,
) -> Result<Result<(), LeaseError>, Fatal> {
    let key = (lease.key.source.as_str(), lease.key.event_id.as_str());
    let (state, row): (String, i64) = match cx
        .conn
        .prepare_cached(
            "SELECT CASE WHEN state = 'processing' AND lease_expires_at > ?4 THEN 'live'
                         WHEN state NOT IN ('processing', 'uncertain') THEN 'done'
                         ELSE 'other' END, id
             FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2 AND lease_token = ?3",
        )?
        .query_row(params![key.0, key.1, lease.token, cx.now.millis()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?
    {
        Some(found) => found,
        None => return Ok(Err(LeaseError::Fenced)),
    };
    match state.as_str() {
        "live" => {
            // As `finish`, but the token stays.
            let body = (!response.body.is_empty()).then_some(&response.body);
            let kept = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_inbox SET state = ?2, response = ?3, completed_at = ?4,
                       lease_expires_at = NULL
                     WHERE id = ?1",
                )?
                .execute(params![
                    row,
                    response.kind.as_str(),
                    body,
                    cx.stamp.millis()
                ]);
            // The statement failed whole, so nothing of it is in the transaction: this
            // request's answer, not its batch's failure (which every retry repeated, failing
            // the requests beside it each time).
            match kept {
                Err(e) if too_big(&e) => Ok(Err(LeaseError::TooLarge(format!(
                    "a response of {} bytes with the record: {e}",
                    response.body.len()
                )))),
                kept => kept.map(|_| Ok(())).map_err(Fatal::from),
            }
        }
        "done" => Ok(Ok(())),
        _ => Ok(Err(LeaseError::Fenced)),
    }
}

/// Frees the key (the external call failed). Allowed after expiry while nobody took over: it
/// only makes the key available sooner.
pub(crate) fn release(cx: &mut Cx<'_, '_>, lease: &Lease) -> Result<Result<(), LeaseError>, Fatal> {
    let n = cx
        .conn
        .prepare_cached(
            "DELETE FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2
               AND state = 'processing' AND lease_token = ?3",
        )?
        .execute(params![
            lease.key.source.as_str(),
            lease.key.event_id.as_str(),
            lease.token
        ])?;
    Ok(if n == 1 {
        Ok(())
    } else {
        Err(LeaseError::Fenced)
    })
}

/// Parks the key: the external call's outcome is unknown, so it is neither retried nor done
/// until reconciled. The token stays on the parked record, so the holder repeating the call
/// (its reply was lost) matches again and is told `Ok`; `resolve` clears or deletes it.
pub(crate) fn uncertain(
    cx: &mut Cx<'_, '_>,
    lease: &Lease,
) -> Result<Result<(), LeaseError>, Fatal> {
    let n = cx
        .conn
        .prepare_cached(
            "UPDATE oncebox_inbox SET state = 'uncertain', lease_expires_at = NULL
             WHERE source = ?1 AND event_id = ?2 AND state IN ('processing', 'uncertain')
               AND lease_token = ?3",
        )?
        .execute(params![
            lease.key.source.as_str(),
            lease.key.event_id.as_str(),
            lease.token
        ])?;
    Ok(if n == 1 {
        Ok(())
    } else {
        Err(LeaseError::Fenced)
    })
}

/// Settles an `uncertain` key; returns false when the key is not uncertain.
pub(crate) fn resolve(
    cx: &mut Cx<'_, '_>,
    key: &Key,
    resolution: &Resolution,
) -> Result<Result<bool, crate::Error>, Fatal> {
    let n = match resolution {
        Resolution::Completed(response) => match cx
            .conn
            .prepare_cached(
                "UPDATE oncebox_inbox SET state = ?3, response = ?4, completed_at = ?5,
                   lease_token = NULL
                 WHERE source = ?1 AND event_id = ?2 AND state = 'uncertain'",
            )?
            .execute(params![
                key.source.as_str(),
                key.event_id.as_str(),
                response.kind.as_str(),
                response.body,
                cx.stamp.millis()
            ]) {
            // As in `complete`: the operator's answer, not the batch's failure.
            Err(e) if too_big(&e) => return Ok(Err(crate::Error::Sql(e))),
            n => n?,
        },
        Resolution::Released => cx
            .conn
            .prepare_cached(
                "DELETE FROM oncebox_inbox
                 WHERE source = ?1 AND event_id = ?2 AND state = 'uncertain'",
            )?
            .execute(params![key.source.as_str(), key.event_id.as_str()])?,
    };
    Ok(Ok(n == 1))
}

/// A value or row longer than SQLite stores (`SQLITE_LIMIT_LENGTH`).
pub(crate) fn too_big(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig)
}
