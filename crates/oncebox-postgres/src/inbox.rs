//! `Inbox`, the public handle on PostgreSQL: the handler form runs each event on a transaction
//! of its own; the gateway's verbs are batched (see `batch`); leases are guarded single
//! statements, so any number of nodes can share one database.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use oncebox_core::{
    Begun, Clock, Event, Key, Lease, LeaseError, ProcessError, Processed, Record, Resolution,
    Response, Unavailable,
};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::batch::Batcher;
use crate::claim::{Claim, claim};
use crate::error::{OpenError, commit_failed, lease_write, storage};
use crate::options::Options;
use crate::schema;
use crate::tx::{HandlerError, Tx};

mod connect;
mod run;

pub(crate) use connect::{begin, connect_options, lock_timeout, quoted};

/// A claim retries this often when the record it conflicted with vanished meanwhile.
const CLAIM_ATTEMPTS: usize = 3;

/// The inbox on one PostgreSQL database (and schema). Cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    pub(crate) pool: PgPool,
    pub(crate) clock: Arc<dyn Clock>,
    /// Dates finished records (`oncebox_core::Stamps`).
    pub(crate) stamps: oncebox_core::Stamps,
    pub(crate) batcher: Batcher,
    pub(crate) deadline: Duration,
    /// Relay wake-ups (`LISTEN`), started by the first `wait_for_work`.
    pub(crate) wake: crate::listen::Wake,
    /// Claims whose answer was lost before their rows were found (`deliveries/lost.rs`).
    pub(crate) lost_claims: crate::deliveries::lost::LostClaims,
    /// The statements run in a handler's transaction, naming the schema.
    pub(crate) in_tx: Arc<crate::qualified::InTx>,
    /// The server's clock, which leases are written and judged by (`skew.rs`).
    pub(crate) leases: Arc<crate::skew::LeaseClock>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// The handler `process` runs: it gets the event's open transaction and returns a boxed future
/// (`|tx| Box::pin(async move { … })`), because the future borrows the transaction.
pub type Handler =
    Box<dyn for<'t> FnOnce(&'t mut Tx) -> BoxFuture<'t, Result<Response, HandlerError>> + Send>;

impl Inbox {
    /// Connects, creates the schema if asked for one, migrates (safe when several nodes start at
    /// once) and starts the batch workers. Must run inside a Tokio runtime.
    pub async fn open(mut options: Options) -> Result<Inbox, OpenError> {
        // Each bounded once, here: past it a wait overflows the clock or a server setting.
        for wait in [
            &mut options.deadline,
            &mut options.idle_in_transaction,
            &mut options.migration_lock_wait,
        ] {
            *wait = (*wait).min(oncebox_core::LONGEST_WAIT);
        }
        let connect = connect_options(&options)?;
        if let Some(schema) = &options.schema {
            // The schema must exist before a connection can write to it.
            let mut conn: sqlx::PgConnection = sqlx::Connection::connect_with(
                &connect.clone().options([("search_path", "public")]),
            )
            .await?;
            // Looked up first: `CREATE SCHEMA IF NOT EXISTS` needs the right to create
            // schemas even when it exists, which an application role on a schema its DBA made
            // for it does not have.
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(schema)
                    .fetch_one(&mut conn)
                    .await?;
            if !exists && !options.migrate {
                return Err(OpenError::SchemaOutdated {
                    found: 0,
                    known: schema::VERSION,
                });
            }
            if !exists {
                sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", quoted(schema)))
                    .execute(&mut conn)
                    .await
                    .or_else(|e| match &e {
                        // Two nodes creating it at once: the loser's unique violation means it
                        // exists.
                        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                            Ok(Default::default())
                        }
                        _ => Err(e),
                    })?;
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.deadline)
            .connect_with(connect)
            .await?;
        let mut conn = pool.acquire().await?;
        let in_tx = Arc::new(connect::session(&mut conn, &options).await?);
        options.channel = in_tx.channel.clone();
        let o = &options;
        schema::migrate(&mut conn, o.migrate, o.deadline, o.migration_lock_wait).await?;
        options.stamps = oncebox_core::Stamps::default();
        options
            .stamps
            .set(crate::store::stored_anchor(&mut conn, options.clock.as_ref()).await?);
        let leases = Arc::new(crate::skew::LeaseClock::new(options.machine.clone()));
        let ahead = crate::skew::observe(&mut conn, &options.stamps, &leases).await?;
        crate::skew::warn_of_lease_skew(ahead);
        drop(conn);
        let batcher = Batcher::start(&pool, &options);
        Ok(Inbox {
            wake: crate::listen::Wake::new(&pool, &in_tx.channel),
            pool,
            clock: options.clock,
            stamps: options.stamps,
            batcher,
            deadline: options.deadline,
            lost_claims: Default::default(),
            in_tx,
            leases,
        })
    }

    /// Counters of batched ingest since open.
    pub fn batch_stats(&self) -> &crate::batch::BatchStats {
        &self.batcher.stats
    }

