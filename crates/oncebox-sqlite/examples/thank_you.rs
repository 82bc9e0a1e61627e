//! Seed 004's thank-you email: one per paid order, whatever events report it (async API).

use std::fmt;
use std::path::Path;

use oncebox_core::json::{self, Pointer, Value};
use oncebox_core::{Enqueued, Event, Key, OutboxMessage, ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::{self, Connection, params};
use oncebox_sqlite::{HandlerError, Inbox, Once, Options, Tx};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application's own tables: its orders, and its record that a thank-you email was queued.
const SCHEMA: &str = "
CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE emails (id INTEGER PRIMARY KEY, order_id TEXT NOT NULL, customer TEXT NOT NULL);
";

/// What each delivery answered and what the shop's tables hold afterwards.
#[derive(Debug)]
pub struct ThankYouSummary {
    /// order.created(o-1, v1).
    pub created: Processed,
    /// order.paid(o-1, v2) as evt-paid-a.
    pub paid: Processed,
    pub emails_after_paid: i64,
    /// The same payment re-exported by the shop under a new event id, evt-paid-b.
    pub re_exported: Processed,
    pub emails_after_re_export: i64,
    /// evt-paid-a delivered again.
    pub redelivered: Processed,
    /// A late order.created(o-1, v1) under a new event id, and o-1's status after it.
    pub late_created: Processed,
    pub status_after_late: String,
    /// The same customer's next purchase, o-2: created, then paid.
    pub next_created: Processed,
    pub next_paid: Processed,
    /// `(order_id, customer)` of every queued email, in order.
    pub emails: Vec<(String, String)>,
    /// `(destination, idempotency_key)` of every outbox message, in order.
    pub outbox: Vec<(String, String)>,
}

/// Runs the whole scenario on a new database in `dir`.
pub async fn run(dir: &Path) -> Result<ThankYouSummary, BoxError> {
    let inbox = Inbox::open(Options::new(dir.join("shop.db")))?;
    inbox.write(|c| c.execute_batch(SCHEMA)).await?;

    let created = deliver(&inbox, "evt-created-1", "order.created", "o-1", 1).await?;
    let paid = deliver(&inbox, "evt-paid-a", "order.paid", "o-1", 2).await?;
    let emails_after_paid = inbox.read(|c| count(c, "emails")).await?;
    let re_exported = deliver(&inbox, "evt-paid-b", "order.paid", "o-1", 2).await?;
    let emails_after_re_export = inbox.read(|c| count(c, "emails")).await?;
    let redelivered = deliver(&inbox, "evt-paid-a", "order.paid", "o-1", 2).await?;
    let late_created = deliver(&inbox, "evt-created-1-late", "order.created", "o-1", 1).await?;
    let status_after_late = inbox.read(|c| status(c, "o-1")).await?;
    let next_created = deliver(&inbox, "evt-created-2", "order.created", "o-2", 1).await?;
    let next_paid = deliver(&inbox, "evt-paid-2", "order.paid", "o-2", 2).await?;

    let emails = inbox
        .read(|c| pairs(c, "SELECT order_id, customer FROM emails ORDER BY id"))
        .await?;
    let outbox = inbox
        .read(|c| {
            pairs(
                c,
                "SELECT destination, idempotency_key FROM oncebox_outbox ORDER BY id",
            )
        })
        .await?;
    Ok(ThankYouSummary {
        created,
        paid,
        emails_after_paid,
        re_exported,
        emails_after_re_export,
        redelivered,
        late_created,
        status_after_late,
        next_created,
        next_paid,
        emails,
        outbox,
    })
}

/// One delivery from the shop to customer c-1. The sender's ids are fixed literals here, so
/// plain formatting builds a valid payload.
pub async fn deliver(
    inbox: &Inbox,
    event_id: &str,
    kind: &str,
    order_id: &str,
    version: i64,
) -> Result<Processed, ProcessError> {
    let payload = format!(
        r#"{{"type":"{kind}","order_id":"{order_id}","customer":"c-1","version":{version}}}"#
    );
    let key = Key::parse("shop", event_id).map_err(|e| ProcessError::Invalid(e.into()))?;
    let event = Event::json(key, payload).map_err(|e| ProcessError::Invalid(e.into()))?;
    // Read once, outside the transaction; an unreadable event fails the handler, writing nothing.
    let order = OrderEvent::parse(&event.payload);
    inbox
        .process(event, move |tx| {
            handle(tx, &order.map_err(HandlerError::failed)?)
        })
        .await
}

/// The handler. Three guards, each against a different repeat:
/// - the inbox (by oncebox, before this runs): the same event delivered twice;
/// - `advance`: an older event arriving late, which must not move the order back;
/// - `once`: two different events about one payment, which must send one email.
fn handle(tx: &mut Tx<'_>, order: &OrderEvent) -> Result<Response, HandlerError> {
    // Stale stops here with `?`: oncebox rolls back whatever the handler did and records the
    // key as stale, so a paid order never reverts to created.
    tx.advance("order", &order.order_id, order.version)?;
    tx.conn().execute(
        "INSERT INTO orders (id, customer, status) VALUES (?1, ?2, ?3)
         ON CONFLICT (id) DO UPDATE SET status = excluded.status",
        params![order.order_id, order.customer, order.kind.status()],
    )?;
    let mut thank_you = "none";
    // The action key is the order, not the customer: the customer's next purchase is a new
    // order and earns its own email.
    if order.kind == Kind::Paid {
        thank_you = if tx.once("thank-you-email", &order.order_id)? == Once::First {
            tx.conn().execute(
                "INSERT INTO emails (order_id, customer) VALUES (?1, ?2)",
                params![order.order_id, order.customer],
            )?;
            // Sent by a relay after commit; the receiver deduplicates on this key, which must
            // never change for a given order. `Conflict` (another message under the key) is
            // `Ok` and queues nothing: failing here commits nothing.
            let queued = tx.enqueue(&OutboxMessage::json(
                "email",
                format!("thank-you:{}", order.order_id),
                object(&[
                    ("customer", &order.customer),
                    ("order_id", &order.order_id),
                    ("template", "thank-you"),
                ]),
            ))?;
            if queued == Enqueued::Conflict {
                return Err(HandlerError::failed(
                    "another message holds the thank-you key",
                ));
            }
            "queued"
        } else {
            "already-queued"
        };
    }
    Ok(Response::completed(object(&[
        ("order_id", &order.order_id),
        ("status", order.kind.status()),
        ("thank_you", thank_you),
    ])))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Created,
    Paid,
}

impl Kind {
    fn status(self) -> &'static str {
        match self {
            Kind::Created => "created",
            Kind::Paid => "paid",
        }
    }
}

