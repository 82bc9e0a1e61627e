//! The test world: a unique stream and quarantine stream on the server (deleted at the end),
//! a SQLite inbox whose handler records one effect row per key, and the figures D, L and F.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use oncebox_core::consume::{Apply, Counts, KeyRule, MessageRules, Position, RetryPolicy};
use oncebox_core::{Event, Key, ProcessError, Processed, Response, Source};
use oncebox_nats::{Consumer, ConsumerOptions, InboxHandler};
use oncebox_sqlite::rusqlite::params;
use oncebox_sqlite::{HandlerError, Inbox, Options, Tx};
use tokio::sync::mpsc;

pub const SOURCE: &str = "shop";
/// The tests' key header. Not `Nats-Msg-Id`: the stream's own publish dedup window would
/// swallow the duplicates these tests publish on purpose, and oncebox never relies on it.
pub const KEY_HEADER: &str = "Event-Id";

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

/// One test's streams and database.
pub struct World {
    pub js: jetstream::Context,
    pub stream: String,
    pub subject: String,
    pub quarantine_stream: String,
    pub quarantine_subject: String,
    pub durable: String,
    pub inbox: Inbox,
    pub dir: tempfile::TempDir,
}

impl World {
    pub async fn new(url: &str) -> World {
        World::with_options(url, Options::new).await
    }

    pub async fn with_options(
        url: &str,
        options: impl FnOnce(std::path::PathBuf) -> Options,
    ) -> World {
        let js = connect(url).await;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (stream, subject) = (
            format!("ONCEBOX_TEST_{id}"),
            format!("oncebox.test.{id}.events"),
        );
        let quarantine_stream = format!("ONCEBOX_TESTQ_{id}");
        let quarantine_subject = format!("oncebox.test.{id}.quarantine");
        for (name, subject) in [
            (&stream, &subject),
            (&quarantine_stream, &quarantine_subject),
        ] {
            js.create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                max_age: Duration::from_secs(600),
                ..stream::Config::default()
            })
            .await
            .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(options(dir.path().join("nats.db"))).unwrap();
        inbox
            .write(|c| {
                c.execute_batch("CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL)")
            })
            .await
            .unwrap();
        World {
            js,
            stream,
            subject,
            quarantine_stream,
            quarantine_subject,
            durable: format!("oncebox-{id}"),
            inbox,
            dir,
        }
    }

    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("nats.db")
    }

    pub fn options(&self) -> ConsumerOptions {
        let rules = MessageRules::new(
            Source::new(SOURCE).unwrap(),
            KeyRule::Header(KEY_HEADER.into()),
        );
        let mut o =
            ConsumerOptions::new(&self.stream, &self.durable, rules, &self.quarantine_subject);
        // Long enough that no test sees a redelivery it did not ask for.
        o.ack_wait = Duration::from_secs(10);
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

    /// Publishes with the key header `id` (none if `None`) and waits for the stream's ack.
    pub async fn publish(&self, id: Option<&str>, body: &str) {
        let mut headers = HeaderMap::new();
        if let Some(id) = id {
            headers.insert(KEY_HEADER, id);
        }
        self.js
            .publish_with_headers(self.subject.clone(), headers, body.to_owned().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub async fn consumer_info(&self) -> consumer::Info {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        stream.consumer_info(&self.durable).await.unwrap()
    }

    /// Waits until the server holds nothing for the consumer: every message acknowledged.
    pub async fn wait_all_acked(&self) -> consumer::Info {
        let mut info = self.consumer_info().await;
        for _ in 0..500 {
            if info.num_ack_pending == 0 && info.num_pending == 0 {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            info = self.consumer_info().await;
        }
        panic!("still pending: {info:?}");
    }

    /// Waits until the consumer's counts satisfy `done`; after 20 s fails with what the
    /// consumer and the server say, instead of hanging until the test's timeout.
    pub async fn wait_counts(
        &self,
        counts: &mut tokio::sync::watch::Receiver<Counts>,
        done: impl FnMut(&Counts) -> bool,
    ) -> Counts {
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            *counts.wait_for(done).await.unwrap()
        })
        .await;
        match waited {
            Ok(c) => c,
            Err(_) => {
                let info = self.consumer_info().await;
                panic!("stuck at {:?}; server: {info:?}", *counts.borrow());
            }
        }
    }

    /// The quarantined messages' reasons, in stream order.
    pub async fn quarantined(&self) -> Vec<String> {
        let stream = self.js.get_stream(&self.quarantine_stream).await.unwrap();
        let last = stream.get_info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            let m = stream.get_raw_message(seq).await.unwrap();
            let reason = m.headers.get("Oncebox-Reason").expect("a reason header");
            out.push(reason.to_string());
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
        for s in [&self.stream, &self.quarantine_stream] {
            let _ = self.js.delete_stream(s).await;
        }
    }
}

pub async fn connect(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.unwrap())
}

/// Runs `consumer` on its own connection until the returned sender fires or is dropped.
pub fn start<A: Apply>(
    url: &str,
    consumer: Arc<Consumer<A>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), oncebox_nats::ConsumeError>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let url = url.to_owned();
    let task = tokio::spawn(async move {
        let js = connect(&url).await;
        consumer
            .run(&js, async move {
                let _ = stopped.await;
            })
            .await
    });
    (stop, task)
}
