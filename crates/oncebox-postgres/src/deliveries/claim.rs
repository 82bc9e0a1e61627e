//! The relay's claim on PostgreSQL: one statement that leases due deliveries under
//! `FOR UPDATE SKIP LOCKED`, and what follows one whose answer was lost or whose rows no longer
//! validate.

use std::sync::LazyLock;
use std::time::Duration;

use oncebox_core::relay_store::{Budget, Claimed};
use oncebox_core::{Key, Timestamp, Unavailable};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::read::count;
use crate::error::storage;
use crate::inbox::Inbox;
use crate::silent::answered;

/// The claim, one statement under READ COMMITTED. `$1` is now, `$2` the limit, `$3` the lease's
/// end, `$4` the claim's random id, `$5` now on the server's clock, which lease ends are written
/// and judged by (`skew.rs`; `$3` is on it too), `$6` the routes (only when some are given, so
/// the planner sees no `IS NULL` branch).
///
/// Each claimable state is its own arm reading one range of `oncebox_outbox_due` in order and
/// stopping at the limit, as on SQLite; an `in_flight` row is due once its lease expired (its
/// relay died mid-attempt, and the delivery goes out again with the same key). Each arm locks
/// its rows with `FOR UPDATE SKIP LOCKED`: a row another claimer is taking right now is passed
/// over, not waited for, and the arm reads on to the next due row, so concurrent relays split
/// a backlog instead of queueing on each other. A row changed and committed since the
/// statement's snapshot is re-checked against the arm's condition when locked (and left out if
/// no longer due). The arms are merged oldest first and cut to the limit; rows an arm locked
/// but the cut dropped are free again when the statement ends, microseconds later.
///
/// Every claimed row gets a new fencing token from the sequence: whoever held it before carries
/// a smaller one and can no longer record (G5). The rows stay locked until the `UPDATE` is done,
/// so nothing can change them between the pick and the lease.
///
/// Unlike SQLite's claim, this one does not re-anchor a lease taken "in the future" after a
/// backward clock jump: lease ends are on the server's clock, which every node shares, and a
/// lease ending further ahead than its length is more likely a node's clock measured against
/// it a moment before it was set right. A server whose clock went back leaves a dead relay's
/// delivery held for the jump's length on top of its lease.
fn claim_sql(routes: bool) -> String {
    let only = if routes {
        " AND destination = ANY($6)"
    } else {
        ""
    };
    let arm = |name: &str, due: &str| {
        format!(
            "{name} AS MATERIALIZED (
               SELECT id, next_attempt_at FROM oncebox_outbox WHERE {due}{only}
               ORDER BY next_attempt_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)"
        )
    };
    format!(
        "WITH {}, {}, {},
         picked AS (
           SELECT id FROM (SELECT * FROM pending UNION ALL SELECT * FROM retrying
                           UNION ALL SELECT * FROM expired) AS due
           ORDER BY next_attempt_at, id LIMIT $2),
         claimed AS (
           UPDATE oncebox_outbox o SET state = 'in_flight', lease_token = nextval('oncebox_fence'),
             lease_expires_at = $3, updated_at = $1, claim_id = $4,
             claim_taken_over = EXISTS (SELECT 1 FROM expired WHERE expired.id = o.id)
           FROM picked WHERE o.id = picked.id
           RETURNING o.id, o.destination, o.idempotency_key, o.payload, o.content_type, o.source,
             o.event_id, o.attempts, o.created_at, o.lease_token, o.next_attempt_at,
             o.claim_taken_over AS taken_over,
             o.budget_attempts, coalesce(o.budget_at, o.created_at) AS budget_at, o.hops)
         SELECT * FROM claimed ORDER BY next_attempt_at, id",
        arm("pending", "state = 'pending' AND next_attempt_at <= $1"),
        arm("retrying", "state = 'retrying' AND next_attempt_at <= $1"),
        arm("expired", "state = 'in_flight' AND lease_expires_at <= $5"),
    )
}

/// Built once each: sqlx prepares a statement per connection and SQL text.
static CLAIM_ANY_ROUTE: LazyLock<String> = LazyLock::new(|| claim_sql(false));
static CLAIM_ROUTES: LazyLock<String> = LazyLock::new(|| claim_sql(true));

/// The rows a claim leased, found by its id, with the columns the claim returns: for a claim
/// whose reply was lost. Only `in_flight` rows are read, a short range of the due index.
const CLAIMED_BY_ID: &str = "
    SELECT id, destination, idempotency_key, payload, content_type, source, event_id, attempts,
      created_at, lease_token, next_attempt_at, claim_taken_over, budget_attempts,
      coalesce(budget_at, created_at), hops
    FROM oncebox_outbox WHERE state = 'in_flight' AND claim_id = $1
    ORDER BY next_attempt_at, id";

/// A row the claim leased whose stored key no longer validates: its id, token and why.
type Invalid = (i64, i64, String);

