//! What the broker consumers' tests and benchmarks share, whatever the broker: the handler a
//! user would write and its effect table, an `Apply` wrapper that checks every duplicate answer,
//! the figures D, L and F, a consumer running on its own task, the faults' tools (a handler held
//! inside its transaction, SQLite's write lock taken from outside, a child process killed at a
//! crash point); the benchmark's part is in `bench`.

use std::fmt::Debug;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::consume::{Apply, Counts, Position};
use oncebox_core::{Event, Key, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::rusqlite::{self, params};
use oncebox_sqlite::{HandlerError, Inbox, InboxHandler, Options, Tx};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

mod bench;
pub use bench::{Drained, Loop, ack_all, backlog, backlog_body, drain, report, rounds};

/// The source every consumer test and benchmark reads messages for.
pub const SOURCE: &str = "shop";

/// Messages the outage tests publish before the database goes away.
pub const OUTAGE_MESSAGES: usize = 20;

/// Messages no consumer can ever process, as `(key, body)`, to publish after `evt_first` with
/// `{"amount":1}` was applied: each is quarantined once, for one of [`POISON_REASONS`].
pub const POISON: [(Option<&str>, &str); 5] = [
    (Some("evt_first"), r#"{"amount":2}"#), // key-reused
    (None, r#"{"amount":3}"#),              // event-id-missing
    (Some("evt_json"), "{not json"),        // invalid-json
    (Some("   "), r#"{"amount":4}"#),       // event-id-invalid
    (Some("evt_boom"), r#"{"boom":true}"#), // handler fails every time
];

/// The quarantine reasons of [`POISON`], sorted.
pub const POISON_REASONS: [&str; 5] = [
    "event-id-invalid",
    "event-id-missing",
    "handler-failed",
    "invalid-json",
    "key-reused",
];

/// The handler a user would write: one effect row per event; a payload asking for it fails.
pub fn effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    if event.payload.windows(4).any(|w| w == b"boom") {
        return Err(HandlerError::failed("the payload asked to fail"));
    }
    // Cached: the handler runs on the writer thread for every event, and parsing the same SQL
    // each time would cost more than the insert.
    tx.conn()
        .prepare_cached("INSERT INTO effects (event_id) VALUES (?1)")?
        .execute([event.key.event_id.as_str()])?;
    Ok(Response::completed("ok"))
}

/// A handler as a plain function, so a test can swap [`effect`] for [`slow_effect`].
pub type Handler = fn(&mut Tx<'_>, &Event) -> Result<Response, HandlerError>;

/// The SQLite inbox with a plain-function handler.
pub type Effects = InboxHandler<Handler>;

/// `shop:{id}`.
pub fn key(id: &str) -> Key {
    Key::parse(SOURCE, id).expect("valid test key")
}

/// The effect rows committed for `key`.
pub fn effects_of(inbox: &Inbox, key: &Key) -> i64 {
    inbox
        .read_blocking(|c| {
            c.query_row(
                "SELECT count(*) FROM effects WHERE event_id = ?1",
                params![key.event_id.as_str()],
                |r| r.get(0),
            )
        })
        .expect("effects are readable")
}

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

impl<A> Debug for Checked<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("calls", &self.calls)
            .field("false_duplicates", &self.false_duplicates)
            .finish_non_exhaustive()
    }
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

    async fn watermark(&self, stream: &str, partition: i64) -> Result<Option<i64>, Unavailable> {
        self.inner.watermark(stream, partition).await
    }
}

/// A SQLite inbox in its own temporary directory, with the `effects` table [`effect`] writes.
#[derive(Debug)]
pub struct Store {
    pub inbox: Inbox,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Store {
    /// Opens the inbox with `options` for its file (`Options::new`, or [`impatient`]).
    pub async fn open(options: impl FnOnce(PathBuf) -> Options) -> Store {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("inbox.db");
        let inbox = Inbox::open(options(path.clone())).expect("inbox opens");
        inbox
            .write(|c| {
                c.execute_batch("CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL)")
            })
            .await
            .expect("effects table");
        Store {
            inbox,
            path,
            _dir: dir,
        }
    }

    /// The database file, for another connection or a child process.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The inbox with [`effect`], checked.
    pub fn checked(&self) -> Checked<Effects> {
        self.checked_with(effect)
    }

    /// The inbox with `handler`, checked.
    pub fn checked_with(&self, handler: Handler) -> Checked<Effects> {
        Checked {
            inner: InboxHandler::new(self.inbox.clone(), handler),
            inbox: self.inbox.clone(),
            calls: Arc::default(),
            false_duplicates: Arc::default(),
            seen: None,
        }
    }

    /// The effect rows committed for `shop:{id}`.
    pub fn effects(&self, id: &str) -> i64 {
        effects_of(&self.inbox, &key(id))
    }

    /// D, L and F over `ids` (every one of which was acknowledged by the end): keys applied
    /// more than once, keys never applied, and duplicate answers without a committed effect.
    pub fn figures(&self, ids: &[&str], false_duplicates: u64) -> (usize, usize, u64) {
        let counts: Vec<i64> = ids.iter().map(|id| self.effects(id)).collect();
        let doubles = counts.iter().filter(|n| **n > 1).count();
        let lost = counts.iter().filter(|n| **n == 0).count();
        (doubles, lost, false_duplicates)
    }

    /// Conflicts kept for audit: one row per time the store was offered a key it holds with
    /// another payload.
    pub async fn conflicts(&self) -> i64 {
        self.inbox
            .read(|c| c.query_row("SELECT count(*) FROM oncebox_conflicts", [], |r| r.get(0)))
            .await
            .expect("conflicts are readable")
    }

    /// Effect rows, and the distinct keys among them.
    pub async fn rows(&self) -> (i64, i64) {
        self.inbox
            .read(|c| {
                c.query_row(
                    "SELECT count(*), count(DISTINCT event_id) FROM effects",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            })
            .await
            .expect("effects are readable")
    }
}

/// Inbox options that give up quickly while another connection holds the write lock, so each
/// attempt during an outage ends soon.
pub fn impatient(path: PathBuf) -> Options {
    Options::new(path).busy_timeout(Duration::from_millis(20))
}

/// `{prefix}_0` to `{prefix}_{n-1}`.
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}_{i}")).collect()
}

/// A consumer running on its own task until [`Running::stop`].
#[derive(Debug)]
pub struct Running<E> {
    counts: watch::Receiver<Counts>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), E>>,
}

impl<E: Debug + Send + 'static> Running<E> {
    /// Spawns `run`, which consumes until the receiver it is handed fires; `counts` are the
    /// consumer's.
    pub fn spawn<F>(
        counts: watch::Receiver<Counts>,
        run: impl FnOnce(oneshot::Receiver<()>) -> F,
    ) -> Running<E>
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(stopped));
        Running { counts, stop, task }
    }

    /// Waits until the counts satisfy `done` and returns them. After 20 s it fails with the
    /// counts and `broker` (what the broker says), instead of hanging until the test's timeout.
    pub async fn wait(
        &mut self,
        done: impl FnMut(&Counts) -> bool,
        broker: impl Future<Output = String>,
    ) -> Counts {
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            self.counts.wait_for(done).await.map(|c| *c).ok()
        })
        .await;
        match waited {
            Ok(Some(c)) => c,
            // The consumer stopped on its own: what it ended with says why.
            Ok(None) => {
                let ended = (&mut self.task).await;
                panic!("the consumer ended while awaited: {ended:?}");
            }
            Err(_) => {
                let broker = broker.await;
                panic!("stuck at {:?}; {broker}", *self.counts.borrow());
            }
        }
    }

    /// Waits, at most `within`, for the consumer to end on its own, and returns what it ended
    /// with.
    pub async fn ended(self, within: Duration) -> Result<(), E> {
        match tokio::time::timeout(within, self.task).await {
            Ok(ended) => ended.expect("the consumer's task"),
            Err(_) => panic!(
                "the consumer still runs after {within:?}, at {:?}",
                *self.counts.borrow()
            ),
        }
    }

    /// Stops the consumer, checks that it ended without an error, and returns its counts.
    pub async fn stop(self) -> Counts {
        let _ = self.stop.send(());
        let ended = self.task.await.expect("the consumer's task");
        ended.expect("the consumer ended cleanly");
        *self.counts.borrow()
    }
}

