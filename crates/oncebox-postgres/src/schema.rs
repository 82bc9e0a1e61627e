//! The embedded schema migrations, applied once however many nodes start at the same moment.

use sqlx::{Connection, PgConnection};

use crate::error::OpenError;

/// Migrations in order; `oncebox_schema` records how many ran. Never edit a released entry:
/// append a new one. Times are Unix milliseconds from the store's clock (as on SQLite), so a
/// test's manual clock drives expiry and retention exactly as the system clock does.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE oncebox_inbox (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source           TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    fingerprint      BYTEA NOT NULL,
    state            TEXT NOT NULL
                     CHECK (state IN ('processing', 'completed', 'rejected', 'stale', 'uncertain')),
    response         BYTEA,
    payload          BYTEA,
    received_at      BIGINT NOT NULL,
    completed_at     BIGINT,
    lease_token      BIGINT,
    lease_expires_at BIGINT,
    content_type     TEXT,
    headers          TEXT,
    -- The key is two columns, never one concatenated string: (a:b, c) and (a, b:c) differ.
    UNIQUE (source, event_id)
);
CREATE TABLE oncebox_conflicts (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source              TEXT NOT NULL,
    event_id            TEXT NOT NULL,
    stored_fingerprint  BYTEA NOT NULL,
    offered_fingerprint BYTEA NOT NULL,
    payload             BYTEA,
    at                  BIGINT NOT NULL
);
CREATE INDEX oncebox_conflicts_key ON oncebox_conflicts (source, event_id);
CREATE TABLE oncebox_actions (
    scope    TEXT NOT NULL,
    key      TEXT NOT NULL,
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    at       BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE TABLE oncebox_versions (
    entity    TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    version   BIGINT NOT NULL,
    source    TEXT NOT NULL,
    event_id  TEXT NOT NULL,
    PRIMARY KEY (entity, entity_id)
);
CREATE TABLE oncebox_offsets (
    stream    TEXT NOT NULL,
    partition BIGINT NOT NULL,
    position  BIGINT NOT NULL,
    PRIMARY KEY (stream, partition)
);
CREATE TABLE oncebox_outbox (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination      TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    payload          BYTEA NOT NULL,
    content_type     TEXT NOT NULL,
    source           TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'pending',
    attempts         INTEGER NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    next_attempt_at  BIGINT NOT NULL,
    lease_token      BIGINT,
    lease_expires_at BIGINT,
    last_status      INTEGER,
    last_error       TEXT,
    note             TEXT,
    delivered_at     BIGINT,
    updated_at       BIGINT,
    UNIQUE (destination, idempotency_key)
);
-- A claim reads each claimable state as one range in next_attempt_at order and stops at its
-- limit, so it costs the same with a million delivered rows as with none.
CREATE INDEX oncebox_outbox_due ON oncebox_outbox (state, next_attempt_at);
CREATE INDEX oncebox_outbox_key ON oncebox_outbox (source, event_id);
CREATE TABLE oncebox_attempts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id BIGINT NOT NULL REFERENCES oncebox_outbox (id) ON DELETE CASCADE,
    started_at  BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    status      INTEGER,
    error       TEXT
);
CREATE INDEX oncebox_attempts_delivery ON oncebox_attempts (delivery_id);
-- Fencing tokens for inbox leases and relay claims: a sequence never hands out a value twice,
-- not after a rollback, a released key or a restart, and needs no row lock between nodes.
CREATE SEQUENCE oncebox_fence;
"#,
    r#"
-- Retention's record of the first purge on each boot of each node's machine
-- (oncebox_core::BootAnchor): a later purge on that boot, in any process, uses no later time
-- than that purge's wall time plus the boot time passed since, so a clock jump ahead and a
-- restart purge nothing early.
CREATE TABLE oncebox_purge_anchors (
    boot  BIGINT PRIMARY KEY,
    wall  BIGINT NOT NULL,
    since BIGINT NOT NULL
);
"#,
    r#"
-- Keys compare byte by byte (collation "C"), as on SQLite, whatever the database's collation.
-- A unique index on a collation of the operating system's C library is sorted by that
-- library's rules; an upgrade that changes them (glibc 2.28 did, for most locales) leaves the
-- index out of order, and a lookup then misses a key that is there: a second record, a second
-- effect. "C" is built into PostgreSQL and never changes. Indexes are rebuilt, rows are not.
ALTER TABLE oncebox_inbox ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN event_id TYPE TEXT COLLATE "C";
ALTER TABLE oncebox_conflicts ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN event_id TYPE TEXT COLLATE "C";
ALTER TABLE oncebox_actions ALTER COLUMN scope TYPE TEXT COLLATE "C",
    ALTER COLUMN key TYPE TEXT COLLATE "C";
ALTER TABLE oncebox_versions ALTER COLUMN entity TYPE TEXT COLLATE "C",
    ALTER COLUMN entity_id TYPE TEXT COLLATE "C";
