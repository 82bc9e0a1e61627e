//! `DeliveryStore` on PostgreSQL: relays on any number of nodes claim with
//! `FOR UPDATE SKIP LOCKED` and record under a fenced lease; operators' actions that make work
//! due `NOTIFY` listening relays. The claim is in `deliveries/claim.rs`, listings and gauges in
//! `deliveries/read.rs`.

mod claim;
pub(crate) mod lost;
mod read;

use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
    STATUS_RECHECK, Settled, StatusAnswer,
};
use oncebox_core::store::Page;
use oncebox_core::{Key, LeaseError, Timestamp, Unavailable};

use crate::error::{commit_failed, lease_write, storage};
use crate::inbox::{Inbox, notify};
use crate::silent::answered;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Inbox {
    /// Runs `sql` (an `UPDATE` making deliveries due, binding `bind`) and, when it changed
    /// something and `wake` says they are due now, `NOTIFY`s relays in the same transaction:
    /// PostgreSQL delivers the notification only on commit, so a woken relay's claim sees the
    /// rows. Rows due later are found by the relays' polls.
    async fn make_due<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        wake: bool,
    ) -> Result<u64, Unavailable> {
        crate::silent::or_unknown(self.lost_after, async {
            let mut tx = crate::inbox::begin(&self.pool, self.deadline)
                .await
                .map_err(|e| storage(&e))?;
            let n = query
                .execute(&mut *tx)
                .await
                .map_err(|e| storage(&e))?
                .rows_affected();
            if n > 0 && wake {
                notify(&mut tx, &self.in_tx.channel)
                    .await
                    .map_err(|e| storage(&e))?;
            }
            tx.commit().await.map_err(|e| commit_failed(&e))?;
            Ok(n)
        })
        .await
    }

    /// Puts the next status check of an uncertain delivery off by twice the time since the
    /// last one, within [`STATUS_RECHECK`]; only while it is still the attempt `attempts`
    /// was asked about (an unanswered question about an earlier one put the current one's
    /// check off by up to half an hour).
    async fn ask_again_later(
        &self,
        id: i64,
        attempts: u32,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        let n = sqlx::query(
            "UPDATE oncebox_outbox SET updated_at = $2,
               next_attempt_at = $2 + least(greatest(2 * ($2 - updated_at), $3), $4)
             WHERE id = $1 AND state = 'uncertain' AND next_attempt_at <= $2
               AND attempts = $5",
        )
        .bind(id)
        .bind(now.millis())
        .bind(millis(STATUS_RECHECK.0))
        .bind(millis(STATUS_RECHECK.1))
        .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
        .execute(&self.pool);
        let n = answered(self.lost_after, n)
            .await
            .map_err(|e| storage(&e))?;
        Ok(n.rows_affected() == 1)
    }
}

