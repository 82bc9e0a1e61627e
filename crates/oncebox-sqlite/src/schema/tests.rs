//! Tests of the migrations: old databases brought up to date with their rows.

use super::*;

/// The version a file is at just before `step` runs: the steps before it.
pub(super) fn before(step: &Step) -> i64 {
    let same = |s: &Step| match (s, step) {
        (Step::Sql(a), Step::Sql(b)) => a == b,
        (Step::Code(a), Step::Code(b)) => std::ptr::fn_addr_eq(*a, *b),
        _ => false,
    };
    let at = MIGRATIONS
        .iter()
        .position(same)
        .expect("a step of MIGRATIONS");
    i64::try_from(at).unwrap()
}

/// The file the steps before `step` leave, versioned so.
pub(super) fn file_before(conn: &mut Connection, step: &Step) {
    let version = before(step);
    let tx = conn.transaction().unwrap();
    for earlier in &MIGRATIONS[..usize::try_from(version).unwrap()] {
        match earlier {
            Step::Sql(sql) => tx.execute_batch(sql),
            Step::Code(change) => change(&tx),
        }
        .unwrap();
    }
    version::keep(&tx, version).unwrap();
    tx.commit().unwrap();
}

const INSERT: &str = "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state,
    received_at) VALUES ('s', ?1, x'00', ?2, 1)";

/// A database made before the check was rewritten: its rows stay, its check still refuses
/// an unknown state, and an insert no longer opens a temporary index.
#[test]
fn the_state_check_is_rewritten_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    let before = MIGRATIONS
        .iter()
        .position(|s| matches!(s, Step::Code(_)))
        .expect("the rewrite is a step of code");
    for step in &MIGRATIONS[..before] {
        let Step::Sql(sql) = step else {
            panic!("the rewrite is the first step of code")
        };
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", before).unwrap();
    conn.execute(INSERT, ["kept", "completed"]).unwrap();
    let explain = |c: &Connection| -> Vec<String> {
        let mut s = c.prepare(&format!("EXPLAIN {INSERT}")).unwrap();
        s.query_map(["x", "stale"], |r| r.get::<_, String>(1))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert!(
        explain(&conn).iter().any(|op| op == "OpenEphemeral"),
        "the old check builds a temporary index (else this test proves nothing)"
    );

    migrate(&mut conn, &options).unwrap();
    assert!(!explain(&conn).iter().any(|op| op == "OpenEphemeral"));
    // Another connection reads the new definition too.
    let other = open_reader(&options).unwrap();
    assert!(!explain(&other).iter().any(|op| op == "OpenEphemeral"));
    let kept: String = conn
        .query_row(
            "SELECT state FROM oncebox_inbox WHERE event_id = 'kept'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept, "completed");
    for state in ["processing", "completed", "rejected", "stale", "uncertain"] {
        conn.execute(INSERT, [state, state]).unwrap();
    }
    let refused = conn.execute(INSERT, ["bogus", "done"]).unwrap_err();
    assert!(refused.to_string().contains("CHECK"), "{refused}");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let writable: i64 = conn
        .query_row("PRAGMA writable_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(writable, 0);
}

/// Readers map the file, and read through the map what was checkpointed into it, and
/// through the WAL what was committed since.
#[test]
fn readers_map_the_file_and_see_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("mapped.db"));
    let mut writer = open_writer(&options).unwrap();
    migrate(&mut writer, &options).unwrap();
    let reader = open_reader(&options).unwrap();
    let mapped: i64 = reader
        .query_row("PRAGMA mmap_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mapped, READER_MMAP_BYTES);
    let state = |id: &str| -> String {
        reader
            .query_row(
                "SELECT state FROM oncebox_inbox WHERE event_id = ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap()
    };
    for id in 0..500 {
        writer
            .execute(INSERT, [format!("e{id}"), "completed".to_owned()])
            .unwrap();
    }
    writer
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    assert_eq!(state("e7"), "completed");
    writer
        .execute(
            "UPDATE oncebox_inbox SET state = 'rejected' WHERE event_id = 'e7'",
            [],
        )
        .unwrap();
    assert_eq!(state("e7"), "rejected");
    assert_eq!(state("e499"), "completed");
}

/// A database an earlier version purged: a finished delivery whose record is gone (and its
/// attempt) is cleared; one whose record is still there, one still owed, and a library
/// message keyed its own way are kept.
#[test]
fn finished_deliveries_left_by_earlier_purges_are_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    migrate(&mut conn, &options).unwrap();
    conn.execute(INSERT, ["kept", "completed"]).unwrap();
    let delivery = "INSERT INTO oncebox_outbox (destination, idempotency_key, payload,
        content_type, source, event_id, state, created_at, next_attempt_at)
        VALUES ('r', ?1, x'00', 'application/json', 's', ?2, ?3, 1, 1)";
    for (key, id, state) in [
        ("s:gone", "gone", "delivered"),
        ("s:gone-dead", "gone-dead", "dead"),
        ("s:kept", "kept", "delivered"),
        ("s:owed", "owed", "retrying"),
        ("thanks:order-1", "gone", "delivered"),
    ] {
        conn.execute(delivery, [key, id, state]).unwrap();
    }
    conn.execute(
        "INSERT INTO oncebox_attempts (delivery_id, started_at, duration_ms, status)
         SELECT id, 1, 1, 200 FROM oncebox_outbox WHERE idempotency_key = 's:gone'",
        [],
    )
    .unwrap();
    // As the version before the clearing left it (the steps after it change nothing twice).
    version::keep(&conn, before(&Step::Sql(CLEAR_ORPHANED_DELIVERIES))).unwrap();
    migrate(&mut conn, &options).unwrap();
    let mut keys: Vec<String> = conn
        .prepare("SELECT idempotency_key FROM oncebox_outbox ORDER BY idempotency_key")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    keys.sort();
    assert_eq!(keys, ["s:kept", "s:owed", "thanks:order-1"]);
    let attempts: i64 = conn
        .query_row("SELECT count(*) FROM oncebox_attempts", [], |r| r.get(0))
        .unwrap();
    assert_eq!(attempts, 0, "the cleared delivery's attempt went with it");
}

/// Without migrations, a path with no file is refused and no file is made there.
#[test]
fn without_migrations_a_missing_file_is_refused_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.db");
    let refused = refuse_outdated(&Options::new(&path).migrate(false));
    assert!(
        matches!(refused, Err(OpenError::SchemaOutdated { found: 0, .. })),
        "{refused:?}"
    );
    assert!(!path.exists());
    assert!(
        refuse_outdated(&Options::new(&path)).is_ok(),
        "migrating: created later"
    );
}