fn claimed(r: &PgRow, expires_at: Timestamp) -> Result<Result<Claimed, Invalid>, sqlx::Error> {
    let (source, event_id): (String, String) = (r.try_get(5)?, r.try_get(6)?);
    let (id, token): (i64, i64) = (r.try_get(0)?, r.try_get(9)?);
    Ok(match Key::parse(&source, &event_id) {
        Ok(key) => Ok(Claimed {
            id,
            route: r.try_get(1)?,
            key,
            idempotency_key: r.try_get(2)?,
            payload: r.try_get(3)?,
            content_type: r.try_get(4)?,
            attempts: count(r.try_get(7)?),
            created_at: Timestamp(r.try_get(8)?),
            budget: Budget {
                attempts_before: count(r.try_get(12)?),
                since: Timestamp(r.try_get(13)?),
            },
            token,
            lease_expires_at: expires_at,
            taken_over: r.try_get(11)?,
            hops: count(r.try_get(14)?),
        }),
        Err(e) => Err((id, token, e.to_string())),
    })
}

impl Inbox {
    /// `DeliveryStore::claim`.
    pub(super) async fn claim_due(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        // The holder judges its turn by its own clock; the row's end is on the server's.
        let expires_at = now.plus(lease);
        self.leases.refresh(&self.pool, self.lost_after).await;
        let on_server = self.leases.server(now);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = if routes.is_empty() {
            CLAIM_ANY_ROUTE.as_str()
        } else {
            CLAIM_ROUTES.as_str()
        };
        self.give_back_lost(now, on_server).await;
        let claim_id: i64 = rand::random();
        let mut query = sqlx::query(sql)
            .bind(now.millis())
            .bind(limit)
            .bind(on_server.plus(lease).millis())
            .bind(claim_id)
            .bind(on_server.millis());
        if !routes.is_empty() {
            query = query.bind(routes);
        }
        // The connection first: one the pool (or a pooler in between) did not give sent
        // nothing, whatever the error says.
        let started = tokio::time::Instant::now();
        let mut conn = answered(self.lost_after, self.pool.acquire())
            .await
            .map_err(|e| storage(&e))?;
        // Past `lost_after` (the connection's wait included) this fails as a lost connection
        // does: looked for by its id below.
        let left = self.lost_after.saturating_sub(started.elapsed());
        if left.is_zero() {
            // Nothing sent yet: a claim sent now could not be waited for at all.
            return Err(storage(&crate::silent::lost(self.lost_after)));
        }
        let fetched = answered(left, query.fetch_all(&mut *conn)).await;
        // Back to the pool (closed there if it broke) before the look below takes another.
        drop(conn);
        let rows = match fetched {
            Ok(rows) => rows,
            Err(e) => {
                self.claimed_after(&e, claim_id, expires_at.plus(lease))
                    .await?
            }
        };
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            match claimed(r, expires_at).map_err(|e| storage(&e))? {
                Ok(c) => out.push(c),
                Err((id, token, why)) => self.park_invalid(id, token, &why, now).await,
            }
        }
        Ok(out)
    }

    /// After a claim that failed on the connection it was given. One the server refused changed
    /// nothing. Any other (the connection broke, perhaps after the server committed) is followed by a look for the rows it leased, by its id: left, they would stay
    /// in flight under tokens nobody holds until their lease ran out, and then be taken over as
    /// possibly sent, which parks a delivery on a route that ignores the key `uncertain`. A claim
    /// not found may yet commit, so it is remembered (`lost.rs`) until `forget_at`. A server's
    /// error of class 08 is such a break too: a pooler in between answers one of its own for a
    /// server connection it lost, maybe after the server committed.
    async fn claimed_after(
        &self,
        e: &sqlx::Error,
        claim_id: i64,
        forget_at: Timestamp,
    ) -> Result<Vec<PgRow>, Unavailable> {
        if !crate::error::answer_lost(e) {
            return Err(storage(e));
        }
        let found = sqlx::query(CLAIMED_BY_ID)
            .bind(claim_id)
            .fetch_all(&self.pool);
        let found = answered(self.lost_after, found).await;
        let found = match found {
            Ok(found) if !found.is_empty() => found,
            _ => {
                // Even a pooler's error may leave the statement running on the server (its
                // `query_timeout` closed the connection while the claim waited for a lock),
                // to commit later.
                self.lost_claims.remember(claim_id, forget_at);
                return Err(storage(e));
            }
        };
        tracing::warn!(
            rows = found.len(),
            error = %e,
            "a claim's answer was lost after it committed; its deliveries were found by its id"
        );
        Ok(found)
    }

    /// Rows are written from validated keys only. One that no longer validates can never be
    /// handed out, and left due it would take a slot of every claim forever: park it as dead,
    /// visible to operators, with the reason. The token guard keeps a row that changed hands.
    async fn park_invalid(&self, id: i64, token: i64, why: &str, now: Timestamp) {
        let parked = sqlx::query(
            "UPDATE oncebox_outbox SET state = 'dead', last_error = $3, lease_token = NULL,
               lease_expires_at = NULL, updated_at = $4
             WHERE id = $1 AND lease_token = $2",
        )
        .bind(id)
        .bind(token)
        .bind(format!("stored key no longer validates: {why}"))
        .bind(now.millis())
        .execute(&self.pool);
        if let Err(e) = answered(self.lost_after, parked).await {
            // Its lease expires and the next claim tries again; the valid claims stand.
            tracing::warn!(id, error = %e, "could not park a delivery with an invalid key");
        }
    }
}