impl DeliveryStore for Inbox {
    async fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        self.claim_due(now, limit, lease, routes).await
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        let now_ms = now.millis();
        let on_server = self.leases.server(now).millis();
        let r = verdict.recorded(attempt.error.as_deref(), now);
        let (state, next, delivered_at, error) =
            (r.state, r.next_attempt_at, r.delivered_at, r.last_error);
        let status = attempt.status.map(i32::from);
        // The fencing check, the verdict and the attempt row are one statement, so one
        // transaction: nothing slips in between, and a fenced relay writes nothing, not even its
        // attempt (counting it would shrink the new holder's retry budget, and its row would show
        // operators an outcome that decided nothing). An expired lease is refused even if nobody
        // took the delivery over yet, because someone may be about to.
        let query = sqlx::query(
            "WITH verdict AS (
               UPDATE oncebox_outbox SET state = $4, attempts = attempts + 1, last_status = $5,
                 last_error = $6, next_attempt_at = coalesce($7, next_attempt_at),
                 delivered_at = coalesce($8, delivered_at), lease_token = NULL,
                 lease_expires_at = NULL, updated_at = $3
               WHERE id = $1 AND state = 'in_flight' AND lease_token = $2 AND lease_expires_at > $12
               RETURNING id)
             INSERT INTO oncebox_attempts (delivery_id, started_at, duration_ms, status, error)
             SELECT id, $9, $10, $5, $11 FROM verdict",
        )
        .bind(claimed.id)
        .bind(claimed.token)
        .bind(now_ms)
        .bind(state)
        .bind(status)
        .bind(error)
        .bind(next)
        .bind(delivered_at)
        .bind(attempt.started_at.millis())
        .bind(millis(attempt.duration))
        .bind(attempt.stored_error())
        .bind(on_server);
        let n = lease_write(&self.pool, self.lost_after, query).await?;
        if n.rows_affected() == 1 {
            Ok(())
        } else {
            Err(LeaseError::Fenced)
        }
    }

    async fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> Result<(), LeaseError> {
        // Only the lease's holder gives it back: a claim since would have changed the token. Its
        // expiry is not checked, unlike `record`'s: nothing was sent, so a lease that ran out
        // while the relay waited for its turn is given back as pending, not left to be taken
        // over as a delivery that may have been sent.
        let query = sqlx::query(
            "UPDATE oncebox_outbox SET state = CASE WHEN attempts = 0 THEN 'pending'
               ELSE 'retrying' END, next_attempt_at = $4, lease_token = NULL,
               lease_expires_at = NULL, updated_at = $3
             WHERE id = $1 AND state = 'in_flight' AND lease_token = $2",
        )
        .bind(claimed.id)
        .bind(claimed.token)
        .bind(now.millis())
        .bind(due.millis());
        match self.make_due(query, due <= now).await {
            Ok(1) => Ok(()),
            Ok(_) => Err(LeaseError::Fenced),
            Err(e) => Err(LeaseError::Unavailable(e)),
        }
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        let page = read::page(&self.pool, &filter);
        answered(self.lost_after, page)
            .await
            .map_err(|e| storage(&e))
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        let attempts = read::attempts(&self.pool, id);
        answered(self.lost_after, attempts)
            .await
            .map_err(|e| storage(&e))
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        let query = sqlx::query(
            "UPDATE oncebox_outbox SET state = 'pending', next_attempt_at = $2, updated_at = $2,
               budget_attempts = attempts, budget_at = $2
             WHERE id = $1 AND state IN ('dead', 'uncertain', 'retrying')",
        )
        .bind(id)
        .bind(now.millis());
        Ok(self.make_due(query, true).await? == 1)
    }

    async fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        let (state, delivered_at) = match resolution {
            Resolve::Delivered => ("delivered", Some(now.millis())),
            Resolve::Dead => ("dead", None),
            // A settlement this build does not know changes nothing.
            _ => return Ok(false),
        };
        // Never in flight while its lease lives (by the server's clock, as a takeover judges
        // it): a relay holds it and its outcome is on the way. Past the lease, its relay died
        // or stalled mid-send: the lease is taken (its holder's record is then fenced), or a
        // delivery owed to a route since removed would be in flight for good. Never
        // delivered: that is final.
        // A lost answer is `CommitUnknown`: the operator's retry that then reads "not
        // resolvable" may find the delivery settled by this very call.
        let query = sqlx::query(
            "UPDATE oncebox_outbox SET state = $2, note = coalesce(nullif($3, ''), note),
               delivered_at = coalesce($4, delivered_at), updated_at = $5,
               lease_token = NULL, lease_expires_at = NULL
             WHERE id = $1 AND (state IN ('pending', 'retrying', 'uncertain', 'dead')
               OR (state = 'in_flight' AND lease_expires_at <= $6))",
        )
        .bind(id)
        .bind(state)
        .bind(oncebox_core::delivery::storable(note))
        .bind(delivered_at)
        .bind(now.millis())
        .bind(self.leases.server(now).millis());
        let n = crate::error::autocommit_write(&self.pool, self.lost_after, query).await?;
        Ok(n.rows_affected() == 1)
    }

    async fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        let Some(Settled {
            state,
            delivered_at,
            note,
        }) = answer.settled(now)
        else {
            return self.ask_again_later(id, attempts, now).await;
        };
        let query = sqlx::query(
            "UPDATE oncebox_outbox SET state = $2, note = $3, next_attempt_at = $5,
               delivered_at = coalesce($4, delivered_at), updated_at = $5
             WHERE id = $1 AND state = 'uncertain' AND next_attempt_at <= $5
               AND attempts = $6",
        )
        .bind(id)
        .bind(state)
        .bind(note)
        .bind(delivered_at)
        .bind(now.millis())
        .bind(i32::try_from(attempts).unwrap_or(i32::MAX));
        // A delivery made due again wakes the relays listening; a delivered one wakes them for
        // nothing, which costs one empty claim.
        Ok(self.make_due(query, true).await? == 1)
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        // The row, and with it the idempotency key, stays the same: a receiver that honours the
        // key applies the replay at most once.
        let query = sqlx::query(
            "UPDATE oncebox_outbox SET state = 'pending', next_attempt_at = $3, updated_at = $3,
               budget_attempts = attempts, budget_at = $3
             WHERE source = $1 AND event_id = $2 AND state <> 'in_flight'",
        )
        .bind(key.source.as_str())
        .bind(key.event_id.as_str())
        .bind(now.millis());
        self.make_due(query, true).await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        let gauges = read::gauges(&self.pool);
        answered(self.lost_after, gauges)
            .await
            .map_err(|e| storage(&e))
    }

    /// Woken by `NOTIFY` on [`crate::OUTBOX_CHANNEL`] (see `listen`), else after `at_most`.
    async fn wait_for_work(&self, at_most: Duration) {
        self.wake.wait(at_most).await;
    }
}
