//! Opening beside another process that is switching a new file to WAL: SQLite answers busy at
//! once there, and the open waits that out.

use std::time::{Duration, Instant};

use crate::options::Options;

/// Runs `f` again while SQLite answers it `SQLITE_BUSY`, up to the busy timeout. A connection
/// that meets another process switching a new file to WAL, or recovering its log, is answered
/// busy at once, without its busy handler: SQLite does not wait where waiting could deadlock.
/// Several processes opening one new file together (a service and its relay on a first
/// deploy) failed to start with "database is locked" in about a third of such rounds.
pub(super) fn until_not_busy<T>(
    o: &Options,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let until = Instant::now() + o.busy_timeout;
    loop {
        match f() {
            Err(e)
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && Instant::now() < until =>
            {
                // The other process's switch takes a few milliseconds; this is the open, not a
                // request's path.
                std::thread::sleep(Duration::from_millis(2));
            }
            out => return out,
        }
    }
}
