//! Seeds 000 and 002's natural idempotency: a status moves only along its allowed transitions
//! (`UPDATE … WHERE status = 'created'`), so a second report of a payment, under another event
//! id, changes nothing, is still answered (acknowledged), and a late report cannot undo a
//! refund. The inbox answers the same event delivered twice; the guard answers the same fact.
//! Webhooks arrive in any order: a refund reported before the payment's success is recorded
//! from `created` too, and the success after it then changes nothing; a report about a payment
//! not created yet fails, to be sent again, rather than being answered and lost.

use std::path::Path;

use oncebox_core::{Event, Key, ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::{self, params};
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application's payments, and its ledger of money received and returned.
const SCHEMA: &str = "
CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE ledger (payment TEXT NOT NULL, amount INTEGER NOT NULL);
INSERT INTO payments (id, status) VALUES ('p-1', 'created'), ('p-2', 'created');
";

/// What each delivery answered, then each payment's status and the ledger's lines.
#[derive(Debug)]
pub struct PaymentSummary {
    pub answers: Vec<(&'static str, Processed)>,
    pub statuses: Vec<(String, String)>,
    pub ledger: Vec<(String, i64)>,
}

/// The provider's reports, in the order they arrive: p-1's success (twice, under two event
/// ids), evt-a delivered again, its refund, then its success yet again; p-2's refund before
/// its success.
pub const REPORTS: [(&str, &str, &str); 7] = [
    ("evt-a", "payment.succeeded", "p-1"),
    ("evt-b", "payment.succeeded", "p-1"),
    ("evt-a", "payment.succeeded", "p-1"),
    ("evt-r", "charge.refunded", "p-1"),
    ("evt-c", "payment.succeeded", "p-1"),
    ("evt-r2", "charge.refunded", "p-2"),
    ("evt-s2", "payment.succeeded", "p-2"),
];

/// A new database in `dir` with the application's tables and payments p-1 and p-2.
pub async fn open(dir: &Path) -> Result<Inbox, BoxError> {
    let inbox = Inbox::open(Options::new(dir.join("payments.db")))?;
    inbox.write(|c| c.execute_batch(SCHEMA)).await?;
    Ok(inbox)
}

/// Runs the whole scenario on a new database in `dir`.
pub async fn run(dir: &Path) -> Result<PaymentSummary, BoxError> {
    let inbox = open(dir).await?;
    let mut answers = Vec::new();
    for (event_id, kind, payment) in REPORTS {
        answers.push((event_id, deliver(&inbox, event_id, kind, payment).await?));
    }
    let statuses = inbox
        .read(pairs("SELECT id, status FROM payments ORDER BY id"))
        .await?;
    let ledger = inbox
        .read(pairs("SELECT payment, amount FROM ledger ORDER BY rowid"))
        .await?;
    Ok(PaymentSummary {
        answers,
        statuses,
        ledger,
    })
}

/// A query's rows as pairs.
fn pairs<A, B>(
    sql: &'static str,
) -> impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<Vec<(A, B)>>
where
    A: rusqlite::types::FromSql,
    B: rusqlite::types::FromSql,
{
    move |c| {
        c.prepare(sql)?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
    }
}

/// One report about `payment`, whose amount is 500.
pub async fn deliver(
    inbox: &Inbox,
    event_id: &str,
    kind: &str,
    payment: &str,
) -> Result<Processed, ProcessError> {
    let payload = format!(r#"{{"type":"{kind}","payment":"{payment}","amount":500}}"#);
    let key = Key::parse("provider", event_id).map_err(|e| ProcessError::Invalid(e.into()))?;
    let event = Event::json(key, payload).map_err(|e| ProcessError::Invalid(e.into()))?;
    let (kind, payment) = (kind.to_owned(), payment.to_owned());
    inbox
        .process(event, move |tx| {
            // Each report names the transitions it may make, tried in turn: the guard is in
            // the `WHERE`, and the first that moves the row decides the ledger line.
            let moves: &[(&str, &str, i64)] = match kind.as_str() {
                "payment.succeeded" => &[("created", "paid", 500)],
                // From `paid` the money goes back; from `created` the refund came first and
                // the success that follows will change nothing, so no money moves at all.
                "charge.refunded" => &[("paid", "refunded", -500), ("created", "refunded", 0)],
                other => return Err(HandlerError::failed(format!("unknown report {other}"))),
            };
            for (from, to, amount) in moves {
                if transition(tx, &payment, from, to, *amount)? {
                    return Ok(Response::completed(format!(
                        r#"{{"payment":"{payment}","changed":true,"status":"{to}"}}"#
                    )));
                }
            }
            // No row moved. A payment this service does not know yet (the report came before
            // the order that creates it) is the handler's failure: nothing is recorded, the
            // provider sends the report again, and it applies once the payment exists.
            // Answered, it would be a duplicate for ever, its fact lost.
            if !known(tx, &payment)? {
                return Err(HandlerError::failed(format!(
                    "payment {payment} is not known yet"
                )));
            }
            // Otherwise it is already past every `from`. Not an error: the report is
            // answered, so the provider stops sending it, and nothing changes.
            Ok(Response::completed(format!(
                r#"{{"payment":"{payment}","changed":false}}"#
            )))
        })
        .await
}

/// Whether `payment` exists, in whatever status.
fn known(tx: &mut Tx<'_>, payment: &str) -> rusqlite::Result<bool> {
    let found = tx.conn().query_row(
        "SELECT count(*) FROM payments WHERE id = ?1",
        [payment],
        |r| r.get::<_, i64>(0),
    )?;
    Ok(found > 0)
}

/// Moves `payment` from `from` to `to` if it is there, with its ledger line; whether it moved.
fn transition(
    tx: &mut Tx<'_>,
    payment: &str,
    from: &str,
    to: &str,
    amount: i64,
) -> rusqlite::Result<bool> {
    let moved = tx.conn().execute(
        "UPDATE payments SET status = ?1 WHERE id = ?2 AND status = ?3",
        params![to, payment, from],
    )?;
    if moved == 1 && amount != 0 {
        tx.conn().execute(
            "INSERT INTO ledger (payment, amount) VALUES (?1, ?2)",
            params![payment, amount],
        )?;
    }
    Ok(moved == 1)
}

#[cfg_attr(test, allow(dead_code, reason = "the tests call `run`, not `main`"))]
#[allow(clippy::print_stdout, reason = "an example reports what it did")]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let s = run(dir.path()).await?;
    for (event_id, answer) in &s.answers {
        match answer {
            Processed::Applied(r) => println!("{event_id}: applied {}", text(&r.body)),
            Processed::Duplicate(r) => println!("{event_id}: duplicate {}", text(&r.body)),
            other => println!("{event_id}: {other:?}"),
        }
    }
    println!("payments {:?}, ledger {:?}", s.statuses, s.ledger);
    Ok(())
}

fn text(body: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(body)
}
