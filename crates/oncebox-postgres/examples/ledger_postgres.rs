//! Seeds 002 and 003's credit ledger on PostgreSQL: every step of the SQLite example, with the
//! concurrent deliveries split between two nodes sharing one database.
//!
//! Run with a database it may create a schema in (the schema is dropped at the end):
//!
//!     ONCEBOX_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!         cargo run -p oncebox-postgres --example ledger_postgres

use std::sync::Arc;

use futures::future::BoxFuture;
use oncebox_core::{Event, Key, ProcessError, Processed, Response};
use oncebox_postgres::sqlx::{self, Connection, PgConnection};
use oncebox_postgres::{HandlerError, Inbox, Options, Tx};
use tokio::sync::Barrier;

#[path = "../../oncebox-sqlite/examples/common/ledger.rs"]
mod common;
pub use common::{BoxError, DELIVERIES, LedgerSummary};
use common::{Credit, CreditError};

/// The variable naming the database.
pub const URL_VAR: &str = "ONCEBOX_POSTGRES_URL";

/// The application's own tables, in the inbox's schema. `credits` references `accounts`, so a
/// credit to a missing account fails on the foreign key. Its unique key is seed 002's
/// `uq_transactions_idempotency_key`, kept as a second line: the inbox claims the key first, so
/// a duplicate never reaches the `INSERT` and the constraint never fires.
const SCHEMA: &str = "
CREATE TABLE accounts (
    id BIGINT PRIMARY KEY,
    balance BIGINT NOT NULL DEFAULT 0 CHECK (balance >= 0));
CREATE TABLE credits (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    account_id BIGINT NOT NULL REFERENCES accounts (id),
    amount BIGINT NOT NULL CHECK (amount > 0),
    UNIQUE (source, event_id));
INSERT INTO accounts (id) VALUES (1);
";

/// Runs the whole scenario in a new schema `schema` of the database `url` names: two nodes
/// (two inboxes, each with its own pool) on that one schema.
pub async fn run(url: &str, schema: &str) -> Result<LedgerSummary, BoxError> {
    let node_a = open(url, schema).await?;
    let node_b = open(url, schema).await?;
    sqlx::raw_sql(SCHEMA).execute(node_a.pool()).await?;

    let first = deliver(&node_a, credit("provider-a", "evt-1", 1, 500)?, false).await?;
    let repeat = deliver(&node_b, credit("provider-a", "evt-1", 1, 500)?, false).await?;
    let conflict = deliver(&node_a, credit("provider-a", "evt-1", 1, 700)?, false).await;
    let balance_after_conflict = account_balance(&node_a).await?;

    let evt2 = credit("provider-a", "evt-2", 1, 500)?;
    let failed = deliver(&node_a, evt2.clone(), true).await;
    let balance_after_failure = account_balance(&node_a).await?;
    let evt2_recorded_after_failure = recorded(&node_a, &evt2.key).await?;
    let retry = deliver(&node_b, evt2, false).await?;

    let evt3 = credit("provider-a", "evt-3", 1, 500)?;
    let (mut applied, mut duplicates) = (Vec::new(), Vec::new());
    for outcome in deliver_concurrently([&node_a, &node_b], &evt3).await? {
        match outcome? {
            Processed::Applied(r) => applied.push(r),
            Processed::Duplicate(r) => duplicates.push(r),
            other => return Err(format!("unexpected outcome for evt-3: {other:?}").into()),
        }
    }
    let balance = account_balance(&node_a).await?;
    let inbox_rows = count(&node_a, "oncebox_inbox").await?;
    let credit_rows = count(&node_a, "credits").await?;

    let other_source = deliver(&node_b, credit("provider-b", "evt-1", 1, 500)?, false).await?;
    let balance_with_other_source = account_balance(&node_a).await?;
    let missing_account = deliver(&node_a, credit("provider-a", "evt-4", 99, 500)?, false).await;
    let inbox_rows_after_missing_account = count(&node_a, "oncebox_inbox").await?;
    let late_duplicate = deliver(&node_b, evt3, false).await?;

    Ok(LedgerSummary {
        first,
        repeat,
        conflict,
        balance_after_conflict,
        failed,
        balance_after_failure,
        evt2_recorded_after_failure,
        retry,
        applied,
        duplicates,
        balance,
        inbox_rows,
        credit_rows,
        other_source,
        balance_with_other_source,
        missing_account,
        inbox_rows_after_missing_account,
        late_duplicate,
    })
}

