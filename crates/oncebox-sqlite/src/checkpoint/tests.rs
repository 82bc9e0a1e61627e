//! The writer's last copy before a restart, beside look connections that keep their snapshots.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::Connection;

use super::{SyncFailed, due};
use crate::read::Looks;
use crate::writer::Stats;

/// Frames in the log, as a passive checkpoint reports them.
fn log_frames(writer: &Connection) -> i64 {
    writer
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
        .unwrap()
}

/// A look after the last commit keeps its snapshot, and with it a mark at the log's end, until
/// the next commit or the checkpointer's next release. The writer's copy of the rest used to
/// leave it there, so its next transaction could not start the log over, and the log grew for
/// as long as duplicates kept looks coming between commits.
#[test]
fn the_writers_last_copy_ends_kept_snapshots_so_its_next_write_starts_the_log_over() {
    let (_dir, options, writer) = crate::scratch::writer();
    let stats = Arc::new(Stats::default());
    let looks = Arc::new(Looks::new(options, stats.clone()));
    for k in 0..50 {
        crate::scratch::insert(&writer, &k.to_string());
    }
    stats.commits.fetch_add(1, Ordering::Release);
    let seen: i64 = looks
        .look(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(seen, 50);
    assert_eq!(looks.open_snapshots(), 1, "the look kept its snapshot");
    let before = log_frames(&writer);
    let (due, checkpointer) = due(64, looks.clone(), SyncFailed::default());
    checkpointer.finish.store(true, Ordering::Release);
    assert!(due.finish(&writer), "the whole log copied");
    assert_eq!(looks.open_snapshots(), 0);
    crate::scratch::insert(&writer, "next");
    let after = log_frames(&writer);
    assert!(
        after < before,
        "the log started over: {after} frames against {before}"
    );
}
