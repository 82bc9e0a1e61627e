//! Seeds 000 and 002's natural idempotency: a status moves only along its allowed transitions
//! (`UPDATE … WHERE status = 'created'`), so a second report of a payment, under another event
//! id, changes nothing, is still answered (acknowledged), and a late report cannot undo a
//! refund. The inbox answers the same event delivered twice; the guard answers the same fact.

use std::path::Path;

use oncebox_core::{Event, Key, ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::{self, params};
use oncebox_sqlite::{HandlerError, Inbox, Options};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application's payments, and its ledger of money received.
const SCHEMA: &str = "
CREATE TABLE payments (id TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE ledger (payment TEXT NOT NULL, amount INTEGER NOT NULL);
INSERT INTO payments (id, status) VALUES ('p-1', 'created');
";

/// What each delivery answered, then the payment's status and its ledger lines.
#[derive(Debug)]
pub struct PaymentSummary {
    pub answers: Vec<(&'static str, Processed)>,
    pub status: String,
    pub ledger: Vec<i64>,
}

/// The provider's reports about p-1, in the order they arrive: the payment succeeded (twice,
/// under two event ids), evt-a delivered again, a refund, then the success yet again.
pub const REPORTS: [(&str, &str); 5] = [
    ("evt-a", "payment.succeeded"),
    ("evt-b", "payment.succeeded"),
    ("evt-a", "payment.succeeded"),
    ("evt-r", "charge.refunded"),
    ("evt-c", "payment.succeeded"),
];

/// Runs the whole scenario on a new database in `dir`.
pub async fn run(dir: &Path) -> Result<PaymentSummary, BoxError> {
    let inbox = Inbox::open(Options::new(dir.join("payments.db")))?;
    inbox.write(|c| c.execute_batch(SCHEMA)).await?;
    let mut answers = Vec::new();
    for (event_id, kind) in REPORTS {
        answers.push((event_id, deliver(&inbox, event_id, kind).await?));
    }
    let status = inbox
        .read(|c| {
            c.query_row("SELECT status FROM payments WHERE id = 'p-1'", [], |r| {
                r.get(0)
            })
        })
        .await?;
    let ledger = inbox
        .read(|c| {
            c.prepare("SELECT amount FROM ledger ORDER BY rowid")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<i64>>>()
        })
        .await?;
    Ok(PaymentSummary {
        answers,
        status,
        ledger,
    })
}

/// One report about p-1, whose amount is 500.
pub async fn deliver(inbox: &Inbox, event_id: &str, kind: &str) -> Result<Processed, ProcessError> {
    let payload = format!(r#"{{"type":"{kind}","payment":"p-1","amount":500}}"#);
    let key = Key::parse("provider", event_id).map_err(|e| ProcessError::Invalid(e.into()))?;
    let event = Event::json(key, payload).map_err(|e| ProcessError::Invalid(e.into()))?;
    let kind = kind.to_owned();
    inbox
        .process(event, move |tx| {
            // Each report names the one transition it may make; the guard is in the `WHERE`.
            let (from, to, amount) = match kind.as_str() {
                "payment.succeeded" => ("created", "paid", 500),
                "charge.refunded" => ("paid", "refunded", -500),
                other => return Err(HandlerError::failed(format!("unknown report {other}"))),
            };
            let moved = tx.conn().execute(
                "UPDATE payments SET status = ?1 WHERE id = 'p-1' AND status = ?2",
                params![to, from],
            )?;
            // Zero rows: the payment is already past `from`. Not an error: the report is
            // answered, so the provider stops sending it, and nothing changes.
            if moved == 0 {
                return Ok(Response::completed(r#"{"payment":"p-1","changed":false}"#));
            }
            tx.conn().execute(
                "INSERT INTO ledger (payment, amount) VALUES ('p-1', ?1)",
                [amount],
            )?;
            Ok(Response::completed(format!(
                r#"{{"payment":"p-1","changed":true,"status":"{to}"}}"#
            )))
        })
        .await
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
    println!("p-1 is {}, ledger {:?}", s.status, s.ledger);
    Ok(())
}

fn text(body: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(body)
}