/// How many steps earlier builds versioned in `user_version`.
const EARLIER: usize = 7;

/// The file an earlier build left after its first `steps` migrations, with `user_version` as
/// it wrote it or as an application set it since.
fn earlier_file(conn: &mut Connection, steps: usize, user_version: i64) {
    let tx = conn.transaction().unwrap();
    for step in &MIGRATIONS[..steps] {
        match step {
            Step::Sql(sql) => tx.execute_batch(sql),
            Step::Code(change) => change(&tx),
        }
        .unwrap();
    }
    tx.pragma_update(None, "user_version", user_version)
        .unwrap();
    tx.commit().unwrap();
}

/// An earlier build's version is its `user_version` where that agrees with what its steps
/// left, and what they left where an application set another since; a file without oncebox's
/// tables is fresh, whatever its `user_version`.
#[test]
fn each_earlier_version_is_read_from_what_its_steps_left() {
    for steps in 0..=EARLIER {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("old.db"));
        let mut conn = open_writer(&options).unwrap();
        earlier_file(&mut conn, steps, steps as i64);
        let expected = |v| {
            if steps == 0 {
                Found::Fresh
            } else {
                Found::Earlier(v)
            }
        };
        assert_eq!(version::found(&conn).unwrap(), expected(steps as i64));
        conn.pragma_update(None, "user_version", 42).unwrap();
        // Step 6 only deletes rows: a file past it and not past 7 reads as 5, and runs it again.
        let shown = if steps == 6 { 5 } else { steps as i64 };
        assert_eq!(version::found(&conn).unwrap(), expected(shown), "{steps}");
    }
}

/// Adopted in the transaction that migrates it: the version moves into `oncebox_schema`, the
/// rows stay, `user_version` is left as it was; opened again, nothing is written.
#[test]
fn an_earlier_file_is_adopted_once_and_user_version_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    earlier_file(&mut conn, 3, 3);
    conn.execute(INSERT, ["kept", "completed"]).unwrap();
    migrate(&mut conn, &options).unwrap();
    assert_eq!(version::found(&conn).unwrap(), Found::Kept(VERSION));
    let user_version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, 3);
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    let schema = |c: &Connection| -> i64 {
        c.query_row("PRAGMA schema_version", [], |r| r.get(0))
            .unwrap()
    };
    let (changes, before) = (conn.total_changes(), schema(&conn));
    migrate(&mut conn, &options).unwrap();
    assert_eq!((conn.total_changes(), schema(&conn)), (changes, before));
}

