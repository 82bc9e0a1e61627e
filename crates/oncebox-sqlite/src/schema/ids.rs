//! The migration step that keeps ids from being handed out twice, and its tests.

use rusqlite::Transaction;

/// The tables whose ids operators hold on to: an event's and a conflict's `seq` (a listing's
/// cursor) and a delivery's id (the one `retry` and `resolve` take).
const NUMBERED: [&str; 3] = ["oncebox_inbox", "oncebox_conflicts", "oncebox_outbox"];

/// Ids never handed out twice. A plain `INTEGER PRIMARY KEY` numbers a new row one past the
/// highest kept, so once a purge or a released lease took the newest rows their ids came back:
/// a listing's cursor from before skipped the new rows, and an operator's `resolve` of a dead
/// delivery by its id settled a new pending one, never sent. `AUTOINCREMENT` changes no byte
/// of the tables' rows, only how the next id is chosen (past the highest ever used, which
/// SQLite keeps in `sqlite_sequence`), so the definitions are edited in place rather than
/// every payload copied into new tables. `sqlite_sequence` is made by SQLite alone, with the
/// first table that asks for it; each table's count starts at its highest id, where the next
/// row would have started anyway. Earlier builds parse the edited definitions as this one
/// does.
///
/// What it costs: each insert reads and writes the table's row of `sqlite_sequence`, and an
/// insert its `ON CONFLICT` turned away (a duplicate, a conflict) still uses up the id it was
/// given, so ids have gaps, and a writer batch of only such inserts now writes that one row.
/// Ids only need to grow.
pub(super) fn ids_never_reused(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS oncebox_sequence_maker (id INTEGER PRIMARY KEY AUTOINCREMENT);
         DROP TABLE oncebox_sequence_maker;",
    )?;
    let edits = NUMBERED.map(|t| {
        (
            t,
            "INTEGER PRIMARY KEY,",
            "INTEGER PRIMARY KEY AUTOINCREMENT,",
        )
    });
    super::steps::edit_in_place(tx, &edits)?;
    for table in NUMBERED {
        // A definition whose text the edit did not find (changed by hand, or by a tool that
        // rewrote it) would leave this step recorded and ids still handed out twice.
        let edited: bool = tx.query_row(
            "SELECT instr(sql, 'AUTOINCREMENT') > 0 FROM sqlite_schema
             WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )?;
        if !edited {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                Some(format!(
                    "{table}: its definition does not read `id INTEGER PRIMARY KEY,` as oncebox \
                     made it, so AUTOINCREMENT could not be added"
                )),
            ));
        }
        tx.execute(
            &format!(
                "INSERT INTO sqlite_sequence (name, seq)
                 SELECT ?1, ifnull(max(id), 0) FROM {table}
                 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = ?1)"
            ),
            [table],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::super::tests::file_before;
    use super::super::{Step, migrate, open_writer};
    use crate::options::Options;

    const INSERT: &str = "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state,
        received_at) VALUES ('s', ?1, x'00', 'completed', 1)";

    fn newest(conn: &Connection) -> i64 {
        conn.query_row("SELECT max(id) FROM oncebox_inbox", [], |r| r.get(0))
            .unwrap()
    }

    /// Three rows, the newest taken away, one more: numbered past the one taken.
    fn after_the_newest_went(conn: &Connection, first: &str) -> i64 {
        for i in 0..3 {
            conn.execute(INSERT, [format!("{first}-{i}")]).unwrap();
        }
        let taken = newest(conn);
        conn.execute("DELETE FROM oncebox_inbox WHERE id = ?1", [taken])
            .unwrap();
        conn.execute(INSERT, [format!("{first}-again")]).unwrap();
        newest(conn) - taken
    }

    /// A file from before the step: ids came back after the newest row went (else this test
    /// proves nothing); once migrated they do not, from the first insert on, and its rows and
    /// their ids are as they were.
    #[test]
    fn a_migrated_file_never_numbers_a_row_as_one_that_went() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("old.db"));
        let mut conn = open_writer(&options).unwrap();
        file_before(&mut conn, &Step::Code(super::ids_never_reused));
        assert_eq!(after_the_newest_went(&conn, "old"), 0, "reused before");

        migrate(&mut conn, &options).unwrap();
        // The newest row at the step, gone before any insert since: not numbered again either
        // (each table's count starts at its highest id).
        let kept = newest(&conn);
        conn.execute("DELETE FROM oncebox_inbox WHERE id = ?1", [kept])
            .unwrap();
        conn.execute(INSERT, ["first-after"]).unwrap();
        assert_eq!(newest(&conn), kept + 1);
        assert_eq!(after_the_newest_went(&conn, "new"), 1);
        for table in ["oncebox_conflicts", "oncebox_outbox"] {
            let auto: bool = conn
                .query_row(
                    "SELECT instr(sql, 'AUTOINCREMENT') > 0 FROM sqlite_schema WHERE name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(auto, "{table}");
        }
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        // Run again over its own result, it changes nothing.
        let definitions = |c: &Connection| -> String {
            c.query_row(
                "SELECT group_concat(sql, ';') FROM sqlite_schema",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let before = definitions(&conn);
        let tx = conn.transaction().unwrap();
        super::ids_never_reused(&tx).unwrap();
        tx.commit().unwrap();
        assert_eq!(definitions(&conn), before);
    }

    /// A definition the edit cannot find its text in fails the step, and the migration with
    /// it, rather than being recorded as done with ids still handed out twice.
    #[test]
    fn a_definition_changed_by_hand_fails_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("edited.db"));
        let mut conn = open_writer(&options).unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(
            "CREATE TABLE oncebox_inbox (id INTEGER  PRIMARY KEY, x TEXT);
             CREATE TABLE oncebox_conflicts (id INTEGER PRIMARY KEY, x TEXT);
             CREATE TABLE oncebox_outbox (id INTEGER PRIMARY KEY, x TEXT);",
        )
        .unwrap();
        let refused = super::ids_never_reused(&tx).unwrap_err().to_string();
        assert!(
            refused.contains("oncebox_inbox: its definition"),
            "{refused}"
        );
    }

    /// A new file gets the step with the others.
    #[test]
    fn a_new_file_never_numbers_a_row_as_one_that_went() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("new.db"));
        let mut conn = open_writer(&options).unwrap();
        migrate(&mut conn, &options).unwrap();
        assert_eq!(after_the_newest_went(&conn, "new"), 1);
    }
}
