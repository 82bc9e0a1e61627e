//! The writer's hot statements, prepared once per writer connection and kept by position.
//!
//! Why not rusqlite's `prepare_cached`: each use hashes the whole SQL text to find the
//! statement, and each return hashes it again, relinks the LRU list and clears every binding.
//! Measured with callgrind on the broker consumer's path, that bookkeeping was a fifth of the
//! writer thread's instructions per message, for statements whose text never changes.

use std::cell::{RefCell, RefMut};
use std::ops::{Deref, DerefMut};
use std::sync::LazyLock;

use rusqlite::{CachedStatement, Connection, Statement};

/// The statements of each request's savepoint: `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`. Its
/// name is drawn per process: a handler's own savepoint of the same name would stop the
/// writer's `ROLLBACK TO` at the handler's, keeping what the handler wrote before it although
/// the handler failed, and its `RELEASE` would fail the batch.
static SAVEPOINT: LazyLock<[String; 3]> = LazyLock::new(|| {
    // std's hasher keys come from the system's randomness: no dependency for one number.
    let drawn = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
    let name = format!("oncebox_request_{drawn:016x}");
    [
        format!("SAVEPOINT {name}"),
        format!("RELEASE {name}"),
        format!("ROLLBACK TO {name}"),
    ]
});

/// A statement the writer runs for (nearly) every request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sql {
    Savepoint,
    Release,
    RollbackTo,
    /// A key's stored record.
    Existing,
    /// A new record already terminal (`process`), or a claimed one finished by upsert.
    RecordTerminal,
    /// The gateway's insert of a new event, already answered.
    IngestNew,
    /// A claimed record (by row id) made terminal.
    Finish,
}

impl Sql {
    /// How many there are: the last variant's position plus one.
    const ALL: usize = Sql::Finish as usize + 1;

    fn text(self) -> &'static str {
        match self {
            Sql::Savepoint => &SAVEPOINT[0],
            Sql::Release => &SAVEPOINT[1],
            Sql::RollbackTo => &SAVEPOINT[2],
            Sql::Existing => {
                "SELECT id, fingerprint, state, response, lease_expires_at, received_at
                 FROM oncebox_inbox WHERE source = ?1 AND event_id = ?2"
            }
            Sql::RecordTerminal => {
                "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, response, payload,
                   received_at, completed_at, content_type, headers)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?8, ?9)
                 ON CONFLICT (source, event_id) DO UPDATE SET state = excluded.state,
                   response = excluded.response, completed_at = excluded.completed_at,
                   lease_token = NULL, lease_expires_at = NULL"
            }
            Sql::IngestNew => {
                "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, response, payload,
                   received_at, completed_at, content_type, headers)
                 VALUES (?1, ?2, ?3, 'completed', ?4, ?5, ?6, ?9, ?7, ?8)
                 ON CONFLICT (source, event_id) DO NOTHING"
            }
            Sql::Finish => {
                "UPDATE oncebox_inbox SET state = ?2, response = ?3, completed_at = ?4,
                   lease_token = NULL, lease_expires_at = NULL
                 WHERE id = ?1"
            }
        }
    }
}

/// The writer connection's statements of [`Sql`], each prepared on first use.
pub(crate) struct Statements<'c> {
    conn: &'c Connection,
    slots: [RefCell<Option<Statement<'c>>>; Sql::ALL],
}

impl<'c> Statements<'c> {
    pub fn new(conn: &'c Connection) -> Statements<'c> {
        Statements {
            conn,
            slots: Default::default(),
        }
    }

    /// The statement, ready to bind and run. Every binding is set again by each use (none is
    /// optional), and rusqlite resets a statement after `execute` or `query_row`, so nothing of
    /// one request's run reaches the next.
    pub fn get(&self, sql: Sql) -> rusqlite::Result<Stmt<'_, 'c>> {
        let Ok(mut slot) = self.slots[sql as usize].try_borrow_mut() else {
            // Already in use further up the stack (no caller nests one statement today): the
            // cached path is correct, only slower.
            return self.conn.prepare_cached(sql.text()).map(Stmt::Cached);
        };
        if slot.is_none() {
            *slot = Some(self.conn.prepare(sql.text())?);
        }
        match RefMut::filter_map(slot, Option::as_mut) {
            Ok(held) => Ok(Stmt::Held(held)),
            // Filled just above.
            Err(_) => self.conn.prepare_cached(sql.text()).map(Stmt::Cached),
        }
    }
}

/// A statement from [`Statements::get`].
pub(crate) enum Stmt<'s, 'c> {
    Held(RefMut<'s, Statement<'c>>),
    Cached(CachedStatement<'c>),
}

impl<'c> Deref for Stmt<'_, 'c> {
    type Target = Statement<'c>;

    fn deref(&self) -> &Statement<'c> {
        match self {
            Stmt::Held(s) => s,
            Stmt::Cached(s) => s,
        }
    }
}

impl DerefMut for Stmt<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Stmt::Held(s) => s,
            Stmt::Cached(s) => s,
        }
    }
}
