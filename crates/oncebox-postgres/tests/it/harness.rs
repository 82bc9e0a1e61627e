//! The PostgreSQL backend behind the testkit's `Backend`: scripted handlers become real SQL on
//! the event's transaction. Each store lives in a schema of its own, so tests run in parallel
//! on one database.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ManualClock, OutboxMessage, ProcessError, Processed,
    Response, Retention, Timestamp,
};
use oncebox_postgres::sqlx::{self, Connection, PgPool, Row};
use oncebox_postgres::{HandlerError, Inbox, OffsetMove, Once, Options, Resolution, Tx};
use oncebox_testkit::{Backend, CrashAt, Crashed, End, Observed, Script};

/// The variable naming the test database.
pub const URL_VAR: &str = "ONCEBOX_POSTGRES_URL";

/// The tables the suite's scripted handlers write, as a user's application would have them.
pub const APP_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS test_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS test_effects (
    source TEXT NOT NULL, event_id TEXT NOT NULL, amount BIGINT NOT NULL,
    account BIGINT NOT NULL REFERENCES test_accounts (id));
CREATE TABLE IF NOT EXISTS test_emails (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_key TEXT NOT NULL);
INSERT INTO test_accounts (id, balance) VALUES (1, 0) ON CONFLICT DO NOTHING;
";

/// The test database's URL; `None` (skipping) when unset.
pub fn url() -> Option<String> {
    oncebox_testkit::service_url(URL_VAR)
}

/// A schema name no other test uses.
pub fn schema() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

/// Options for a store in `schema` of the test database on `clock`.
pub fn options(schema: &str, clock: &ManualClock) -> Options {
    let url = url().expect("ONCEBOX_POSTGRES_URL");
    Options::new(url)
        .schema(schema)
        .clock(Arc::new(clock.clone()))
        .max_connections(8)
}

#[derive(Clone)]
pub struct Postgres {
    pub inbox: Inbox,
    pub schema: String,
    pub clock: ManualClock,
}

impl Postgres {
    pub async fn open(schema: String, clock: ManualClock) -> Postgres {
        let inbox = Inbox::open(options(&schema, &clock)).await.expect("open");
        let mut conn = inbox.pool().acquire().await.expect("connection");
        sqlx::Executor::execute(&mut *conn, APP_SCHEMA)
            .await
            .expect("app schema");
        drop(conn);
        Postgres {
            inbox,
            schema,
            clock,
        }
    }
}

impl Postgres {
    /// Delivers `event` with a handler that makes its effects, then waits while its session is
    /// terminated on the server, as the session of a process killed there ends; then it tries
    /// to commit. The server rolls back a session that ends in a transaction, so nothing of the
    /// delivery may remain, and the commit must fail.
    async fn killed_before_commit(&self, event: Event, script: Script) -> Crashed {
        let (reached, at_point) = tokio::sync::oneshot::channel::<i32>();
        let (die, dying) = tokio::sync::oneshot::channel::<()>();
        let script = script.end(End::Complete("ok".into()));
        let inbox = self.inbox.clone();
        let run = tokio::spawn(async move {
            inbox
                .process(event, move |tx| {
                    Box::pin(async move {
                        run_script(tx, &script).await?;
                        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                            .fetch_one(tx.conn())
                            .await?;
                        let _ = reached.send(pid);
                        let _ = dying.await;
                        Ok(Response::completed("ok"))
                    })
                })
                .await
        });
        // The handler is dropped unrun when the key was answered without it.
        let Ok(pid) = at_point.await else {
            return Crashed::Answered(run.await.expect("delivery task"));
        };
        let mut admin = sqlx::PgConnection::connect(&url().expect("URL"))
            .await
            .expect("connect");
        // Waits up to 10 s for the session to end; false if it did not.
        let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
            .bind(pid)
            .fetch_one(&mut admin)
            .await
            .expect("terminate the session");
        assert!(ended, "session {pid} did not end");
        drop(die);
        match run.await.expect("delivery task") {
            Err(_) => Crashed::Died,
            Ok(p) => panic!("a terminated session committed the delivery: {p:?}"),
        }
    }
}

