//! Migration steps that are more than one batch of fixed SQL, or shared with PostgreSQL's: each
//! can run again over a schema it already changed and change nothing twice.

use oncebox_core::json::{self, Value};
use rusqlite::Transaction;

use super::version::has_column;

/// The inbox's `state IN (five values)` CHECK made SQLite build a temporary index of the five
/// values on every insert and state update (it does so for IN lists longer than two), which
/// cost more than the insert itself. The same check as a chain of equalities needs none.
/// Rebuilding the table would copy every payload; the check changes no stored byte, so the
/// table's definition is edited in place by the procedure SQLite documents for such changes
/// (`writable_schema`, then a new `schema_version` so every connection re-reads it).
pub(super) const STATE_IN: &str =
    "state IN ('processing', 'completed', 'rejected', 'stale', 'uncertain')";
const STATE_EQ: &str = "state = 'processing' OR state = 'completed' OR state = 'rejected'
                           OR state = 'stale' OR state = 'uncertain'";

pub(super) fn plain_state_check(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    edit_in_place(tx, &[("oncebox_inbox", STATE_IN, STATE_EQ)])
}

/// Replaces `from` with `to` in each named table's stored definition, where it is found, by
/// the procedure SQLite documents for changes that leave every stored byte valid.
pub(super) fn edit_in_place(
    tx: &Transaction<'_>,
    edits: &[(&str, &str, &str)],
) -> rusqlite::Result<()> {
    let version: i64 = tx.query_row("PRAGMA schema_version", [], |r| r.get(0))?;
    tx.pragma_update(None, "writable_schema", true)?;
    let edited = edits.iter().try_for_each(|(table, from, to)| {
        tx.execute(
            "UPDATE sqlite_schema SET sql = replace(sql, ?2, ?3)
             WHERE type = 'table' AND name = ?1 AND instr(sql, ?2) > 0",
            [table, from, to],
        )
        .map(drop)
    });
    let bumped = tx.pragma_update(None, "schema_version", version + 1);
    // Off again whatever happened (the flag must not outlive this step), and RESET makes this
    // connection re-read the definition it has cached; others see the new schema_version.
    tx.execute_batch("PRAGMA writable_schema = RESET")?;
    edited?;
    bumped
}

/// Where a delivery's caps on attempts and age count from (`oncebox_core::relay_store::Budget`):
/// an operator's retry or redeliver gives it a fresh budget; a NULL `budget_at` is its creation.
/// Added only where missing, as PostgreSQL's `ADD COLUMN IF NOT EXISTS` does, so that running
/// the steps from an earlier version again changes nothing twice.
pub(super) fn budget_columns(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    if !has_column(tx, "oncebox_outbox", "budget_attempts")? {
        tx.execute_batch(
            "ALTER TABLE oncebox_outbox ADD COLUMN budget_attempts INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE oncebox_outbox ADD COLUMN budget_at INTEGER;",
        )?;
    }
    Ok(())
}

/// The loop guard (`oncebox_core::hops`): what a delivery's requests carry in `oncebox-hops`,
/// one more than its event arrived with. Deliveries queued before it count as the first hop.
pub(super) fn hops_column(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    if !has_column(tx, "oncebox_outbox", "hops")? {
        tx.execute_batch("ALTER TABLE oncebox_outbox ADD COLUMN hops INTEGER NOT NULL DEFAULT 1;")?;
    }
    Ok(())
}

/// Finished gateway deliveries whose record an earlier version purged without them. Left, each
/// would make the outbox's unique key drop the deliveries of its key accepted again (a purge
/// now takes a record's finished deliveries with it); their attempts cascade. The same text
/// is PostgreSQL's.
pub(super) const CLEAR_ORPHANED_DELIVERIES: &str = "
DELETE FROM oncebox_outbox
WHERE state IN ('delivered', 'dead') AND idempotency_key = source || ':' || event_id
  AND NOT EXISTS (SELECT 1 FROM oncebox_inbox i
                  WHERE i.source = oncebox_outbox.source AND i.event_id = oncebox_outbox.event_id);
";

/// Numeric entity ids the ordering guard kept in a number's canonical text (`1e3` for 1000,
/// `12e2` for 1200) before it kept them in plain decimal, as event ids are: rewritten, so that
/// an entity's history is found under its new key. Where both keys hold a version (the
/// string `"1000"` was an entity of its own then), the higher stays. Only the canonical text
/// is read as a number (no mantissa ending in 0, an exponent of 1 to 3 digits not starting
/// with 0), so no two old keys become one; a string id of that form is taken for a number
/// too. Only the gateway's rows, whose entity is the event's source (a library handler's
/// `Tx::advance` names entities of its own, and its ids are left as they are). Earlier builds
/// would miss the rewritten keys and write old ones again, so the step raises `READABLE_FROM`.
/// The same rule is PostgreSQL's.
pub(super) fn plain_numeric_entities(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let old: Vec<(String, String, i64, String, String)> = tx
        .prepare(
            "SELECT entity, entity_id, version, source, event_id FROM oncebox_versions
                  WHERE entity = source AND entity_id GLOB '*[0-9]e[1-9]*'",
        )?
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (entity, id, version, source, event_id) in old {
        let Some(plain) = plain_integer(&id) else {
            continue;
        };
        tx.execute(
            "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (entity, entity_id) DO UPDATE SET version = excluded.version,
               source = excluded.source, event_id = excluded.event_id
             WHERE oncebox_versions.version < excluded.version",
            rusqlite::params![entity, plain, version, source, event_id],
        )?;
        tx.execute(
            "DELETE FROM oncebox_versions WHERE entity = ?1 AND entity_id = ?2",
            [&entity, &id],
        )?;
    }
    Ok(())
}

/// `12e2` as `1200`: the text an earlier guard kept for a number (the number's canonical
/// text, as the JSON module writes it) where it is not already plain decimal, in plain decimal
/// of at most 255 characters, as the guard keys it now (`Number::integer_text`); `None` for
/// anything else.
fn plain_integer(text: &str) -> Option<String> {
    let Ok(Value::Number(n)) = json::parse(text.as_bytes()) else {
        return None;
    };
    if n.to_string() != text {
        return None;
    }
    let plain = n.integer_text(255)?;
    (plain != text).then_some(plain)
}

#[cfg(test)]
mod tests {
    use super::plain_integer;

    #[test]
    fn only_a_numbers_canonical_text_is_read_as_one() {
        assert_eq!(plain_integer("1e3").as_deref(), Some("1000"));
        assert_eq!(plain_integer("-12e2").as_deref(), Some("-1200"));
        for not in [
            "1000", "10e2", "01e2", "1e03", "1e0", "1.5e2", "15e-1", "e3", "1e", "abc",
        ] {
            assert_eq!(plain_integer(not), None, "{not}");
        }
        assert_eq!(plain_integer("1e254").map(|p| p.len()), Some(255));
        assert_eq!(plain_integer("1e255"), None);
    }
}
