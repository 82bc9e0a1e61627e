//! Only the writer's own `COMMIT` commits on the write connection. SQLite ends the whole
//! transaction by itself on some statement errors (a constraint declared `ON CONFLICT
//! ROLLBACK`, `RAISE(ROLLBACK)`, a full disk); user code that goes on past such an error would
//! run its next statements in autocommit, each committed alone at once: part of an effect, or
//! a record without its effect. A commit hook turns every commit the writer did not ask for
//! into a rollback, so such a statement fails instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::Connection;

/// The writer's permission to commit, shared with the hook on its connection.
pub(crate) struct Commits(Arc<AtomicBool>);

impl Commits {
    /// Installs the hook on `conn`: from now on a commit happens only inside [`Commits::commit`].
    pub fn guard(conn: &Connection) -> Commits {
        let allowed = Arc::new(AtomicBool::new(false));
        let hook = allowed.clone();
        // Returning true turns the commit into a rollback.
        conn.commit_hook(Some(move || !hook.load(Ordering::Relaxed)));
        Commits(allowed)
    }

    /// Runs the writer's `COMMIT`, the one commit allowed.
    pub fn commit(&self, conn: &Connection) -> rusqlite::Result<()> {
        self.0.store(true, Ordering::Relaxed);
        let committed = conn.execute_batch("COMMIT");
        self.0.store(false, Ordering::Relaxed);
        committed
    }
}

impl std::fmt::Debug for Commits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commits").finish_non_exhaustive()
    }
}
