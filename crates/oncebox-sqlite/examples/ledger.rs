//! Seed 003's credit ledger on a real SQLite file: every step of the article and its exercises.

use std::path::Path;
use std::sync::Barrier;

use oncebox_core::{Event, Key, ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::{self, Connection, params};
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};

#[path = "common/ledger.rs"]
mod common;
pub use common::{BoxError, DELIVERIES, LedgerSummary};
use common::{Credit, CreditError};

/// The application's own tables. `credits` references `accounts`, so a credit to a missing
/// account fails on the foreign key (oncebox turns `foreign_keys` on for every connection).
const SCHEMA: &str = "
CREATE TABLE accounts (
    id INTEGER PRIMARY KEY,
    balance INTEGER NOT NULL DEFAULT 0 CHECK (balance >= 0));
CREATE TABLE credits (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    account_id INTEGER NOT NULL REFERENCES accounts (id),
    amount INTEGER NOT NULL CHECK (amount > 0));
INSERT INTO accounts (id) VALUES (1);
";

/// The seed's numbers: its 20 deliveries (`DELIVERIES`) of one event from 8 threads.
pub const THREADS: usize = 8;

/// Runs the whole scenario on a new database in `dir`.
pub fn run(dir: &Path) -> Result<LedgerSummary, BoxError> {
    let inbox = open(dir)?;

    let first = deliver(&inbox, credit("provider-a", "evt-1", 1, 500)?, false)?;
    let repeat = deliver(&inbox, credit("provider-a", "evt-1", 1, 500)?, false)?;
    let conflict = deliver(&inbox, credit("provider-a", "evt-1", 1, 700)?, false);
    let balance_after_conflict = inbox.read_blocking(account_balance)?;

    let evt2 = credit("provider-a", "evt-2", 1, 500)?;
    let failed = deliver(&inbox, evt2.clone(), true);
    let balance_after_failure = inbox.read_blocking(account_balance)?;
    let evt2_recorded_after_failure = inbox.read_blocking(|c| recorded(c, &evt2.key))?;
    let retry = deliver(&inbox, evt2, false)?;

    let evt3 = credit("provider-a", "evt-3", 1, 500)?;
    let (mut applied, mut duplicates) = (Vec::new(), Vec::new());
    for outcome in deliver_concurrently(&inbox, &evt3) {
        match outcome? {
            Processed::Applied(r) => applied.push(r),
            Processed::Duplicate(r) => duplicates.push(r),
            other => return Err(format!("unexpected outcome for evt-3: {other:?}").into()),
        }
    }
    let balance = inbox.read_blocking(account_balance)?;
    let inbox_rows = inbox.read_blocking(|c| count(c, "oncebox_inbox"))?;
    let credit_rows = inbox.read_blocking(|c| count(c, "credits"))?;

    let other_source = deliver(&inbox, credit("provider-b", "evt-1", 1, 500)?, false)?;
    let balance_with_other_source = inbox.read_blocking(account_balance)?;
    let missing_account = deliver(&inbox, credit("provider-a", "evt-4", 99, 500)?, false);
    let inbox_rows_after_missing_account = inbox.read_blocking(|c| count(c, "oncebox_inbox"))?;
    let late_duplicate = deliver(&inbox, evt3, false)?;

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

/// A new ledger database in `dir`: the inbox and the application's tables, account 1 at 0.
pub fn open(dir: &Path) -> Result<Inbox, BoxError> {
    let inbox = Inbox::open(Options::new(dir.join("ledger.db")))?;
    inbox.write_blocking(|c| c.execute_batch(SCHEMA))?;
    Ok(inbox)
}

/// What the ledger holds: account 1's balance, the credit rows and the inbox's records.
pub fn state(inbox: &Inbox) -> Result<(i64, i64, i64), BoxError> {
    Ok(inbox.read_blocking(|c| {
        Ok((
            account_balance(c)?,
            count(c, "credits")?,
            count(c, "oncebox_inbox")?,
        ))
    })?)
}

/// The sender's side: a credit event. The key comes from the (already authenticated) sender,
/// never from the payload.
pub fn credit(source: &str, id: &str, account: i64, amount: i64) -> Result<Event, BoxError> {
    let payload = format!(r#"{{"account_id":{account},"amount":{amount}}}"#);
    Ok(Event::json(Key::parse(source, id)?, payload)?)
}

/// One delivery. `then_fail` simulates a failure of the handler after its SQL ran: the seed's
/// `fail_after_insert`, here after the inbox claim *and* the credit.
pub fn deliver(inbox: &Inbox, event: Event, then_fail: bool) -> Result<Processed, ProcessError> {
    // Read once, outside the transaction; a bad payload fails the handler and writes nothing.
    let parsed = Credit::parse(&event.payload);
    inbox.process_blocking(event, move |tx| {
        let response = apply(tx, parsed.map_err(HandlerError::failed)?)?;
        if then_fail {
            return Err(HandlerError::failed("simulated failure after the credit"));
        }
        Ok(response)
    })
}

/// `DELIVERIES` deliveries of `event` from `THREADS` threads released together by a barrier,
/// so they really race for the key (no sleeps).
fn deliver_concurrently(inbox: &Inbox, event: &Event) -> Vec<Result<Processed, ProcessError>> {
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    (t..DELIVERIES)
                        .step_by(THREADS)
                        .map(|_| deliver(inbox, event.clone(), false))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The handler: the credit row, the balance and the response all go into the transaction that
/// records the key, so a duplicate replays this exact body.
fn apply(tx: &mut Tx<'_>, credit: Credit) -> Result<Response, HandlerError> {
    let Credit { account, amount } = credit;
    let (key, conn) = (tx.key(), tx.conn());
    conn.execute(
        "INSERT INTO credits (source, event_id, account_id, amount) VALUES (?1, ?2, ?3, ?4)",
        params![key.source.as_str(), key.event_id.as_str(), account, amount],
    )?;
    let updated = conn.execute(
        "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
        params![amount, account],
    )?;
    // The foreign key already refuses a missing account; this keeps the handler honest if the
    // schema ever loses it, since an UPDATE of no row is not an error to SQLite.
    if updated != 1 {
        return Err(HandlerError::failed(CreditError::NoAccount(account)));
    }
    // The balance *now*, inside the transaction: it cannot be recomputed later, when other
    // credits have moved it, which is why the first response is stored.
    let balance: i64 = conn.query_row(
        "SELECT balance FROM accounts WHERE id = ?1",
        [account],
        |r| r.get(0),
    )?;
    Ok(Response::completed(format!(r#"{{"balance":{balance}}}"#)))
}

fn account_balance(c: &Connection) -> rusqlite::Result<i64> {
    c.query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| {
        r.get(0)
    })
}

fn count(c: &Connection, table: &str) -> rusqlite::Result<i64> {
    c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
}

fn recorded(c: &Connection, key: &Key) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT EXISTS (SELECT 1 FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2)",
        params![key.source.as_str(), key.event_id.as_str()],
        |r| r.get(0),
    )
}

#[cfg_attr(test, allow(dead_code, reason = "the tests call `run`, not `main`"))]
#[allow(clippy::print_stdout, reason = "an example reports what it did")]
fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let summary = run(dir.path())?;
    println!("{summary}");
    if summary.seed_holds() {
        Ok(())
    } else {
        Err("the scenario did not end as the seed says".into())
    }
}
