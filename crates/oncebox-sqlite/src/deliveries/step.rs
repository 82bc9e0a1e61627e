//! A claim after the wall clock stepped (`Inbox::clock_step`): schedules and leases written
//! before the step keep the real time they had left. Every process on a SQLite file runs on
//! one machine, with one clock, so the step one process sees is everyone's. (PostgreSQL's
//! claimers are nodes with clocks of their own: it does not re-anchor, `oncebox-postgres`
//! says why.)

use std::time::Duration;

use oncebox_core::Timestamp;
use rusqlite::Connection;

/// The clock went back, or this is the process's first claim (which cannot tell).
pub(super) fn back(conn: &Connection, now: Timestamp) -> rusqlite::Result<()> {
    // A schedule written later than now was written before the wall clock went back: left as
    // it is, a delivery accepted before the step (due at once), waiting out a backoff, or an
    // uncertain one's next status check would wait the whole step on top, and ones queued since
    // would go first. It keeps the wait it had left when it was written, counted from now. Only
    // when the store's clock shows a step (and at a process's first claim): the backoffs of an
    // outage are many rows to look through at every claim.
    conn.prepare_cached(
        "UPDATE oncebox_outbox
           SET next_attempt_at = ?1 + max(next_attempt_at - coalesce(updated_at, created_at), 0),
               updated_at = ?1
         WHERE state IN ('pending', 'retrying', 'uncertain') AND next_attempt_at > ?1
           AND coalesce(updated_at, created_at) > ?1",
    )?
    .execute([now.millis()])?;
    // A lease taken more than its own length later than now was taken before the wall clock
    // went back. Left as it is, a dead relay's delivery would wait out the jump on top of its
    // lease; taken over at once, a live relay's request could go out twice. Like an inbox lease
    // (`lease_seen`) it keeps its holder and token and now ends one lease length from here. A
    // difference under a lease is left alone all the same, as inbox leases do: a claimer's
    // `now` stale by more than a lease (read before it waited for the writer) otherwise cut a
    // live holder's lease, and the next claim took its delivery over.
    conn.prepare_cached(
        "UPDATE oncebox_outbox SET lease_expires_at = ?1 + (lease_expires_at - updated_at),
           updated_at = ?1
         WHERE state = 'in_flight' AND updated_at - ?1 > lease_expires_at - updated_at",
    )?
    .execute([now.millis()])?;
    Ok(())
}

/// The clock went ahead by `by`. A lease taken before the step (at `by` or more before now)
/// would look that much nearer its end, or past it: the next claim, the holder's own a moment
/// later, took a delivery still being sent over as possibly sent (sent again beside it where
/// the route honours the key, parked uncertain where not, the holder's answer fenced). It is
/// moved with the clock, holder and token kept. One whose claim came after the step and is
/// moved too (the step seen late) only ends later: its holder is never cut short. Its
/// `updated_at` moves with it, so a second process seeing the same step moves it no further.
/// Schedules are left: a backoff that ends sooner sends a retry early, nothing twice.
///
/// A delivery still owed keeps its retry budget's age the same way: counted from a start the
/// step put that much further back, one retrying was past its route's `max_age` at its next
/// turn and died unsent.
pub(super) fn ahead(conn: &Connection, now: Timestamp, by: Duration) -> rusqlite::Result<()> {
    let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "UPDATE oncebox_outbox SET lease_expires_at = lease_expires_at + ?2,
           updated_at = updated_at + ?2
         WHERE state = 'in_flight' AND updated_at <= ?1 - ?2",
    )?
    .execute([now.millis(), by])?;
    conn.prepare_cached(
        "UPDATE oncebox_outbox SET budget_at = coalesce(budget_at, created_at) + ?2
         WHERE state IN ('pending', 'retrying', 'in_flight', 'uncertain')
           AND coalesce(budget_at, created_at) <= ?1 - ?2",
    )?
    .execute([now.millis(), by])?;
    Ok(())
}
