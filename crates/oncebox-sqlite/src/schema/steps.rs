//! Migration steps that are more than one batch of fixed SQL, or shared with PostgreSQL's: each
//! can run again over a schema it already changed and change nothing twice.

use rusqlite::Transaction;

use super::version::has_column;

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