ALTER TABLE oncebox_offsets ALTER COLUMN stream TYPE TEXT COLLATE "C";
ALTER TABLE oncebox_outbox ALTER COLUMN destination TYPE TEXT COLLATE "C",
    ALTER COLUMN idempotency_key TYPE TEXT COLLATE "C",
    ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN event_id TYPE TEXT COLLATE "C";
"#,
    // Finished gateway deliveries whose record an earlier version purged without them. Left,
    // each would make the outbox's unique key drop the deliveries of its key accepted again (a
    // purge now takes a record's finished deliveries with it); their attempts cascade.
    r#"
DELETE FROM oncebox_outbox
WHERE state IN ('delivered', 'dead') AND idempotency_key = source || ':' || event_id
  AND NOT EXISTS (SELECT 1 FROM oncebox_inbox i
                  WHERE i.source = oncebox_outbox.source AND i.event_id = oncebox_outbox.event_id);
"#,
    r#"
-- Where a delivery's caps on attempts and age count from (oncebox_core::relay_store::Budget):
-- an operator's retry or redeliver gives it a fresh budget. NULL budget_at: its creation.
ALTER TABLE oncebox_outbox ADD COLUMN IF NOT EXISTS budget_attempts INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS budget_at BIGINT;
"#,
    r#"
-- Which claim leased a delivery, and whether it took the delivery over from an expired lease:
-- a claimer whose reply was lost after the server committed finds its rows by the claim's own
-- random id, instead of leaving them in flight under tokens nobody holds.
ALTER TABLE oncebox_outbox ADD COLUMN IF NOT EXISTS claim_id BIGINT,
    ADD COLUMN IF NOT EXISTS claim_taken_over BOOLEAN;
"#,
    r#"
-- The loop guard (oncebox_core::hops): what a delivery's requests carry in `oncebox-hops`, one
-- more than its event arrived with. Deliveries queued before it count as the first hop.
ALTER TABLE oncebox_outbox ADD COLUMN IF NOT EXISTS hops INTEGER NOT NULL DEFAULT 1;
"#,
    // Numeric ordering entities an earlier build kept in a number's canonical text (`1e3`),
    // rewritten in plain decimal (`1000`), as the guard keeps them now (SQLite's step
    // `plain_numeric_entities` says why, and reads the same texts).
    r#"
WITH old AS (
  SELECT entity, entity_id, version, source, event_id,
         regexp_match(entity_id, '^(-?[1-9]([0-9]*[1-9])?)e([1-9][0-9]{0,2})$') AS m
  FROM oncebox_versions WHERE entity = source),
plain AS (
  SELECT entity, entity_id, version, source, event_id, m[1] || repeat('0', m[3]::int) AS id
  FROM old WHERE m IS NOT NULL AND length(m[1]) + m[3]::int <= 255),
gone AS (
  DELETE FROM oncebox_versions v USING plain
  WHERE v.entity = plain.entity AND v.entity_id = plain.entity_id)
INSERT INTO oncebox_versions AS v (entity, entity_id, version, source, event_id)
SELECT entity, id, version, source, event_id FROM plain
ON CONFLICT (entity, entity_id) DO UPDATE SET version = excluded.version,
  source = excluded.source, event_id = excluded.event_id
WHERE v.version < excluded.version;
"#,
];

pub(crate) const VERSION: i64 = MIGRATIONS.len() as i64;

/// The oldest schema version whose builds run correctly on this build's schema: the version
/// of the newest step that leaves an earlier build's statements invalid, or that writes what
/// such a build would misread. A later build whose own steps keep this build's statements
/// valid leaves it where it is, and this build then runs on that later schema without
/// migrating it: a rolling upgrade, and a rollback to this build. Builds before this one never
/// read it (they refuse any later version), so every step up to this one counts as breaking.
/// Raise it to `VERSION` with a step that breaks earlier builds; never lower it.
const READABLE_FROM: i64 = 8;
const _: () = assert!(READABLE_FROM <= VERSION);

/// Whether this build may run on a schema a later build migrated: that build marked the
/// oldest version its schema stays valid for. A schema without the mark is not.
async fn readable_by_this_build(tx: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let marked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('oncebox_schema')
           AND attname = 'readable_from' AND NOT attisdropped)",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !marked {
        return Ok(false);
    }
    let from: Option<i64> = sqlx::query_scalar("SELECT max(readable_from) FROM oncebox_schema")
        .fetch_one(&mut *tx)
        .await?;
    Ok(from.is_some_and(|from| from <= VERSION))
}

