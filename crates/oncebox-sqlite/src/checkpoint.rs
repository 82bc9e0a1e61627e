//! WAL checkpoints on a thread of their own: copying the log back into the database file (and
//! its fsync) stays off the writer's commit path, as long as the checkpointer keeps up.

use std::cell::Cell;

use rusqlite::Connection;

/// Commits between two checkpoints: often enough to keep the WAL small, rarely enough that the
/// extra fsync of the database file stays a small cost.
const EVERY: u32 = 64;

/// Pages in the WAL at which the writer checkpoints by itself after all (SQLite's
/// `wal_autocheckpoint`): a bound on the log should this thread fall behind.
pub(crate) const WRITER_FALLBACK_PAGES: i64 = 16_384;

/// The writer's side: it counts its commits and wakes the checkpointer once every `EVERY`. A
/// signal per commit woke that thread for nothing 63 times out of 64.
pub(crate) struct Due {
    tx: flume::Sender<()>,
    since: Cell<u32>,
}

/// The writer's `Due` and the receiver `run` takes.
pub(crate) fn due() -> (Due, flume::Receiver<()>) {
    let (tx, rx) = flume::bounded(1);
    let due = Due {
        tx,
        since: Cell::new(0),
    };
    (due, rx)
}

impl Due {
    /// Counts one commit.
    pub fn committed(&self) {
        let since = self.since.get() + 1;
        if since < EVERY {
            self.since.set(since);
            return;
        }
        self.since.set(0);
        // Full: a checkpoint is already due and will cover this one too.
        let _ = self.tx.try_send(());
    }
}

/// Checkpoints on each signal until the writer drops its sender; one last checkpoint keeps the
/// WAL short at close.
pub(crate) fn run(conn: &Connection, due: &flume::Receiver<()>) {
    while due.recv().is_ok() {
        // Signals that queued while the last checkpoint ran are served by this one.
        due.try_iter().for_each(drop);
        checkpoint(conn);
    }
    checkpoint(conn);
}

fn checkpoint(conn: &Connection) {
    // PASSIVE never waits for the writer or readers; whatever it cannot copy now it copies next
    // time. A failure is only logged: the WAL stays valid and the writer's fallback bounds it.
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "WAL checkpoint failed");
    }
}
