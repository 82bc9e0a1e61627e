//! The test world: a unique queue and quarantine on the broker (deleted at the end, and set to
//! expire if a test dies first), a SQLite inbox whose handler records one effect row per key,
//! and the figures D, L and F read from it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_core::consume::{Apply, KeyRule, MessageRules, Position, RetryPolicy};
use oncebox_core::{Event, Key, ProcessError, Processed, Response, Source};
use oncebox_sqlite::rusqlite::params;
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};
use tokio::sync::mpsc;

pub const SOURCE: &str = "shop";

/// The handler a user would write: one effect row per event; a payload asking for it fails.
pub fn effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    if event.payload.windows(4).any(|w| w == b"boom") {
        return Err(HandlerError::failed("the payload asked to fail"));
    }
    tx.conn().execute(
        "INSERT INTO effects (event_id) VALUES (?1)",
        [event.key.event_id.as_str()],
    )?;
    Ok(Response::completed("ok"))
}

pub type Effects = InboxHandler<fn(&mut Tx<'_>, &Event) -> Result<Response, HandlerError>>;

/// Wraps the real `Apply` to count calls, report each key it is handed, and check every
/// duplicate answer against the committed effects at that moment (the figure F).
#[derive(Clone)]
pub struct Checked<A> {
    pub inner: A,
    pub inbox: Inbox,
    pub calls: Arc<AtomicU64>,
    pub false_duplicates: Arc<AtomicU64>,
    pub seen: Option<mpsc::UnboundedSender<Key>>,
}

impl<A: Apply> Apply for Checked<A> {
    async fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> Result<Processed, ProcessError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let key = event.key.clone();
        if let Some(seen) = &self.seen {
            let _ = seen.send(key.clone());
        }
        let outcome = self.inner.apply(event, position).await;
        if matches!(outcome, Ok(Processed::Duplicate(_))) && effects_of(&self.inbox, &key) == 0 {
            self.false_duplicates.fetch_add(1, Ordering::SeqCst);
        }
        outcome
    }
}

pub fn effects_of(inbox: &Inbox, key: &Key) -> i64 {
    inbox
        .read_blocking(|c| {
            c.query_row(
                "SELECT count(*) FROM effects WHERE event_id = ?1",
                params![key.event_id.as_str()],
                |r| r.get(0),
            )
        })
        .unwrap()
}

/// One test's broker objects and database.
pub struct World {
    pub conn: Connection,
    pub channel: Channel,
    pub queue: String,
    pub quarantine_exchange: String,
    pub quarantine_queue: String,
    pub inbox: Inbox,
    pub dir: tempfile::TempDir,
}

/// Unused test queues vanish after ten minutes even if the test died before deleting them.
fn expiring() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    args
}

impl World {
    pub async fn new(url: &str) -> World {
        World::with_options(url, Options::new).await
    }

    pub async fn with_options(
        url: &str,
        options: impl FnOnce(std::path::PathBuf) -> Options,
    ) -> World {
        let conn = connect(url).await;
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let queue = format!("oncebox-test-{id}");
        let quarantine_exchange = format!("oncebox-test-quarantine-{id}");
        let quarantine_queue = format!("oncebox-test-quarantined-{id}");
        for q in [&queue, &quarantine_queue] {
            channel
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions::default(),
                    expiring(),
                )
                .await
                .unwrap();
        }
        channel
            .exchange_declare(
                quarantine_exchange.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                quarantine_queue.as_str().into(),
                quarantine_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(options(dir.path().join("amqp.db"))).unwrap();
        inbox
            .write(|c| {
                c.execute_batch("CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL)")
            })
            .await
            .unwrap();
        World {
            conn,
            channel,
            queue,
            quarantine_exchange,
            quarantine_queue,
            inbox,
            dir,
        }
    }

    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("amqp.db")
    }

    pub fn options(&self) -> ConsumerOptions {
        let rules = MessageRules::new(Source::new(SOURCE).unwrap(), KeyRule::MessageId);
        let mut o = ConsumerOptions::new(&self.queue, rules, &self.quarantine_exchange);
        o.retry = RetryPolicy {
            delay: Duration::from_millis(20),
            uncertain_delay: Duration::from_millis(20),
            max_attempts: 3,
        };
        o
    }

    pub fn checked(&self) -> Checked<Effects> {
        Checked {
            inner: InboxHandler::new(self.inbox.clone(), effect as _),
            inbox: self.inbox.clone(),
            calls: Arc::default(),
            false_duplicates: Arc::default(),
            seen: None,
        }
    }

    /// Publishes with the message id `id` (none if `None`) and waits for the broker's confirm.
    pub async fn publish(&self, id: Option<&str>, body: &str) {
        let mut props = BasicProperties::default().with_content_type("application/json".into());
        if let Some(id) = id {
            props = props.with_message_id(id.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    /// Messages ready in `queue` (not counting those delivered and unacknowledged).
    pub async fn ready(&self, queue: &str) -> u32 {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        q.message_count()
    }

    /// Waits until `queue` holds exactly `n` ready messages (the broker requeues a closed
    /// channel's messages asynchronously).
    pub async fn wait_ready(&self, queue: &str, n: u32) {
        let mut last = 0;
        for _ in 0..500 {
            last = self.ready(queue).await;
            if last == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{queue}: {last} ready messages, expected {n}");
    }

    /// The quarantined messages' reason headers, taking them off the quarantine queue.
    pub async fn quarantined(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(m) = self
            .channel
            .basic_get(
                self.quarantine_queue.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let headers = m.delivery.properties.headers().clone().unwrap_or_default();
            let reason = match headers.inner().get("x-oncebox-reason") {
                Some(AMQPValue::LongString(s)) => {
                    String::from_utf8_lossy(s.as_bytes()).into_owned()
                }
                other => panic!("quarantined without a reason: {other:?}"),
            };
            out.push((reason, m.delivery.data.clone()));
        }
        out.sort();
        out
    }

    /// D, L and F over `keys` (every one of which was acknowledged by the end).
    pub fn figures(&self, keys: &[&str], false_duplicates: u64) -> (usize, usize, u64) {
        let counts: Vec<i64> = keys
            .iter()
            .map(|k| effects_of(&self.inbox, &Key::parse(SOURCE, k).unwrap()))
            .collect();
        let doubles = counts.iter().filter(|n| **n > 1).count();
        let lost = counts.iter().filter(|n| **n == 0).count();
        (doubles, lost, false_duplicates)
    }

    pub async fn cleanup(self) {
        for q in [&self.queue, &self.quarantine_queue] {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(
                self.quarantine_exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.conn.close(200, "done".into()).await;
    }
}

pub async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap()
}

/// Runs `consumer` on its own connection until the returned sender fires or is dropped.
pub fn start<A: Apply>(
    url: &str,
    consumer: Arc<Consumer<A>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), oncebox_amqp::ConsumeError>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let url = url.to_owned();
    let task = tokio::spawn(async move {
        let conn = connect(&url).await;
        let out = consumer
            .run(&conn, async move {
                let _ = stopped.await;
            })
            .await;
        let _ = conn.close(200, "done".into()).await;
        out
    });
    (stop, task)
}