/// Runs a script on the transaction: the handler a user would write, driven by test data.
pub async fn run_script(tx: &mut Tx, script: &Script) -> Result<Response, HandlerError> {
    if let Some((order, version)) = &script.version {
        tx.advance("order", order, *version).await?;
    }
    if let Some((stream, partition, offset)) = &script.offset
        && tx.commit_offset(stream, *partition, *offset).await? == OffsetMove::Replay
    {
        return Ok(Response::completed("replay"));
    }
    let key = tx.key().clone();
    sqlx::query(
        "INSERT INTO test_effects (source, event_id, amount, account) VALUES ($1, $2, $3, $4)",
    )
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .bind(script.amount)
    .bind(script.account)
    .execute(tx.conn())
    .await?;
    sqlx::query("UPDATE test_accounts SET balance = balance + $1 WHERE id = $2")
        .bind(script.amount)
        .bind(script.account)
        .execute(tx.conn())
        .await?;
    if let Some(order) = &script.email
        && tx.once("email", order).await? == Once::First
    {
        sqlx::query("INSERT INTO test_emails (order_key) VALUES ($1)")
            .bind(order)
            .execute(tx.conn())
            .await?;
        let _ = tx
            .enqueue(&OutboxMessage::json(
                "email",
                order.as_str(),
                format!(r#"{{"order":"{order}"}}"#),
            ))
            .await?;
    }
    let mut answers = Vec::new();
    for (key, body) in &script.notes {
        let queued = tx
            .enqueue(&OutboxMessage::json("notes", key.as_str(), body.as_str()))
            .await?;
        answers.push(format!("{queued:?}"));
    }
    match &script.end {
        End::Complete(_) if !answers.is_empty() => Ok(Response::completed(answers.join(","))),
        End::Complete(body) => Ok(Response::completed(body.as_str())),
        End::Reject(body) => Ok(Response::rejected(body.as_str())),
        End::Fail => Err(HandlerError::failed("scripted failure")),
        End::Panic => panic!("scripted panic"),
    }
}

async fn observe(pool: &PgPool) -> Result<Observed, sqlx::Error> {
    let mut seen = Observed::default();
    for r in sqlx::query("SELECT source, event_id, count(*) FROM test_effects GROUP BY 1, 2")
        .fetch_all(pool)
        .await?
    {
        seen.effects
            .insert((r.try_get(0)?, r.try_get(1)?), r.try_get(2)?);
    }
    seen.balance = sqlx::query_scalar("SELECT balance FROM test_accounts WHERE id = 1")
        .fetch_one(pool)
        .await?;
    seen.emails = sqlx::query_scalar("SELECT order_key FROM test_emails ORDER BY id")
        .fetch_all(pool)
        .await?;
    seen.outbox =
        sqlx::query_as("SELECT destination, idempotency_key FROM oncebox_outbox ORDER BY id")
            .fetch_all(pool)
            .await?;
    seen.inbox_rows = sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
        .fetch_one(pool)
        .await?;
    seen.conflicts = sqlx::query_scalar("SELECT count(*) FROM oncebox_conflicts")
        .fetch_one(pool)
        .await?;
    Ok(seen)
}

impl Backend for Postgres {
    async fn another(&self) -> Postgres {
        Postgres::open(self.schema.clone(), self.clock.clone()).await
    }

    async fn fresh(clock: ManualClock) -> Postgres {
        Postgres::open(schema(), clock).await
    }

    async fn reopen(self) -> Postgres {
        let Postgres {
            inbox,
            schema,
            clock,
        } = self;
        inbox.pool().close().await;
        drop(inbox);
        Postgres::open(schema, clock).await
    }

    async fn crash(self, event: Event, script: Script, at: CrashAt) -> (Postgres, Crashed) {
        let crashed = match at {
            CrashAt::AfterCommit => match self.process(event, script).await {
                Ok(Processed::Applied(_)) => Crashed::Died,
                other => Crashed::Answered(other),
            },
            CrashAt::BeforeCommit => self.killed_before_commit(event, script).await,
        };
        (self.reopen().await, crashed)
    }

    async fn process(&self, event: Event, script: Script) -> Result<Processed, ProcessError> {
        self.inbox
            .process(event, move |tx| {
                Box::pin(async move { run_script(tx, &script).await })
            })
            .await
    }

    async fn begin(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        self.inbox.begin(event, ttl).await
    }

    async fn complete(&self, lease: &Lease, response: Response) -> Result<(), LeaseError> {
        self.inbox.complete(lease, response).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inbox.release(lease).await
    }

    async fn uncertain(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inbox.uncertain(lease).await
    }

    async fn resolve(&self, key: &Key, completed: Option<Response>) -> bool {
        let resolution = completed.map_or(Resolution::Released, Resolution::Completed);
        self.inbox.resolve(key, resolution).await.expect("resolve")
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> u64 {
        self.inbox.purge(now, retention).await.expect("purge")
    }

    async fn deliver_due(&self, now: Timestamp) -> usize {
        oncebox_testkit::relay::deliver_due(&self.inbox, now).await
    }

    async fn observe(&self) -> Observed {
        observe(self.inbox.pool()).await.expect("observe")
    }

    async fn stats(&self) -> oncebox_core::store::Stats {
        oncebox_core::store::EventStore::stats(&self.inbox)
            .await
            .expect("stats")
    }

    async fn forget_purge_anchors(&self) {
        sqlx::query("DELETE FROM oncebox_purge_anchors")
            .execute(self.inbox.pool())
            .await
            .expect("delete anchors");
    }

    async fn hold_writes(&self) -> Box<dyn std::any::Any + Send> {
        // A session of its own holding the inbox table against inserts in an open transaction;
        // dropped, its connection closes and the server ends the transaction.
        let mut conn = sqlx::PgConnection::connect(&url().expect("ONCEBOX_POSTGRES_URL"))
            .await
            .expect("connect");
        let schema = self.schema.replace('"', "\"\"");
        sqlx::Executor::execute(
            &mut conn,
            format!(
                "SET search_path TO \"{schema}\"; BEGIN; \
                 LOCK TABLE oncebox_inbox IN EXCLUSIVE MODE"
            )
            .as_str(),
        )
        .await
        .expect("lock the inbox");
        Box::new(conn)
    }

    async fn held_requests(&self) -> usize {
        let schema = self.schema.replace('"', "\"\"");
        let waiting: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM pg_locks \
             WHERE NOT granted AND relation = '\"{schema}\".oncebox_inbox'::regclass"
        ))
        // On a connection of its own: the held requests may hold every one of the pool's.
        .fetch_one(
            &mut sqlx::PgConnection::connect(&url().expect("ONCEBOX_POSTGRES_URL"))
                .await
                .expect("connect"),
        )
        .await
        .expect("read pg_locks");
        usize::try_from(waiting).unwrap_or(0)
    }

    fn available() -> bool {
        url().is_some()
    }
}

/// `setting` in the session of backend `pid`, read on the pool's own connection to it: every
/// connection of `pool` (opened with `max_connections(2)`, the least) is taken at once, so one
/// of them is it; none is a failure (the connection was closed, and the test proves nothing).
pub async fn session_setting(pool: &PgPool, pid: i32, setting: &str) -> String {
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(pool.acquire().await.expect("a pooled connection"));
    }
    for conn in &mut held {
        let (p, value): (i32, String) =
            sqlx::query_as("SELECT pg_backend_pid(), current_setting($1)")
                .bind(setting)
                .fetch_one(&mut **conn)
                .await
                .expect("read the setting");
        if p == pid {
            return value;
        }
    }
    panic!("no pooled connection is backend {pid}: the session under test was closed")
}