/// One node: an inbox on `schema`, which the first to open creates and migrates.
pub async fn open(url: &str, schema: &str) -> Result<Inbox, BoxError> {
    Ok(Inbox::open(Options::new(url).schema(schema).max_connections(8)).await?)
}

/// Drops the scenario's schema with everything in it.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// The sender's side: a credit event. The key comes from the (already authenticated) sender,
/// never from the payload.
pub fn credit(source: &str, id: &str, account: i64, amount: i64) -> Result<Event, BoxError> {
    let payload = format!(r#"{{"account_id":{account},"amount":{amount}}}"#);
    Ok(Event::json(Key::parse(source, id)?, payload)?)
}

/// One delivery. `then_fail` simulates a failure of the handler after its SQL ran: the seed's
/// `fail_after_insert`, here after the inbox claim *and* the credit.
pub async fn deliver(
    inbox: &Inbox,
    event: Event,
    then_fail: bool,
) -> Result<Processed, ProcessError> {
    // Read once, outside the transaction; a bad payload fails the handler and writes nothing.
    let parsed = Credit::parse(&event.payload);
    inbox
        .process(event, move |tx| {
            Box::pin(async move {
                let response = apply(tx, parsed.map_err(HandlerError::failed)?).await?;
                if then_fail {
                    return Err(HandlerError::failed("simulated failure after the credit"));
                }
                Ok(response)
            })
        })
        .await
}

/// `DELIVERIES` deliveries of `event`, alternately through each node, from tasks released
/// together by a barrier, so they really race for the key (no sleeps).
async fn deliver_concurrently(
    nodes: [&Inbox; 2],
    event: &Event,
) -> Result<Vec<Result<Processed, ProcessError>>, BoxError> {
    let start = Arc::new(Barrier::new(DELIVERIES));
    let tasks: Vec<_> = (0..DELIVERIES)
        .map(|i| {
            let (inbox, event, start) = (nodes[i % 2].clone(), event.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                deliver(&inbox, event, false).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(DELIVERIES);
    for task in tasks {
        outcomes.push(task.await?);
    }
    Ok(outcomes)
}

/// The handler: the credit row, the balance and the response all go into the transaction that
/// records the key, so a duplicate replays this exact body.
fn apply(tx: &mut Tx, credit: Credit) -> BoxFuture<'_, Result<Response, HandlerError>> {
    Box::pin(async move {
        let Credit { account, amount } = credit;
        let (key, conn) = tx.parts();
        sqlx::query(
            "INSERT INTO credits (source, event_id, account_id, amount) VALUES ($1, $2, $3, $4)",
        )
        .bind(key.source.as_str())
        .bind(key.event_id.as_str())
        .bind(account)
        .bind(amount)
        .execute(conn)
        .await?;
        // The balance *now*, inside the transaction: it cannot be recomputed later, when other
        // credits have moved it, which is why the first response is stored.
        let balance: Option<i64> = sqlx::query_scalar(
            "UPDATE accounts SET balance = balance + $1 WHERE id = $2 RETURNING balance",
        )
        .bind(amount)
        .bind(account)
        .fetch_optional(tx.conn())
        .await?;
        // The foreign key already refuses a missing account; this keeps the handler honest if
        // the schema ever loses it, since an UPDATE of no row is not an error.
        let balance = balance.ok_or(HandlerError::failed(CreditError::NoAccount(account)))?;
        Ok(Response::completed(format!(r#"{{"balance":{balance}}}"#)))
    })
}

async fn account_balance(inbox: &Inbox) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 1")
        .fetch_one(inbox.pool())
        .await
}

async fn count(inbox: &Inbox, table: &str) -> sqlx::Result<i64> {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(inbox.pool())
        .await
}

async fn recorded(inbox: &Inbox, key: &Key) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM oncebox_inbox WHERE source = $1 AND event_id = $2)",
    )
    .bind(key.source.as_str())
    .bind(key.event_id.as_str())
    .fetch_one(inbox.pool())
    .await
}

#[cfg_attr(test, allow(dead_code, reason = "the tests call `run`, not `main`"))]
#[allow(clippy::print_stdout, reason = "an example reports what it did")]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var(URL_VAR).map_err(|_| {
        format!(
            "set {URL_VAR} to a PostgreSQL database the example may create a schema in, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres"
        )
    })?;
    let schema = format!("ledger_example_{}", std::process::id());
    let summary = run(&url, &schema).await;
    drop_schema(&url, &schema).await?;
    let summary = summary?;
    println!("{summary}");
    if summary.seed_holds() {
        Ok(())
    } else {
        Err("the scenario did not end as the seed says".into())
    }
}