    /// Requests waiting in the queue for a batch worker to take them.
    pub fn queued(&self) -> usize {
        self.batcher.queued()
    }

    /// Refuses a call for `key` from inside the handler this inbox runs for `key`: the claim
    /// would wait for the handler's own transaction to release the key's row, until the
    /// deadline, and then answer "retry later", every time. A handler works through its `tx`.
    fn not_within_its_own_handler(&self, key: &Key) -> Result<(), ProcessError> {
        let inbox = Arc::as_ptr(&self.in_tx) as usize;
        if run::HANDLING
            .try_with(|(within, held)| *within == inbox && held == key)
            .unwrap_or(false)
        {
            return Err(ProcessError::Handler(
                format!(
                    "{key} was asked for from inside its own handler, which holds it until it \
                     commits: a handler works through its tx"
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// The connection pool, for the application's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Processes `event` once: a new key runs `handler` on the transaction that also records the
    /// key and its response; a committed key answers `Duplicate` without running it. A handler
    /// error or panic rolls back everything of this event and leaves the key free. An event
    /// past [`MAX_EVENT_BYTES`](crate::MAX_EVENT_BYTES) is `Invalid::TooLarge`, unasked of
    /// the database. A handler that ends the transaction itself (`COMMIT` or `ROLLBACK` on
    /// `tx.conn()`) leaves its effect's fate unknown: the key is parked and the answer is
    /// `Uncertain`, now and on every delivery until an operator resolves it.
    pub async fn process<F>(&self, event: Event, handler: F) -> Result<Processed, ProcessError>
    where
        F: for<'t> FnOnce(&'t mut Tx) -> BoxFuture<'t, Result<Response, HandlerError>>
            + Send
            + 'static,
    {
        crate::limit::check(&event)?;
        self.not_within_its_own_handler(&event.key)?;
        let mut handler: Option<Handler> = Some(Box::new(handler));
        // Another's two-phase lease on the key is judged by the server's clock; what the
        // handler writes (its outbox rows' schedule, the record's dates) goes by this node's.
        self.leases.refresh(&self.pool).await;
        for _ in 0..CLAIM_ATTEMPTS {
            let mut tx = begin(&self.pool, self.deadline)
                .await
                .map_err(|e| storage(&e))?;
            crate::crash::point!("after-begin");
            let now = self.clock.now();
            match claim(&mut tx, &event, self.leases.server(now).millis(), None)
                .await
                .map_err(|e| storage(&e))?
            {
                Claim::Vanished => continue,
                Claim::Answered(answer) => {
                    tx.commit().await.map_err(|e| commit_failed(&e))?;
                    return answer;
                }
                Claim::Fresh(claimed) | Claim::TakenOver(claimed) => {
                    crate::crash::point!("after-inbox-insert");
                    let Some(handler) = handler.take() else { break };
                    let tx = Tx::new(
                        tx,
                        event.key.clone(),
                        now,
                        self.in_tx.clone(),
                        event.meta.hops(),
                    );
                    return self.run(&event, tx, claimed, handler).await;
                }
            }
        }
        Err(ProcessError::Unavailable(Unavailable::Busy))
    }

    /// Takes a fenced lease on the key for an effect outside the database. An event past
    /// [`MAX_EVENT_BYTES`](crate::MAX_EVENT_BYTES) is `Invalid::TooLarge`, a TTL under 1 ms
    /// `Invalid::LeaseTtl`.
    pub async fn begin(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        oncebox_core::check_ttl(ttl)?;
        crate::limit::check(&event)?;
        self.not_within_its_own_handler(&event.key)?;
        self.leases.refresh(&self.pool).await;
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
            let claimed = claim(
                &mut tx,
                &event,
                on_server.millis(),
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
        self.leases.refresh(&self.pool).await;
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
        let n = lease_write(&self.pool, query).await?;
        if n.rows_affected() == 1 {
            return Ok(());
        }
        let own: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM oncebox_inbox WHERE source = $1 AND event_id = $2
               AND lease_token = $3 AND state NOT IN ('processing', 'uncertain'))",
        )
        .bind(lease.key.source.as_str())
        .bind(lease.key.event_id.as_str())
        .bind(lease.token)
        .fetch_one(&self.pool)
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
        let n = lease_write(&self.pool, query).await?;
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
        let n = lease_write(&self.pool, query).await?;
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
        let n = crate::error::autocommit_write(&self.pool, query).await?;
        Ok(n.rows_affected() == 1)
    }

    /// The key's committed record.
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, crate::Error> {
        crate::read::record(&self.pool, key).await
    }
}

fn fenced_unless(rows: u64) -> Result<(), LeaseError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(LeaseError::Fenced)
    }
}

/// Wakes relays listening for new deliveries; PostgreSQL sends it on commit, once per
/// transaction however many rows were queued.
pub(crate) async fn notify(
    conn: &mut sqlx::PgConnection,
    channel: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(channel)
        .execute(conn)
        .await?;
    Ok(())
}
