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

/// The oldest schema version whose builds run correctly on this build's schema: the version
/// of the newest step that leaves an earlier build's statements invalid, or that writes what
/// such a build would misread. A later build whose own steps keep this build's statements
/// valid leaves it where it is, and this build then runs on that later file without
/// migrating it: a rolling upgrade, and a rollback to this build. Builds before this one never
/// read it (they refuse any later version), so every step up to this one counts as breaking.
/// Raise it to `VERSION` with a step that breaks earlier builds; never lower it.
pub(super) const READABLE_FROM: i64 = 9;

/// Records `version` in the table, making it first if needed, with the oldest version whose
/// builds may run on it ([`READABLE_FROM`]).
pub(super) fn keep(c: &Connection, version: i64) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS oncebox_schema (
             id      INTEGER PRIMARY KEY CHECK (id = 1),
             version INTEGER NOT NULL
         );",
    )?;
    if !has_column(c, "oncebox_schema", "readable_from")? {
        c.execute_batch("ALTER TABLE oncebox_schema ADD COLUMN readable_from INTEGER;")?;
    }
    c.execute(
        "INSERT INTO oncebox_schema (id, version, readable_from) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO UPDATE SET version = excluded.version,
           readable_from = excluded.readable_from",
        [version, READABLE_FROM],
    )?;
    Ok(())
}

/// Whether a build that knows schema version `known` may run on this file, which a later
/// build migrated: that build marked the oldest version its schema stays valid for. A file
/// without the mark (a later build from before it) is not.
pub(super) fn readable_by(c: &Connection, known: i64) -> rusqlite::Result<bool> {
    if !has_column(c, "oncebox_schema", "readable_from")? {
        return Ok(false);
    }
    let from: Option<i64> = c.query_row(
        "SELECT readable_from FROM oncebox_schema WHERE id = 1",
        [],
        |r| r.get(0),
    )?;
    Ok(from.is_some_and(|from| from <= known))
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
