//! The SQLite backend behind the testkit's `Backend`: scripted handlers become real SQL on the
//! writer's transaction.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::store::Ingest;
use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ManualClock, OutboxMessage, ProcessError, Processed,
    Response, Retention, Timestamp,
};
use oncebox_sqlite::rusqlite::{Connection, params};
use oncebox_sqlite::{HandlerError, Inbox, OffsetMove, Once, Options, Resolution, Tx};
use oncebox_testkit::{Backend, CrashAt, Crashed, End, Observed, Script};

/// The tables the suite's scripted handlers write, as a user's application would have them.
pub const APP_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS test_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS test_effects (
    source TEXT NOT NULL, event_id TEXT NOT NULL, amount INTEGER NOT NULL,
    account INTEGER NOT NULL REFERENCES test_accounts (id));
CREATE TABLE IF NOT EXISTS test_emails (id INTEGER PRIMARY KEY, order_key TEXT NOT NULL);
INSERT OR IGNORE INTO test_accounts (id, balance) VALUES (1, 0);
";

/// An event of source `shop` with this id and JSON body.
pub fn shop(id: &str, body: &str) -> Event {
    Event::json(Key::parse("shop", id).unwrap(), body).unwrap()
}

/// The gateway's ingest of `event` without an ordering guard or routes, answered `accepted`.
pub fn ingest(event: Event) -> Ingest {
    Ingest {
        event,
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

#[derive(Clone)]
pub struct Sqlite {
    inbox: Inbox,
    path: PathBuf,
    clock: ManualClock,
    _dir: Arc<tempfile::TempDir>,
}

impl Sqlite {
    fn options(path: &PathBuf, clock: &ManualClock) -> Options {
        Options::new(path).clock(Arc::new(clock.clone()))
    }

    /// Copies the database as a process killed now leaves it on disk, into a new directory.
    /// The log is copied first: nothing commits meanwhile, so whatever the checkpointer copies
    /// into the database file after that is in the copied log too, and recovery replays it
    /// over the copied file. The shared-memory index stays behind; a first connection after a
    /// crash rebuilds it from the log.
    fn copy_files(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let to = dir.path().join("oncebox.db");
        let log = |p: &PathBuf| PathBuf::from(format!("{}-wal", p.display()));
        match std::fs::copy(log(&self.path), log(&to)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("copy the log: {e}"),
        }
        std::fs::copy(&self.path, &to).expect("copy the database");
        (dir, to)
    }

    /// The store a new process opens on `copy`; this one is closed.
    fn restart_on(self, (dir, path): (tempfile::TempDir, PathBuf)) -> Sqlite {
        drop(self.inbox);
        let inbox = Inbox::open(Sqlite::options(&path, &self.clock)).expect("open after a crash");
        Sqlite {
            inbox,
            path,
            clock: self.clock,
            _dir: Arc::new(dir),
        }
    }
}

/// Runs a script on the transaction: the handler a user would write, driven by test data.
pub fn run_script(tx: &mut Tx<'_>, script: &Script) -> Result<Response, HandlerError> {
    if let Some((order, version)) = &script.version {
        tx.advance("order", order, *version)?;
    }
    if let Some((stream, partition, offset)) = &script.offset
        && tx.commit_offset(stream, *partition, *offset)? == OffsetMove::Replay
    {
        return Ok(Response::completed("replay"));
    }
    let key = tx.key().clone();
    let conn = tx.conn();
    conn.execute(
        "INSERT INTO test_effects (source, event_id, amount, account) VALUES (?1, ?2, ?3, ?4)",
        params![
            key.source.as_str(),
            key.event_id.as_str(),
            script.amount,
            script.account
        ],
    )?;
    conn.execute(
        "UPDATE test_accounts SET balance = balance + ?1 WHERE id = ?2",
        params![script.amount, script.account],
    )?;
    if let Some(order) = &script.email
        && tx.once("email", order)? == Once::First
    {
        tx.conn()
            .execute("INSERT INTO test_emails (order_key) VALUES (?1)", [order])?;
        let _ = tx.enqueue(&OutboxMessage::json(
            "email",
            order.as_str(),
            format!(r#"{{"order":"{order}"}}"#),
        ))?;
    }
    let mut answers = Vec::new();
    for (key, body) in &script.notes {
        let queued = tx.enqueue(&OutboxMessage::json("notes", key.as_str(), body.as_str()))?;
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

fn observe(conn: &Connection) -> oncebox_sqlite::rusqlite::Result<Observed> {
    let mut seen = Observed::default();
    let mut q =
        conn.prepare("SELECT source, event_id, count(*) FROM test_effects GROUP BY 1, 2")?;
    for row in q.query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))? {
        let (k, n) = row?;
        seen.effects.insert(k, n);
    }
    seen.balance = conn.query_row("SELECT balance FROM test_accounts WHERE id = 1", [], |r| {
        r.get(0)
    })?;
    let mut q = conn.prepare("SELECT order_key FROM test_emails ORDER BY id")?;
    seen.emails = q.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
    let mut q =
        conn.prepare("SELECT destination, idempotency_key FROM oncebox_outbox ORDER BY id")?;
    seen.outbox = q
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    seen.inbox_rows = conn.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))?;
    seen.conflicts = conn.query_row("SELECT count(*) FROM oncebox_conflicts", [], |r| r.get(0))?;
    Ok(seen)
}

impl Backend for Sqlite {
    async fn another(&self) -> Sqlite {
        Sqlite {
            inbox: Inbox::open(Sqlite::options(&self.path, &self.clock)).expect("open"),
            path: self.path.clone(),
            clock: self.clock.clone(),
            _dir: self._dir.clone(),
        }
    }

    async fn fresh(clock: ManualClock) -> Sqlite {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("oncebox.db");
        let inbox = Inbox::open(Sqlite::options(&path, &clock)).expect("open");
        inbox
            .write(|c| c.execute_batch(APP_SCHEMA))
            .await
            .expect("app schema");
        Sqlite {
            inbox,
            path,
            clock,
            _dir: Arc::new(dir),
        }
    }

    async fn reopen(self) -> Sqlite {
        let Sqlite {
            inbox,
            path,
            clock,
            _dir,
        } = self;
        drop(inbox);
        let inbox = Inbox::open(Sqlite::options(&path, &clock)).expect("reopen");
        Sqlite {
            inbox,
            path,
            clock,
            _dir,
        }
    }

    async fn crash(self, event: Event, script: Script, at: CrashAt) -> (Sqlite, Crashed) {
        let crashed = match at {
            CrashAt::AfterCommit => match self.process(event, script).await {
                Ok(Processed::Applied(_)) => Crashed::Died,
                other => Crashed::Answered(other),
            },
            CrashAt::BeforeCommit => {
                let (reached, at_point) = tokio::sync::oneshot::channel();
                let (die, dying) = std::sync::mpsc::channel::<()>();
                let script = script.end(End::Complete("ok".into()));
                let inbox = self.inbox.clone();
                // The handler holds the writer's transaction open, its effects made, while the
                // files are copied; then it fails, so this process's own database moves on
                // without it, as the copy must.
                let run = tokio::spawn(async move {
                    inbox
                        .process(event, move |tx| {
                            run_script(tx, &script)?;
                            let _ = reached.send(());
                            let _ = dying.recv();
                            Err(HandlerError::failed("killed"))
                        })
                        .await
                });
                // The handler is dropped unrun when the key was answered without it.
                if at_point.await.is_ok() {
                    let copy = self.copy_files();
                    drop(die);
                    let _ = run.await.expect("delivery task");
                    return (self.restart_on(copy), Crashed::Died);
                }
                Crashed::Answered(run.await.expect("delivery task"))
            }
        };
        let copy = self.copy_files();
        (self.restart_on(copy), crashed)
    }

    async fn process(&self, event: Event, script: Script) -> Result<Processed, ProcessError> {
        self.inbox
            .process(event, move |tx| run_script(tx, &script))
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
        self.inbox.read(observe).await.expect("observe")
    }

    async fn stats(&self) -> oncebox_core::store::Stats {
        oncebox_core::store::EventStore::stats(&self.inbox)
            .await
            .expect("stats")
    }

    async fn forget_purge_anchors(&self) {
        self.inbox
            .write(|c| c.execute("DELETE FROM oncebox_purge_anchors", []))
            .await
            .expect("delete anchors");
    }

    async fn hold_writes(&self) -> Box<dyn std::any::Any + Send> {
        // The writer runs the holder until the sender is dropped.
        Box::new(oncebox_testkit::writer::hold_writer(&self.inbox).await)
    }

    async fn held_requests(&self) -> usize {
        self.inbox.queued()
    }
}