/// A step failing midway (here an application's trigger refusing step 6's delete) leaves the
/// file as the earlier build left it: no step before it, no version adopted.
#[test]
fn a_migration_failing_midway_leaves_the_earlier_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    earlier_file(&mut conn, 4, 4);
    conn.execute_batch(
        "INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type,
           source, event_id, state, created_at, next_attempt_at)
         VALUES ('r', 's:gone', x'00', 'application/json', 's', 'gone', 'delivered', 1, 1);
         CREATE TRIGGER keep_deliveries BEFORE DELETE ON oncebox_outbox
         BEGIN SELECT RAISE(ABORT, 'kept'); END;",
    )
    .unwrap();
    let failed = migrate(&mut conn, &options);
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(version::found(&conn).unwrap(), Found::Earlier(4));
    let anchors: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'oncebox_purge_anchors'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(anchors, 0, "step 5 went with the failure");
    conn.execute_batch("DROP TRIGGER keep_deliveries").unwrap();
    migrate(&mut conn, &options).unwrap();
    assert_eq!(version::found(&conn).unwrap(), Found::Kept(VERSION));
}

/// A delivery queued before the loop guard's column existed is sent as the first hop, and the
/// step run again over a file that has the column changes nothing.
#[test]
fn deliveries_queued_before_the_hop_count_go_as_the_first_hop() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    migrate(&mut conn, &options).unwrap();
    conn.execute_batch("ALTER TABLE oncebox_outbox DROP COLUMN hops")
        .unwrap();
    conn.execute(
        "INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type,
           source, event_id, created_at, next_attempt_at)
         VALUES ('r', 's:old', x'00', 'application/json', 's', 'old', 1, 1)",
        [],
    )
    .unwrap();
    version::keep(&conn, before(&Step::Code(hops_column))).unwrap();
    migrate(&mut conn, &options).unwrap();
    let hops = |c: &Connection| -> i64 {
        c.query_row("SELECT hops FROM oncebox_outbox", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(hops(&conn), 1);
    conn.execute("UPDATE oncebox_outbox SET hops = 5", [])
        .unwrap();
    version::keep(&conn, before(&Step::Code(hops_column))).unwrap();
    migrate(&mut conn, &options).unwrap();
    assert_eq!(hops(&conn), 5, "the step run again changed nothing");
}

/// Numeric ordering entities an earlier build kept as `1e3` are found under `1000` after the
/// step, the higher version kept where the string `"1000"` had one too; other ids are left as
/// they were, and the step run again changes nothing.
#[test]
fn numeric_entities_kept_in_a_numbers_canonical_text_are_rewritten_in_plain_decimal() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("old.db"));
    let mut conn = open_writer(&options).unwrap();
    migrate(&mut conn, &options).unwrap();
    let insert = "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
        VALUES ('shop', ?1, ?2, 'shop', ?1)";
    for (id, version) in [("1e3", 5), ("1000", 3), ("12e2", 7), ("2e1", 1), ("20", 9)] {
        conn.execute(insert, rusqlite::params![id, version])
            .unwrap();
    }
    for id in ["10e2", "abc", "7"] {
        conn.execute(insert, rusqlite::params![id, 1]).unwrap();
    }
    // A library handler's own entity (`Tx::advance("order", ..)`), left as it is.
    conn.execute(
        "INSERT INTO oncebox_versions (entity, entity_id, version, source, event_id)
         VALUES ('order', '5e3', 4, 'shop', 'x')",
        [],
    )
    .unwrap();
    let rows = |c: &Connection| -> Vec<(String, i64)> {
        c.prepare("SELECT entity_id, version FROM oncebox_versions ORDER BY entity_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let expected: Vec<(String, i64)> = [
        ("1000", 5),
        ("10e2", 1),
        ("1200", 7),
        ("20", 9),
        ("5e3", 4),
        ("7", 1),
        ("abc", 1),
    ]
    .into_iter()
    .map(|(id, v)| (id.to_owned(), v))
    .collect();
    for _ in 0..2 {
        version::keep(&conn, before(&Step::Code(plain_numeric_entities))).unwrap();
        migrate(&mut conn, &options).unwrap();
        assert_eq!(rows(&conn), expected);
    }
}
