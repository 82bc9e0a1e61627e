//! How the inbox's connections and transactions start: the settings every connection gets
//! whatever the server's defaults, and the lock wait every transaction is bounded by.

use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::error::OpenError;
use crate::options::Options;

/// The connection options every connection of the pool gets: the schema, durable commits
/// (G6: `synchronous_commit=on` whatever the server's default), READ COMMITTED whatever the
/// server's default (a claim waits on a concurrent holder's row and then reads its committed
/// result; under REPEATABLE READ or SERIALIZABLE each such wait would end in a serialization
/// failure), a transaction left idle ended after `Options::idle_in_transaction`, every wait
/// for a lock ended after `Options::deadline`, and a name operators can see. Each transaction
/// sets the first two and the lock wait again ([`begin`]): a handler's session-wide `SET` would
/// otherwise carry over to later events on its connection.
///
/// The session's lock wait bounds the statements run outside [`begin`], a relay's claim first:
/// one queued behind a lock (a migration's, a `VACUUM FULL`, a `LOCK TABLE`) outlived its
/// caller, who gave up after `lost_after`, and committed when the lock was released, leasing
/// rows to nobody until their lease ran out, when every other node took them over as possibly
/// sent (parked `uncertain` on a route that does not honour the key), and the rows of a
/// process restarted meanwhile were never given back. Now the server ends such a statement
/// (`55P03`, `Busy`) before its caller gives up.
pub(crate) fn connect_options(options: &Options) -> Result<PgConnectOptions, OpenError> {
    let mut connect = PgConnectOptions::from_str(&options.url)
        .map_err(|e| OpenError::Url(e.to_string()))?
        .application_name("oncebox")
        .options([
            ("synchronous_commit", "on"),
            ("default_transaction_isolation", r"read\ committed"),
            // A marker `open` looks for: a pooler that drops startup options (PgBouncer
            // with `ignore_startup_parameters = options`) drops the schema and every setting
            // above with it, silently.
            (STARTUP_MARKER, "1"),
        ])
        .options([("lock_timeout", lock_wait_ms(options.deadline))]);
    let idle = options.idle_in_transaction;
    if !idle.is_zero() {
        // At least a millisecond: zero would mean none.
        let ms = idle.as_millis().max(1).to_string();
        connect = connect.options([("idle_in_transaction_session_timeout", ms)]);
    }
    if let Some(schema) = &options.schema {
        // Quoted, as the schema was created: unquoted, `Tenant` would be folded to `tenant`,
        // another schema or none.
        connect = connect.options([("search_path", startup_value(&quoted(schema)))]);
    }
    Ok(connect)
}

/// The setting every connection starts with, to tell that its startup options were applied.
pub(crate) const STARTUP_MARKER: &str = "oncebox.startup";

/// `value` as one word of the startup packet's `options` (`-c name=value ...`), which the
/// server splits at spaces unless escaped with a backslash; sqlx writes it as given.
fn startup_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c == '\\' || c.is_whitespace() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `name` as a quoted identifier: any name is safe, and its case is kept.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Begins a transaction whose every wait for a lock ends after `deadline` with `55P03`
/// (`Busy`), in the same round trip as the `BEGIN`. A row held by a transaction that never
/// ends (another node's host frozen with it open: the server keeps the session until TCP gives
/// up, hours later) would otherwise hold the waiter, its pooled connection and, for a batch,
/// its worker and every later batch on it, long after its caller was answered. The
/// transaction is READ COMMITTED and commits durably whatever an earlier handler on the same
/// connection set for its session (`SET synchronous_commit = off` without `LOCAL` carried over
/// to every later event there, silently), and on the connection's own `search_path`, whatever
/// a handler set for its session.
pub(crate) async fn begin(
    pool: &PgPool,
    deadline: Duration,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    pool.begin_with(format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; {}; SET LOCAL synchronous_commit = on; \
         SET LOCAL search_path TO DEFAULT",
        lock_timeout(deadline)
    ))
    .await
}

/// The statement that bounds the open transaction's waits for a lock by `deadline`.
pub(crate) fn lock_timeout(deadline: Duration) -> String {
    format!("SET LOCAL lock_timeout = {}", lock_wait_ms(deadline))
}

/// `deadline` as `lock_timeout` takes it: milliseconds, at least 1 (0 would mean no limit).
fn lock_wait_ms(deadline: Duration) -> String {
    deadline.as_millis().clamp(1, i32::MAX as u128).to_string()
}

/// What the first connection says of its session: that its startup options were applied (a
/// pooler may drop them all), and the schema oncebox's tables are in, whose statements run in a
/// handler's transaction name it. Dropped options are refused where they named the schema
/// (`Options::schema`, or `search_path` in the URL's `options`): two deployments would share
/// the pooler's default one. Elsewhere (a schema the role's own `search_path` names, as behind
/// PgBouncer) they are only warned of: every transaction sets durability and isolation again,
/// but none is ended for sitting idle.
pub(crate) async fn session(
    conn: &mut sqlx::PgConnection,
    options: &Options,
) -> Result<crate::qualified::InTx, OpenError> {
    let (marker, schema, path): (Option<String>, Option<String>, String) = sqlx::query_as(
        "SELECT current_setting($1, true), current_schema(), current_setting('search_path')",
    )
    .bind(STARTUP_MARKER)
    .fetch_one(&mut *conn)
    .await?;
    if marker.as_deref() != Some("1") {
        let url_path = PgConnectOptions::from_str(&options.url)
            .ok()
            .and_then(|o| o.get_options().map(|o| o.contains("search_path")))
            .unwrap_or(false);
        if options.schema.is_some() || url_path {
            return Err(OpenError::StartupOptionsIgnored);
        }
        tracing::warn!(
            "the server did not apply this connection's startup options (a pooler in between \
             drops them): transactions still commit durably at READ COMMITTED, but one left \
             idle is not ended, and single statements outside transactions (complete, \
             release, the relay's records) commit as the role's synchronous_commit says; set \
             idle_in_transaction_session_timeout and synchronous_commit = on for the role"
        );
    }
    let schema = schema.ok_or(OpenError::NoSchema {
        search_path: path.clone(),
    })?;
    Ok(crate::qualified::InTx::new(&schema, path))
}
