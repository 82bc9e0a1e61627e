//! `DeliveryStore` on SQLite: claims and outcomes go through the writer thread (a fenced lease
//! per delivery), listings and gauges through reader connections.

mod due;
mod read;
mod step;

use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Budget, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView,
    Resolve, STATUS_RECHECK, Settled, StatusAnswer,
};
use oncebox_core::store::Page;
use oncebox_core::{Key, LeaseError, Timestamp, Unavailable};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter};

use self::due::{due, due_sql};
use self::read::count;
use crate::inbox::{Inbox, Step};
use crate::store::unavailable;
use crate::writer::{Cx, Fatal};

/// How far the wall clock must move unlike the time that passed between two claims to be taken
/// for a step; less is the clocks' own drift and a reading's jitter.
const STEPPED: Duration = Duration::from_secs(1);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn claim(
    cx: &mut Cx<'_, '_>,
    now: Timestamp,
    limit: usize,
    lease: Duration,
    routes: &[String],
    stepped: Step,
) -> Result<Result<Vec<Claimed>, Unavailable>, Fatal> {
    let conn = cx.conn;
    match stepped {
        Step::None => {}
        Step::Back => step::back(conn, now)?,
        Step::Ahead(by) => step::ahead(conn, now, by)?,
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut args = vec![Value::Integer(now.millis()), Value::Integer(limit)];
    args.extend(routes.iter().map(|r| Value::Text(r.clone())));
    // A relay's route list is fixed by its configuration, so this caches one statement.
    let rows: Vec<_> = conn
        .prepare_cached(&due_sql(routes.len()))?
        .query_map(params_from_iter(args), due)?
        .collect::<Result<_, _>>()?;
    let expires_at = now.plus(lease);
    let mut lease_row = conn.prepare_cached(
        "UPDATE oncebox_outbox SET state = 'in_flight', lease_token = ?2, lease_expires_at = ?3,
           updated_at = ?4
         WHERE id = ?1",
    )?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let row = match row {
            Ok(row) => row,
            Err((id, why)) => {
                // Rows are written from validated values only. One that no longer reads (an
                // edit by hand, another program) can never be handed out, and left due it
                // would fail or take a slot of every claim forever: park it as dead, visible
                // to operators, with the reason.
                conn.prepare_cached(
                    "UPDATE oncebox_outbox SET state = 'dead', last_error = ?2, updated_at = ?3
                     WHERE id = ?1",
                )?
                .execute(params![id, why, now.millis()])?;
                continue;
            }
        };
        // A new token per claim: whoever held this delivery before now carries a smaller one
        // and can no longer record (G5).
        let token = cx.next_fence()?;
        lease_row.execute(params![row.id, token, expires_at.millis(), now.millis()])?;
        claimed.push(Claimed {
            id: row.id,
            route: row.route,
            key: row.key,
            idempotency_key: row.idempotency_key,
            payload: row.payload,
            content_type: row.content_type,
            attempts: count(row.attempts),
            created_at: Timestamp(row.created_at),
            budget: Budget {
                attempts_before: count(row.budget_attempts),
                since: Timestamp(row.budget_at),
            },
            token,
            lease_expires_at: expires_at,
            taken_over: row.taken_over,
            hops: count(row.hops),
        });
    }
    Ok(Ok(claimed))
}

fn record(
    cx: &mut Cx<'_, '_>,
    claimed: &Claimed,
    attempt: &AttemptRecord,
    verdict: &Verdict,
    now: Timestamp,
) -> Result<Result<(), LeaseError>, Fatal> {
    let now_ms = now.millis();
    let r = verdict.recorded(attempt.error.as_deref(), now);
    let (state, next, delivered_at, error) =
        (r.state, r.next_attempt_at, r.delivered_at, r.last_error);
    // The fencing check and the write are one statement: nothing can slip in between. An
    // expired lease is refused even if nobody took the delivery over yet, because someone may
    // be about to.
    let n = cx
        .conn
        .prepare_cached(
            "UPDATE oncebox_outbox SET state = ?4, attempts = attempts + 1, last_status = ?5,
               last_error = ?6, next_attempt_at = coalesce(?7, next_attempt_at),
               delivered_at = coalesce(?8, delivered_at), lease_token = NULL,
               lease_expires_at = NULL, updated_at = ?3
             WHERE id = ?1 AND state = 'in_flight' AND lease_token = ?2 AND lease_expires_at > ?3",
        )?
        .execute(params![
            claimed.id,
            claimed.token,
            now_ms,
            state,
            attempt.status,
            error,
            next,
            delivered_at
        ])?;
    if n == 0 {
        // Fenced: nothing is written, not even the attempt row. The delivery belongs to a newer
        // holder (or to whoever claims it next) and its outcome is theirs to record; counting
        // this attempt would shrink their retry budget, and its row would show operators an
        // outcome that decided nothing.
        return Ok(Err(LeaseError::Fenced));
    }
    cx.conn
        .prepare_cached(
            "INSERT INTO oncebox_attempts (delivery_id, started_at, duration_ms, status, error)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![
            claimed.id,
            attempt.started_at.millis(),
            millis(attempt.duration),
            attempt.status,
            attempt.stored_error()
        ])?;
    Ok(Ok(()))
}