/// What [`slow_effect`] holds: where it reports that it started, and where it is let go.
type GateEnds = (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);
static GATE: Mutex<Option<GateEnds>> = Mutex::new(None);

/// [`effect`], held inside its transaction once after [`hold_next`]: it reports that it started,
/// then waits to be let go (30 s at most).
pub fn slow_effect(tx: &mut Tx<'_>, event: &Event) -> Result<Response, HandlerError> {
    let gate = GATE.lock().expect("gate").take();
    if let Some((started, release)) = gate {
        let _ = started.send(());
        let _ = release.recv_timeout(Duration::from_secs(30));
    }
    effect(tx, event)
}

/// Arms [`slow_effect`] for its next call: returns a way to wait until that call is inside its
/// transaction, and the sender that lets it go.
pub fn hold_next() -> (Started, std::sync::mpsc::Sender<()>) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *GATE.lock().expect("gate") = Some((started_tx, release_rx));
    (Started(started), release)
}

/// See [`hold_next`].
#[derive(Debug)]
pub struct Started(std::sync::mpsc::Receiver<()>);

impl Started {
    /// Waits, off the runtime's threads, until the held handler started.
    pub async fn wait(self) {
        tokio::task::spawn_blocking(move || self.0.recv().expect("the held handler starts"))
            .await
            .expect("waiting task");
    }
}

/// SQLite's write lock on a database file, held by another connection (as another process
/// would hold it) until [`WriteLock::release`].
#[derive(Debug)]
pub struct WriteLock(rusqlite::Connection);

impl WriteLock {
    pub fn take(path: &Path) -> WriteLock {
        let c = rusqlite::Connection::open(path).expect("second connection");
        c.execute_batch("BEGIN EXCLUSIVE").expect("write lock");
        WriteLock(c)
    }

    pub fn release(self) {
        self.0.execute_batch("ROLLBACK").expect("lock released");
    }
}

/// Runs `test`, an ignored test of this very test binary, in a child process with `var` set to
/// `spec`, and checks that the child died by SIGKILL, as its armed crash point does.
pub async fn run_child_to_its_crash(test: &str, var: &str, spec: String) {
    let (test, var) = (test.to_owned(), var.to_owned());
    let status = tokio::task::spawn_blocking(move || {
        Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                &test,
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(var, spec)
            .status()
            .expect("the child runs")
    })
    .await
    .expect("waiting task");
    assert_eq!(
        status.signal(),
        Some(9),
        "the consumer died by SIGKILL at the crash point"
    );
}