/// An order event as the handler needs it.
#[derive(Debug)]
struct OrderEvent {
    kind: Kind,
    order_id: String,
    customer: String,
    version: i64,
}

#[derive(Debug, thiserror::Error)]
enum OrderEventError {
    #[error("payload is not JSON: {0}")]
    Json(#[from] json::JsonError),
    #[error("field {0} is missing or has the wrong type")]
    Field(&'static str),
    #[error("unknown event type {0:?}")]
    Kind(String),
}

impl OrderEvent {
    fn parse(payload: &[u8]) -> Result<OrderEvent, OrderEventError> {
        let value = json::parse(payload)?;
        let field = |name| value.pointer(&Pointer::from_tokens(vec![String::from(name)]));
        let text = |name: &'static str| {
            field(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(OrderEventError::Field(name))
        };
        let kind = match text("type")?.as_str() {
            "order.created" => Kind::Created,
            "order.paid" => Kind::Paid,
            other => return Err(OrderEventError::Kind(other.to_owned())),
        };
        let version = match field("version") {
            Some(Value::Number(n)) => n.to_i64(),
            _ => None,
        };
        Ok(OrderEvent {
            kind,
            order_id: text("order_id")?,
            customer: text("customer")?,
            version: version.ok_or(OrderEventError::Field("version"))?,
        })
    }
}

/// A JSON object of strings; built as a `Value` so ids from payloads are escaped properly.
fn object(members: &[(&str, &str)]) -> Vec<u8> {
    let members = members
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    Value::Object(members).canonical()
}

fn count(c: &Connection, table: &str) -> rusqlite::Result<i64> {
    c.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
}

fn status(c: &Connection, order_id: &str) -> rusqlite::Result<String> {
    c.query_row("SELECT status FROM orders WHERE id = ?1", [order_id], |r| {
        r.get(0)
    })
}

fn pairs(c: &Connection, sql: &str) -> rusqlite::Result<Vec<(String, String)>> {
    c.prepare(sql)?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect()
}

/// A human line for an outcome: the response body is JSON text, so show it as such.
struct Show<'a>(&'a Processed);

impl fmt::Display for Show<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Processed::Applied(r) => write!(f, "applied {}", String::from_utf8_lossy(&r.body)),
            Processed::Duplicate(r) => write!(f, "duplicate {}", String::from_utf8_lossy(&r.body)),
            other => write!(f, "{other:?}"),
        }
    }
}

impl fmt::Display for ThankYouSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "o-1 created (v1):            {}", Show(&self.created))?;
        writeln!(
            f,
            "o-1 paid, evt-paid-a:        {} (emails {})",
            Show(&self.paid),
            self.emails_after_paid
        )?;
        writeln!(
            f,
            "o-1 paid, evt-paid-b:        {} (emails {})",
            Show(&self.re_exported),
            self.emails_after_re_export
        )?;
        writeln!(
            f,
            "evt-paid-a redelivered:      {}",
            Show(&self.redelivered)
        )?;
        writeln!(
            f,
            "late o-1 created (v1):       {} (o-1 is {})",
            Show(&self.late_created),
            self.status_after_late
        )?;
        writeln!(
            f,
            "o-2 created (v1):            {}",
            Show(&self.next_created)
        )?;
        writeln!(f, "o-2 paid (v2):               {}", Show(&self.next_paid))?;
        writeln!(f, "emails: {:?}", self.emails)?;
        write!(f, "outbox: {:?}", self.outbox)
    }
}

#[cfg_attr(test, allow(dead_code, reason = "the tests call `run`, not `main`"))]
#[allow(clippy::print_stdout, reason = "an example reports what it did")]
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    println!("{}", run(dir.path()).await?);
    Ok(())
}
