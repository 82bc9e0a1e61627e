//! Test-only: a writer connection on a new file holding one table, `t (k TEXT PRIMARY KEY)`,
//! for the unit tests of the log, its checkpoints and the look connections.

use rusqlite::Connection;

use crate::options::Options;

/// The directory (removed on drop), the options the file was opened with, and the writer.
pub(crate) fn writer() -> (tempfile::TempDir, Options, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("scratch.db"));
    let writer = crate::schema::open_writer(&options).unwrap();
    writer
        .execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY)")
        .unwrap();
    (dir, options, writer)
}

/// One row of `t`, committed.
pub(crate) fn insert(conn: &Connection, k: &str) {
    conn.execute("INSERT INTO t (k) VALUES (?1)", [k]).unwrap();
}
