//! Where the schema version is kept: a table of oncebox's own, `oncebox_schema`.
//!
//! Why not `PRAGMA user_version`, where builds before this one kept it: applications share the
//! file (their tables beside oncebox's, docs/library.md) and their migrators keep their own
//! version there (rusqlite_migration and others). An application at 2 had oncebox run its
//! migrations from 2 over an empty file and fail; at 99 oncebox refused the file as newer;
//! and on a fresh file oncebox wrote 7, so the application's migrator skipped its first 7.
//!
//! A file an earlier build versioned in `user_version` is adopted once: its version moves
//! into the table, inside the transaction that migrates it. `user_version` itself is never
//! written, and never read once the table exists: it is the application's, which may have set
//! it since; reset to 0, an application's migrator would run its first migrations again over
//! its own tables.

use rusqlite::{Connection, OptionalExtension};

use super::STATE_IN;

/// What the file says of its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Versioned in `oncebox_schema`.
    Kept(i64),
    /// oncebox's tables, versioned by an earlier build in `user_version`: to be adopted.
    Earlier(i64),
    /// None of oncebox's tables: a new file, or one only an application's tables are in.
    Fresh,
}

impl Found {
    pub fn version(self) -> i64 {
        match self {
            Found::Kept(v) | Found::Earlier(v) => v,
            Found::Fresh => 0,
        }
    }
}

/// Reads the version without writing (a read-only connection will do).
pub(super) fn found(c: &Connection) -> rusqlite::Result<Found> {
    if has_table(c, "oncebox_schema")? {
        return c
            .query_row("SELECT version FROM oncebox_schema WHERE id = 1", [], |r| {
                r.get(0)
            })
            .map(Found::Kept);
    }
    if !has_table(c, "oncebox_inbox")? {
        return Ok(Found::Fresh);
    }
    let recorded: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let made = made_by_earlier_steps(c)?;
    // Believed where it agrees with what the steps left; otherwise an application set it
    // since, and what the steps left is the version. A file at 6 looks like one at 5 (step 6
    // only deletes rows, and runs again harmlessly).
    let agrees = recorded == made || (made == 5 && recorded == 6);
    if !agrees {
        tracing::warn!(
            user_version = recorded,
            schema = made,
            "user_version disagrees with oncebox's tables: an application's; left as it is"
        );
    }
    Ok(Found::Earlier(if agrees { recorded } else { made }))
}

/// Records `version` in the table, making it first if needed.
pub(super) fn keep(c: &Connection, version: i64) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS oncebox_schema (
             id      INTEGER PRIMARY KEY CHECK (id = 1),
             version INTEGER NOT NULL
         );",
    )?;
    c.execute(
        "INSERT INTO oncebox_schema (id, version) VALUES (1, ?1)
         ON CONFLICT (id) DO UPDATE SET version = excluded.version",
        [version],
    )?;
    Ok(())
}

/// Whether `table` has `column`: steps that add columns run again harmlessly.
pub(super) fn has_column(c: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get(0),
    )
}

fn has_table(c: &Connection, name: &str) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1",
        [name],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
}

/// What each of the steps earlier builds versioned in `user_version` (the first seven) left in
/// the schema, in order; `None` for a step that changed rows only. Never extended: later steps
/// are versioned in the table alone.
const EARLIER_STEPS: [Option<&str>; 7] = [
    Some("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'oncebox_inbox'"),
    Some("SELECT count(*) FROM pragma_table_info('oncebox_inbox') WHERE name = 'content_type'"),
    Some("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'oncebox_attempts'"),
    Some("SELECT count(*) = 0 FROM sqlite_schema WHERE name = 'oncebox_inbox' AND instr(sql, ?1)"),
    Some(
        "SELECT count(*) FROM sqlite_schema
         WHERE type = 'table' AND name = 'oncebox_purge_anchors'",
    ),
    None,
    Some("SELECT count(*) FROM pragma_table_info('oncebox_outbox') WHERE name = 'budget_attempts'"),
];

/// How many of the earlier steps the schema shows, counting up to the first it does not.
fn made_by_earlier_steps(c: &Connection) -> rusqlite::Result<i64> {
    let mut made = 0;
    for (step, seen) in (1..).zip(EARLIER_STEPS) {
        let Some(sql) = seen else { continue };
        let mut q = c.prepare(sql)?;
        let present: i64 = if q.parameter_count() == 1 {
            q.query_row([STATE_IN], |r| r.get(0))?
        } else {
            q.query_row([], |r| r.get(0))?
        };
        if present == 0 {
            break;
        }
        made = step;
    }
    Ok(made)
}
