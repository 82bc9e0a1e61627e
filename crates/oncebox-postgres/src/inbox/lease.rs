//! `Inbox`'s two-phase leases: `begin` takes a fenced lease on a key for an effect outside the
//! database, and `complete`, `release` and `uncertain` are single guarded statements that only
//! the lease's live holder gets through; `resolve` settles an uncertain key.

use std::time::Duration;

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ProcessError, Processed, Resolution, Response,
    Unavailable,
};

use super::{CLAIM_ATTEMPTS, Inbox, begin};
use crate::claim::{Claim, claim};
use crate::error::{commit_failed, lease_write, storage};

impl Inbox {
    /// Takes a fenced lease on the key for an effect outside the database. An event past
    /// [`MAX_EVENT_BYTES`](crate::MAX_EVENT_BYTES) is `Invalid::TooLarge`, a TTL under 1 ms
    /// `Invalid::LeaseTtl`.
    pub async fn begin(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        oncebox_core::check_ttl(ttl)?;
        crate::limit::check(&event)?;
        self.not_within_its_own_handler(&event.key)?;
        // A lease taken whose answer never came is the key's until its TTL runs out, as after
        // any lost commit.
        crate::silent::or_unknown(self.lost_after, self.lease(event, ttl)).await
    }

    async fn lease(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        self.leases.refresh(&self.pool, self.lost_after).await;
        for _ in 0..CLAIM_ATTEMPTS {
            let mut tx = begin(&self.pool, self.deadline)
                .await
                .map_err(|e| storage(&e))?;
            let now = self.clock.now();
            // Written and judged by the server's clock; the holder is told its end on its own.
            let expires_at = now.plus(ttl);
            let on_server = self.leases.server(now);
            let token: i64 = sqlx::query_scalar("SELECT nextval('oncebox_fence')")
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| storage(&e))?;
            let judged = || self.leases.server(self.clock.now()).millis();
            let claimed = claim(
                &mut tx,
                &event,
                (on_server.millis(), &judged),
                Some((token, on_server.plus(ttl).millis())),
            )
            .await
            .map_err(|e| storage(&e))?;
            if matches!(claimed, Claim::Vanished) {
                continue;
            }
            tx.commit().await.map_err(|e| commit_failed(&e))?;
            return match claimed {
                Claim::Fresh(_) | Claim::TakenOver(_) => Ok(Begun::Leased(Lease {
                    key: event.key.clone(),
                    token,
                    expires_at,
                    taken_over: matches!(claimed, Claim::TakenOver(_)),
                })),
                Claim::Answered(Ok(Processed::Duplicate(r))) => Ok(Begun::Duplicate(r)),
                Claim::Answered(Ok(other)) => Err(ProcessError::Handler(
                    format!("unexpected claim answer {other:?}").into(),
                )),
                Claim::Answered(Err(e)) => Err(e),
                Claim::Vanished => Err(ProcessError::Unavailable(Unavailable::Busy)),
            };
        }
        Err(ProcessError::Unavailable(Unavailable::Busy))
    }

    /// Completes only while the lease is live and still this holder's: an expired holder is
    /// fenced even if nobody has taken over yet, because someone may be about to. A holder
    /// repeating its own completion is answered `Ok`. A response past
    /// [`MAX_EVENT_BYTES`](crate::MAX_EVENT_BYTES) is `LeaseError::TooLarge`, unasked of the
    /// database, and the lease is still the holder's.
    pub async fn complete(&self, lease: &Lease, response: Response) -> Result<(), LeaseError> {
        crate::limit::check_response(&response.body)?;
        let body = (!response.body.is_empty()).then_some(&response.body);
        self.leases.refresh(&self.pool, self.lost_after).await;
        let now = self.clock.now();
        let stamp = self.stamps.completed(self.clock.as_ref(), now).millis();
        let now = self.leases.server(now).millis();
        // The completing token stays on the record: the holder repeating its completion (its
        // reply was lost) is told `Ok` again below, and the first response stays.
        let query = sqlx::query(
            "UPDATE oncebox_inbox SET state = $4, response = $5, completed_at = $7,
               lease_expires_at = NULL
             WHERE source = $1 AND event_id = $2 AND state = 'processing'
               AND lease_token = $3 AND lease_expires_at > $6",
        )
        .bind(lease.key.source.as_str())
        .bind(lease.key.event_id.as_str())
        .bind(lease.token)
        .bind(response.kind.as_str())
        .bind(body)
        .bind(now)
        .bind(stamp);
        let n = lease_write(&self.pool, self.lost_after, query).await?;
        if n.rows_affected() == 1 {
            return Ok(());
        }
        let own = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM oncebox_inbox WHERE source = $1 AND event_id = $2
               AND lease_token = $3 AND state NOT IN ('processing', 'uncertain'))",
        )
        .bind(lease.key.source.as_str())
        .bind(lease.key.event_id.as_str())
        .bind(lease.token)
        .fetch_one(&self.pool);
        let own: bool = crate::silent::answered(self.lost_after, own)
            .await
            .map_err(|e| LeaseError::Unavailable(storage(&e)))?;
        if own { Ok(()) } else { Err(LeaseError::Fenced) }
    }

    /// Frees the key (the external call failed). Allowed after expiry while nobody took over.
    pub async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let query = sqlx::query(
            "DELETE FROM oncebox_inbox WHERE source = $1 AND event_id = $2
               AND state = 'processing' AND lease_token = $3",
        )
        .bind(lease.key.source.as_str())
        .bind(lease.key.event_id.as_str())
        .bind(lease.token);
        let n = lease_write(&self.pool, self.lost_after, query).await?;
        fenced_unless(n.rows_affected())
    }

    /// Parks the key: the external call's outcome is unknown, so it is neither retried nor done
    /// until reconciled. The token stays on the parked record, so the holder repeating the call
    /// (its reply was lost) matches again and is told `Ok`; `resolve` clears or deletes it.
    pub async fn uncertain(&self, lease: &Lease) -> Result<(), LeaseError> {
        let query = sqlx::query(
            "UPDATE oncebox_inbox SET state = 'uncertain', lease_expires_at = NULL
             WHERE source = $1 AND event_id = $2 AND state IN ('processing', 'uncertain')
               AND lease_token = $3",
        )
        .bind(lease.key.source.as_str())
        .bind(lease.key.event_id.as_str())
        .bind(lease.token);
        let n = lease_write(&self.pool, self.lost_after, query).await?;
        fenced_unless(n.rows_affected())
    }

    /// Settles an `uncertain` key; returns false when the key is not uncertain. An answer lost
    /// after the server took the write is `Unavailable::CommitUnknown`: a retry that then reads
    /// false may find the key settled by this very call.
    pub async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<bool, crate::Error> {
        let now = (self.stamps).completed(self.clock.as_ref(), self.clock.now());
        let now = now.millis();
        let query = match resolution {
            Resolution::Completed(response) => sqlx::query(
                "UPDATE oncebox_inbox SET state = $3, response = $4, completed_at = $5,
                   lease_token = NULL
                 WHERE source = $1 AND event_id = $2 AND state = 'uncertain'",
            )
            .bind(key.source.as_str())
            .bind(key.event_id.as_str())
            .bind(response.kind.as_str())
            .bind(response.body)
            .bind(now),
            Resolution::Released => sqlx::query(
                "DELETE FROM oncebox_inbox
                 WHERE source = $1 AND event_id = $2 AND state = 'uncertain'",
            )
            .bind(key.source.as_str())
            .bind(key.event_id.as_str()),
        };
        let n = crate::error::autocommit_write(&self.pool, self.lost_after, query).await?;
        Ok(n.rows_affected() == 1)
    }
}

fn fenced_unless(rows: u64) -> Result<(), LeaseError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(LeaseError::Fenced)
    }
}