impl Inbox {
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
        let (least, most) = (millis(STATUS_RECHECK.0), millis(STATUS_RECHECK.1));
        self.submit(move |cx| {
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET updated_at = ?2,
                       next_attempt_at = ?2 + min(max(2 * (?2 - coalesce(updated_at, ?2)), ?3), ?4)
                     WHERE id = ?1 AND state = 'uncertain' AND next_attempt_at <= ?2
                       AND attempts = ?5",
                )?
                .execute(params![id, now.millis(), least, most, attempts])?;
            Ok(Ok(n == 1))
        })
        .await
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
        let routes = routes.to_vec();
        let (stepped, at) = self.clock_step(STEPPED);
        let claimed = self
            .submit_whole(move |cx| claim(cx, now, limit, lease, &routes, stepped))
            .await;
        if claimed.is_ok() {
            self.claimed(at);
        }
        claimed
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        let claimed = claimed.clone();
        // A step ahead since the last claim moves the leases first, as that claim would have:
        // the holder's own outcome, the first thing after a step, was refused as too late.
        // (A step back is left to the next claim, which re-anchors schedules too.)
        let (stepped, at) = self.clock_step(STEPPED);
        let ahead = match stepped {
            Step::Ahead(by) => Some(by),
            Step::None | Step::Back => None,
        };
        let recorded = self
            .submit_whole(move |cx| {
                if let Some(by) = ahead {
                    step::ahead(cx.conn, now, by)?;
                }
                record(cx, &claimed, &attempt, &verdict, now)
            })
            .await;
        if ahead.is_some() && !matches!(recorded, Err(LeaseError::Unavailable(_))) {
            self.claimed(at);
        }
        recorded
    }

    async fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> Result<(), LeaseError> {
        let (id, token) = (claimed.id, claimed.token);
        self.submit_whole(move |cx| {
            // Only the lease's holder gives it back: a claim since would have changed the
            // token. Its expiry is not checked, unlike `record`'s: nothing was sent, so a lease
            // that ran out while the relay waited for its turn is given back as pending, not
            // left to be taken over as a delivery that may have been sent.
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET state = CASE WHEN attempts = 0 THEN 'pending'
                       ELSE 'retrying' END, next_attempt_at = ?4, lease_token = NULL,
                       lease_expires_at = NULL, updated_at = ?3
                     WHERE id = ?1 AND state = 'in_flight' AND lease_token = ?2",
                )?
                .execute(params![id, token, now.millis(), due.millis()])?;
            Ok(if n == 1 {
                Ok(())
            } else {
                Err(LeaseError::Fenced)
            })
        })
        .await
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        self.read(move |c| read::page(c, &filter))
            .await
            .map_err(unavailable)
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        self.read(move |c| read::attempts(c, id))
            .await
            .map_err(unavailable)
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        self.submit(move |cx| {
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET state = 'pending', next_attempt_at = ?2,
                       updated_at = ?2, budget_attempts = attempts, budget_at = ?2
                     WHERE id = ?1 AND state IN ('dead', 'uncertain', 'retrying')",
                )?
                .execute(params![id, now.millis()])?;
            Ok(Ok(n == 1))
        })
        .await
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
        let note = oncebox_core::delivery::storable(note);
        self.submit(move |cx| {
            // Never in flight while its lease lives: a relay holds it and its outcome is on the
            // way. Past the lease, its relay died or stalled mid-send: the lease is taken
            // (its holder's record is then fenced), or a delivery owed to a route since removed
            // would be in flight for good, claimed by no relay. Never delivered: that is final.
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET state = ?2, note = coalesce(nullif(?3, ''), note),
                       delivered_at = coalesce(?4, delivered_at), updated_at = ?5,
                       lease_token = NULL, lease_expires_at = NULL
                     WHERE id = ?1 AND (state IN ('pending', 'retrying', 'uncertain', 'dead')
                       OR (state = 'in_flight' AND lease_expires_at <= ?5))",
                )?
                .execute(params![id, state, note, delivered_at, now.millis()])?;
            Ok(Ok(n == 1))
        })
        .await
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
        self.submit(move |cx| {
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET state = ?2, note = ?3, next_attempt_at = ?5,
                       delivered_at = coalesce(?4, delivered_at), updated_at = ?5
                     WHERE id = ?1 AND state = 'uncertain' AND next_attempt_at <= ?5
                       AND attempts = ?6",
                )?
                .execute(params![
                    id,
                    state,
                    note,
                    delivered_at,
                    now.millis(),
                    attempts
                ])?;
            Ok(Ok(n == 1))
        })
        .await
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        let key = key.clone();
        self.submit(move |cx| {
            // The row, and with it the idempotency key, stays the same: a receiver that
            // honours the key applies the replay at most once.
            let n = cx
                .conn
                .prepare_cached(
                    "UPDATE oncebox_outbox SET state = 'pending', next_attempt_at = ?3,
                       updated_at = ?3, budget_attempts = attempts, budget_at = ?3
                     WHERE source = ?1 AND event_id = ?2 AND state <> 'in_flight'",
                )?
                .execute(params![
                    key.source.as_str(),
                    key.event_id.as_str(),
                    now.millis()
                ])?;
            Ok(Ok(n as u64))
        })
        .await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        self.read(read::gauges).await.map_err(unavailable)
    }

    /// SQLite has no way to tell another process about a commit: the relay polls.
    async fn wait_for_work(&self, at_most: std::time::Duration) {
        tokio::time::sleep(at_most).await;
    }
}
