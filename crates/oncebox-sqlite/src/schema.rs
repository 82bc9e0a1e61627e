//! The embedded schema migrations and the pragmas every connection gets.

use rusqlite::{Connection, TransactionBehavior};

use crate::error::OpenError;
use crate::options::{Durability, Options};

/// Migrations in order; `PRAGMA user_version` records how many ran. Never edit a released entry:
/// append a new one.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE oncebox_inbox (
    id               INTEGER PRIMARY KEY,
    source           TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    fingerprint      BLOB NOT NULL,
    state            TEXT NOT NULL
                     CHECK (state IN ('processing', 'completed', 'rejected', 'stale', 'uncertain')),
    response         BLOB,
    payload          BLOB,
    received_at      INTEGER NOT NULL,
    completed_at     INTEGER,
    lease_token      INTEGER,
    lease_expires_at INTEGER,
    -- The key is two columns, never one concatenated string: (a:b, c) and (a, b:c) differ.
    UNIQUE (source, event_id)
);
CREATE TABLE oncebox_conflicts (
    id                  INTEGER PRIMARY KEY,
    source              TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    stored_fingerprint  BLOB NOT NULL,
    offered_fingerprint BLOB NOT NULL,
    payload             BLOB,
    at                  INTEGER NOT NULL
);
CREATE INDEX oncebox_conflicts_key ON oncebox_conflicts (source, event_id);
CREATE TABLE oncebox_actions (
    scope    TEXT NOT NULL,
    key      TEXT NOT NULL,
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    at       INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE TABLE oncebox_versions (
    entity    TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    version   INTEGER NOT NULL,
    source    TEXT NOT NULL,
    event_id  TEXT NOT NULL,
    PRIMARY KEY (entity, entity_id)
) WITHOUT ROWID;
CREATE TABLE oncebox_offsets (
    stream    TEXT NOT NULL,
    partition INTEGER NOT NULL,
    position  INTEGER NOT NULL,
    PRIMARY KEY (stream, partition)
) WITHOUT ROWID;
CREATE TABLE oncebox_outbox (
    id              INTEGER PRIMARY KEY,
    destination     TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    payload         BLOB NOT NULL,
    content_type    TEXT NOT NULL,
    source          TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    UNIQUE (destination, idempotency_key)
);
CREATE TABLE oncebox_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
-- The fencing-token counter only grows; tokens are never reused, even after a key is released.
INSERT INTO oncebox_meta (name, value) VALUES ('fence', 0);
"#,
    r#"
-- How an event arrived: its content type and request headers ("name: value" lines).
ALTER TABLE oncebox_inbox ADD COLUMN content_type TEXT;
ALTER TABLE oncebox_inbox ADD COLUMN headers TEXT;
"#,
    r#"
-- The relay's bookkeeping on each delivery (DESIGN §6): the fenced lease of the relay sending
-- it, the last attempt's result, an operator's note.
ALTER TABLE oncebox_outbox ADD COLUMN lease_token INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN last_status INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN last_error TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN note TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN delivered_at INTEGER;
ALTER TABLE oncebox_outbox ADD COLUMN updated_at INTEGER;
-- A claim reads each claimable state (pending, retrying, in_flight) as one range in
-- next_attempt_at order and stops at its limit, so it costs the same with a million delivered
-- rows as with none; the few in_flight rows are filtered on lease_expires_at. The counts per
-- state read this index only.
CREATE INDEX oncebox_outbox_due ON oncebox_outbox (state, next_attempt_at);
-- An event's deliveries (event page, operator replay).
CREATE INDEX oncebox_outbox_key ON oncebox_outbox (source, event_id);
CREATE TABLE oncebox_attempts (
    id          INTEGER PRIMARY KEY,
    delivery_id INTEGER NOT NULL REFERENCES oncebox_outbox (id) ON DELETE CASCADE,
    started_at  INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    status      INTEGER,
    error       TEXT
);
CREATE INDEX oncebox_attempts_delivery ON oncebox_attempts (delivery_id);
"#,
];

pub(crate) const VERSION: i64 = MIGRATIONS.len() as i64;

fn sqlite_err(o: &Options) -> impl Fn(rusqlite::Error) -> OpenError + '_ {
    move |source| OpenError::Sqlite {
        path: o.path.display().to_string(),
        source,
    }
}

/// SQLite's `synchronous` level for a durability.
fn synchronous(d: Durability) -> &'static str {
    match d {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
}

/// Opens the writer connection: WAL, the chosen durability, foreign keys on (SQLite checks them
/// per connection, so every connection sets it), and the busy timeout.
pub(crate) fn open_writer(o: &Options) -> Result<Connection, OpenError> {
    let err = sqlite_err(o);
    let conn = Connection::open(&o.path).map_err(&err)?;
    conn.busy_timeout(o.busy_timeout).map_err(&err)?;
    let sync = synchronous(o.durability);
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;
         PRAGMA cache_size = -65536; PRAGMA wal_autocheckpoint = {};",
        crate::checkpoint::WRITER_FALLBACK_PAGES
    ))
    .map_err(&err)?;
    conn.set_prepared_statement_cache_capacity(256);
    Ok(conn)
}

/// Opens a connection for reads only.
pub(crate) fn open_reader(o: &Options) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(&o.path)?;
    conn.busy_timeout(o.busy_timeout)?;
    conn.execute_batch("PRAGMA query_only = ON; PRAGMA foreign_keys = ON;")?;
    Ok(conn)
}

/// Opens the checkpointer's connection; it syncs the database file as durably as the writer.
pub(crate) fn open_checkpointer(o: &Options) -> Result<Connection, OpenError> {
    let err = sqlite_err(o);
    let conn = Connection::open(&o.path).map_err(&err)?;
    conn.busy_timeout(o.busy_timeout).map_err(&err)?;
    let sync = synchronous(o.durability);
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync}; PRAGMA wal_autocheckpoint = 0;"
    ))
    .map_err(&err)?;
    Ok(conn)
}

/// Brings the schema up to date. Runs under `BEGIN IMMEDIATE` and re-reads the version inside
/// it, so several processes opening one file at once apply each migration exactly once.
pub(crate) fn migrate(conn: &mut Connection, o: &Options) -> Result<(), OpenError> {
    let err = sqlite_err(o);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&err)?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(&err)?;
    if found > VERSION {
        return Err(OpenError::SchemaTooNew {
            found,
            known: VERSION,
        });
    }
    let start = usize::try_from(found).unwrap_or(0);
    for sql in &MIGRATIONS[start..] {
        tx.execute_batch(sql).map_err(&err)?;
    }
    tx.pragma_update(None, "user_version", VERSION)
        .map_err(&err)?;
    tx.commit().map_err(&err)
}