/// Takes the transaction-scoped advisory lock migrations run under, scoped to the schema the
/// connection writes to (two schemas in one database, tests or tenants, migrate
/// independently). Held by another session, it says which and waits at most `wait`
/// (`Options::migration_lock_wait`).
async fn migration_lock(
    tx: &mut sqlx::PgConnection,
    wait: std::time::Duration,
) -> Result<(), OpenError> {
    const KEY: &str = "hashtext('oncebox-migrate:' || current_schema())";
    let taken: bool = sqlx::query_scalar(&format!("SELECT pg_try_advisory_xact_lock({KEY})"))
        .fetch_one(&mut *tx)
        .await?;
    if taken {
        return Ok(());
    }
    let holder = migration_lock_holder(tx).await;
    tracing::warn!(
        holder = holder.as_deref().unwrap_or("unknown"),
        ?wait,
        "waiting for the migration lock another session holds (another node migrating, or a \
         session stuck mid-migration)"
    );
    let bound = crate::inbox::lock_timeout(wait);
    sqlx::Executor::execute(&mut *tx, bound.as_str()).await?;
    match sqlx::query(&format!("SELECT pg_advisory_xact_lock({KEY})"))
        .execute(&mut *tx)
        .await
    {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
            Err(OpenError::MigrationLocked {
                holder,
                waited: wait,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Who holds the migration lock, as an operator finds the session: its pid, application and
/// state (`pg_stat_activity`). `None` when it cannot be read (no right to see it, say).
async fn migration_lock_holder(tx: &mut sqlx::PgConnection) -> Option<String> {
    let row: Option<(i32, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT a.pid, a.application_name, a.state FROM pg_locks l
           JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
           AND l.objid = (hashtext('oncebox-migrate:' || current_schema())::bigint & 4294967295)::oid
         LIMIT 1",
    )
    .fetch_optional(&mut *tx)
    .await
    .ok()?;
    let (pid, app, state) = row?;
    Some(format!(
        "pid {pid} ({}, {})",
        app.filter(|a| !a.is_empty())
            .unwrap_or_else(|| "no application name".into()),
        state.unwrap_or_else(|| "state unknown".into())
    ))
}

/// Brings the schema up to date. The transaction first takes a transaction-scoped advisory lock,
/// then reads the version: nodes starting at once queue on the lock and each later one finds the
/// work done, so every migration runs exactly once. Past the advisory lock, a wait for a table's
/// lock ends after `deadline`: a migration waiting for an old node's long transaction would
/// otherwise queue every other node's statement on those tables behind its own request, and
/// stall them all; it fails instead, and the node's start can be tried again.
pub(crate) async fn migrate(
    conn: &mut PgConnection,
    allowed: bool,
    deadline: std::time::Duration,
    lock_wait: std::time::Duration,
) -> Result<(), OpenError> {
    // READ COMMITTED said here, not left to the session: behind a pooler that drops startup
    // options the role's or database's default applies, and under REPEATABLE READ a node that
    // waited on the lock would read the version from its snapshot taken before the other
    // node's migration, and run it again (42P07).
    let mut tx = conn
        .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await?;
    migration_lock(&mut tx, lock_wait).await?;
    sqlx::Executor::execute(&mut *tx, crate::inbox::lock_timeout(deadline).as_str()).await?;
    // Where unqualified names find oncebox's tables must be where its qualified statements and
    // new tables go (`OpenError::SchemaElsewhere`).
    let (tables, current): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT (SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n
                   ON n.oid = c.relnamespace WHERE c.oid = to_regclass('oncebox_schema')),
                current_schema()::text",
    )
    .fetch_one(&mut *tx)
    .await?;
    if let (Some(tables), Some(current)) = (&tables, current)
        && *tables != current
    {
        let tables = tables.clone();
        return Err(OpenError::SchemaElsewhere { tables, current });
    }
    // Created only when absent (under the lock, so no race): `IF NOT EXISTS` would log a
    // server notice at every start.
    let exists = tables.is_some();
    if !exists && !allowed {
        return Err(OpenError::SchemaOutdated {
            found: 0,
            known: VERSION,
        });
    }
    if !exists {
        sqlx::query("CREATE TABLE oncebox_schema (version BIGINT NOT NULL)")
            .execute(&mut *tx)
            .await?;
    }
    let found: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM oncebox_schema")
        .fetch_one(&mut *tx)
        .await?;
    let found = found.unwrap_or(0);
    if found > VERSION {
        // Run on unchanged where its build said it stays valid for this one.
        if readable_by_this_build(&mut tx).await? {
            tracing::info!(
                found,
                known = VERSION,
                "schema of a later build, readable by this one"
            );
            return Ok(());
        }
        return Err(OpenError::SchemaTooNew {
            found,
            known: VERSION,
        });
    }
    if found < VERSION && !allowed {
        // Dropping the transaction rolls it back: nothing was written.
        return Err(OpenError::SchemaOutdated {
            found,
            known: VERSION,
        });
    }
    let start = usize::try_from(found).unwrap_or(0);
    for sql in &MIGRATIONS[start..] {
        // A plain string runs through the simple-query protocol: several statements at once.
        sqlx::Executor::execute(&mut *tx, *sql).await?;
    }
    if found < VERSION {
        sqlx::query("DELETE FROM oncebox_schema")
            .execute(&mut *tx)
            .await?;
        sqlx::Executor::execute(
            &mut *tx,
            "ALTER TABLE oncebox_schema ADD COLUMN IF NOT EXISTS readable_from BIGINT",
        )
        .await?;
        sqlx::query("INSERT INTO oncebox_schema (version, readable_from) VALUES ($1, $2)")
            .bind(VERSION)
            .bind(READABLE_FROM)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
