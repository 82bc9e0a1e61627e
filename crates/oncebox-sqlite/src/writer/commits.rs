//! Only the writer's own `COMMIT` commits on the write connection. SQLite ends the whole
//! transaction by itself on some statement errors (a constraint declared `ON CONFLICT
//! ROLLBACK`, `RAISE(ROLLBACK)`, a full disk); user code that goes on past such an error would
//! run its next statements in autocommit, each committed alone at once: part of an effect, or
//! a record without its effect. A commit hook turns every commit the writer did not ask for
//! into a rollback, so such a statement fails instead.
//!
//! A rollback hook tells the writer that the transaction ended under a request, even one that
//! then began another (`BEGIN`, `SAVEPOINT` in autocommit): the request is then answered as the
//! cause, and the batch's other requests are run again in a new transaction (`writer/open.rs`).
//! The same hook drops the log frames the ended transaction gathered (`walvfs.rs`) at once,
//! before the request's code can read or write again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::Connection;

/// The writer's permission to commit, shared with the hooks on its connection.
pub(crate) struct Commits {
    allowed: Arc<AtomicBool>,
    /// The open transaction was rolled back (by SQLite, or by a statement someone ran).
    ended: Arc<AtomicBool>,
    /// Someone else's `COMMIT` was turned into a rollback while the transaction was still open.
    stray: Arc<AtomicBool>,
    /// The connection's settings as the store set them (`PRAGMA` statements that set them
    /// again): code that ends the transaction can change them in the autocommit it leaves,
    /// `synchronous = OFF` among them, which SQLite refuses inside a transaction only.
    settings: String,
}

impl Commits {
    /// Installs the hooks on `conn`: from now on a commit happens only inside
    /// [`Commits::commit`].
    pub fn guard(conn: &Connection) -> Commits {
        let allowed = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let stray = Arc::new(AtomicBool::new(false));
        // What cannot be read is set to what the store always sets.
        let read = |name: &str, otherwise: &str| {
            conn.pragma_query_value(None, name, |r| r.get::<_, rusqlite::types::Value>(0))
                .ok()
                .and_then(|v| match v {
                    rusqlite::types::Value::Integer(n) => Some(n.to_string()),
                    rusqlite::types::Value::Text(t) if t.chars().all(char::is_alphanumeric) => {
                        Some(t)
                    }
                    _ => None,
                })
                .unwrap_or_else(|| otherwise.to_owned())
        };
        let settings = format!(
            "PRAGMA main.journal_mode = {}; PRAGMA main.synchronous = {}; \
             PRAGMA foreign_keys = {};",
            read("journal_mode", "WAL"),
            read("synchronous", "FULL"),
            read("foreign_keys", "ON"),
        );
        let commits = Commits {
            allowed,
            ended,
            stray,
            settings,
        };
        commits.install(conn);
        commits
    }

    /// Sets the hooks. A connection holds one of each, and setting another replaces it: code
    /// that set its own on `tx.conn()` (to learn when its write committed, say) had taken the
    /// guard away for the store's life, and a later stray `COMMIT` then committed a record
    /// without its effect. So they are set again at each `begin`, and before each request of
    /// a batch (`writer/open.rs`): one set by a batch-mate let the next request's `COMMIT`
    /// commit the batch so far, which was then told nothing of it was kept.
    pub fn install(&self, conn: &Connection) {
        let (hook, ended_seen) = (self.allowed.clone(), self.ended.clone());
        let stray_seen = self.stray.clone();
        // Returning true turns the commit into a rollback. A commit after the transaction
        // ended is a statement in autocommit, not someone's COMMIT of the writer's work.
        conn.commit_hook(Some(move || {
            let refused = !hook.load(Ordering::Relaxed);
            if refused && !ended_seen.load(Ordering::Relaxed) {
                stray_seen.store(true, Ordering::Relaxed);
            }
            refused
        }));
        let ending = self.ended.clone();
        let discard = crate::walvfs::rollback_discard(conn);
        // Not called for `ROLLBACK TO`: a savepoint undone leaves the transaction open.
        conn.rollback_hook(Some(move || {
            ending.store(true, Ordering::Relaxed);
            discard();
        }));
    }

    /// Sets the connection's settings back to the store's, outside a transaction: after code
    /// ended the writer's, whatever it changed in the autocommit it left (a handler's
    /// `ROLLBACK; PRAGMA synchronous = OFF`) would have held for every later batch, each
    /// then answered before it was durable (G6).
    pub fn restore(&self, conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch(&self.settings)
    }

    /// Begins the writer's transaction, forgetting how the last one ended.
    pub fn begin(&self, conn: &Connection) -> rusqlite::Result<()> {
        self.install(conn);
        self.ended.store(false, Ordering::Relaxed);
        self.stray.store(false, Ordering::Relaxed);
        conn.execute_batch("BEGIN IMMEDIATE")
    }

    /// Runs the writer's `COMMIT`, the one commit allowed.
    pub fn commit(&self, conn: &Connection) -> rusqlite::Result<()> {
        self.allowed.store(true, Ordering::Relaxed);
        let committed = conn.execute_batch("COMMIT");
        self.allowed.store(false, Ordering::Relaxed);
        committed
    }

    /// Whether the transaction begun last is gone: rolled back, or never there.
    pub fn ended(&self, conn: &Connection) -> bool {
        self.ended.load(Ordering::Relaxed) || conn.is_autocommit()
    }

    /// Whether it ended by someone's `COMMIT` (turned into a rollback).
    pub fn stray_commit(&self) -> bool {
        self.stray.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Commits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commits").finish_non_exhaustive()
    }
}
