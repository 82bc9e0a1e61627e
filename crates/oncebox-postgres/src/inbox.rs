//! `Inbox`, the public handle on PostgreSQL: the handler form runs each event on a transaction
//! of its own; the gateway's verbs are batched (see `batch`); leases are guarded single
//! statements, so any number of nodes can share one database.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use oncebox_core::{Clock, Event, Key, ProcessError, Processed, Record, Response, Unavailable};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::batch::Batcher;
use crate::claim::{Claim, claim};
use crate::error::{OpenError, commit_failed, storage};
use crate::options::Options;
use crate::schema;
use crate::silent::answered;
use crate::tx::{HandlerError, Tx};

mod connect;
mod lease;
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
    /// How long oncebox waits for an answer before taking a connection for lost
    /// ([`Options::lost_after`] as applied, `silent.rs`).
    pub(crate) lost_after: Duration,
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
        let lost_after = options.silence();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.deadline);
        let pool = crate::silent::bounded_release(pool, lost_after)
            .connect_with(connect)
            .await?;
        let mut conn = pool.acquire().await?;
        let in_tx = Arc::new(connect::session(&mut conn, &options).await?);
        options.channel = in_tx.channel.clone();
        let o = &options;
        schema::migrate(&mut conn, o.migrate, o.deadline, o.migration_lock_wait).await?;
        options.stamps = oncebox_core::Stamps::default();
        let leases = Arc::new(crate::skew::LeaseClock::new(options.machine.clone()));
        let (ahead, judged) = crate::skew::observe(&mut conn, &options.stamps, &leases).await?;
        if judged {
            crate::skew::warn_of_lease_skew(ahead);
        }
        // The boot is anchored at open, not only at its first purge (`anchor.rs`). A server
        // that takes no writes (a standby the URL still names, a read-only role) opens all the
        // same, unready (`ready`), and the first purge that can write anchors the boot.
        let (clock, stamps) = (&options.clock, &options.stamps);
        match crate::anchor::purge_time(&mut conn, clock, stamps, clock.now(), ahead).await {
            Err(e) if crate::anchor::read_only(&e) => {
                tracing::debug!("the server takes no writes: the boot is anchored later");
            }
            anchored => {
                anchored?;
            }
        }
        drop(conn);
        let batcher = Batcher::start(&pool, &options);
        Ok(Inbox {
            wake: crate::listen::Wake::new(&pool, &in_tx.channel, lost_after),
            pool,
            clock: options.clock,
            stamps: options.stamps,
            batcher,
            deadline: options.deadline,
            lost_after,
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

    /// The connection pool, for the application's own queries. Its sessions start with
    /// `lock_timeout` at [`crate::Options::deadline`]: a statement that must wait longer for a
    /// lock sets its own. Not from inside a handler, which uses only `tx.conn()`: a statement
    /// here commits on its own, kept when the handler fails or its commit is lost.
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
        self.leases.refresh(&self.pool, self.lost_after).await;
        // oncebox's own statements around the handler are bounded (`silent.rs`); the handler's
        // are not.
        let limit = self.lost_after;
        for _ in 0..CLAIM_ATTEMPTS {
            let mut tx = answered(limit, begin(&self.pool, self.deadline))
                .await
                .map_err(|e| storage(&e))?;
            crate::crash::point!("after-begin");
            let now = self.clock.now();
            let judged = || self.leases.server(self.clock.now()).millis();
            let on_server = self.leases.server(now).millis();
            let claimed = claim(&mut tx, &event, (on_server, &judged), None);
            match answered(limit, claimed).await.map_err(|e| storage(&e))? {
                Claim::Vanished => continue,
                Claim::Answered(answer) => {
                    answered(limit, tx.commit())
                        .await
                        .map_err(|e| commit_failed(&e))?;
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

    /// The key's committed record.
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, crate::Error> {
        let limit = self.lost_after;
        crate::silent::within(limit, crate::read::record(&self.pool, key))
            .await
            .unwrap_or_else(|| Err(crate::silent::lost(limit).into()))
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
