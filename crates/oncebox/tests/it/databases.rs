//! Which database a command runs on: a SQLite setting behind which nothing lasts is refused by
//! every command, and only `serve` and `migrate` create a database; `relay` and `consume`
//! started where there is none name the path instead of filling one of their own.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{failure_document, oncebox, text};

/// A source and a route: what `oncebox relay` needs to run.
const ROUTED: &str = r#"
[sources.shop]
signature = "none"

[routes.orders]
sources = ["shop"]
url = "http://127.0.0.1:9/hook"
"#;

/// A source and a RabbitMQ consumer of it.
const CONSUMED: &str = r#"
[sources.shop]
signature = "none"

[consumers.orders]
source = "shop"
queue = "orders"
key = "message-id"
quarantine = "oncebox.quarantine"
"#;

/// Runs `oncebox args…` in `dir` until it exits, or until it logs `running`, a line that says
/// it went on to work: then it is killed and `Err` carries its log so far. No timer decides.
fn until_exit_or(dir: &Path, args: &[&str], running: &str) -> Result<(i32, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(args)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .env_remove("ONCEBOX_AMQP_URL")
        .env_remove("ONCEBOX_NATS_URL")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oncebox");
    let mut log = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains(running) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(log);
        }
    }
    let status = child.wait().unwrap();
    Ok((status.code().unwrap_or(-1), log))
}

/// Every file `dir` holds besides `keep`, by name.
fn files_besides(dir: &Path, keep: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != keep)
        .collect()
}

/// `sqlite://` (as `sqlite://${DB_PATH}` with the variable unset leaves it), memory, a `file:`
/// URI and sqlx's `sqlite:` spelling exit 2 with the field and the fix, from the flag or the
/// environment, and leave no file behind: `check` said ok and `migrate` made a throwaway
/// database before.
#[test]
fn a_sqlite_database_that_keeps_nothing_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for database in [
        "sqlite://",
        "sqlite://:memory:",
        "file:o.db?mode=memory",
        "sqlite:oncebox.db",
    ] {
        for command in [&["check"][..], &["migrate"], &["stats"]] {
            let out = oncebox(d, &[&["--database", database][..], command].concat());
            let said = text(&out);
            assert_eq!(out.status.code(), Some(2), "{database} {command:?}: {said}");
            assert!(
                said.contains("database: ") && said.contains("sqlite:///abs/path.db"),
                "{database} {command:?}: {said}"
            );
        }
        let out = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .arg("check")
            .current_dir(d)
            .env_remove("ONCEBOX_CONFIG")
            .env("ONCEBOX_DATABASE", database)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{database}: {}", text(&out));
        assert!(text(&out).contains("ONCEBOX_DATABASE"), "{}", text(&out));
    }
    assert_eq!(files_besides(d, ""), Vec::<String>::new());
}

/// `oncebox relay` with no routes says so before any database is opened; with routes where no
/// database is, it exits 4 naming the path, as the read-only commands do, instead of polling a
/// new empty one. After `migrate` it runs.
#[test]
fn relay_never_creates_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.shop]\nsignature = \"none\"\n",
    )
    .unwrap();
    let (code, log) = until_exit_or(d, &["relay"], "relay running").expect("no routes: it ends");
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("no [routes] configured"), "{log}");
    assert_eq!(files_besides(d, "oncebox.toml"), Vec::<String>::new());

    std::fs::write(d.join("oncebox.toml"), ROUTED).unwrap();
    let (code, log) = until_exit_or(d, &["relay"], "relay running")
        .unwrap_or_else(|log| panic!("relay ran without a database: {log}"));
    assert_eq!(code, 4, "{log}");
    assert!(log.contains("no database at oncebox.db"), "{log}");
    assert_eq!(files_besides(d, "oncebox.toml"), Vec::<String>::new());

    assert!(oncebox(d, &["migrate"]).status.success());
    let ran = until_exit_or(d, &["relay"], "relay running");
    assert!(
        ran.is_err(),
        "the relay runs on the migrated database: {ran:?}"
    );
}

/// `oncebox consume` where no database is exits 4 naming the path instead of acknowledging
/// messages into a new one; with no consumer for the brokers given it says so before any
/// database is opened.
#[test]
fn consume_never_creates_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), CONSUMED).unwrap();
    // Nothing listens at port 9: a consumer that got this far would retry forever.
    let amqp = "amqp://guest:guest@127.0.0.1:9/%2f";
    let (code, log) = until_exit_or(d, &["consume", "--amqp", amqp], "consuming")
        .unwrap_or_else(|log| panic!("consume ran without a database: {log}"));
    assert_eq!(code, 4, "{log}");
    assert!(log.contains("no database at oncebox.db"), "{log}");
    assert_eq!(files_besides(d, "oncebox.toml"), Vec::<String>::new());

    let nats = "nats://127.0.0.1:9";
    let (code, log) = until_exit_or(d, &["consume", "--nats", nats], "consuming")
        .unwrap_or_else(|log| panic!("consume ran with no consumer: {log}"));
    assert_eq!(code, 2, "a configuration mistake: {log}");
    assert!(log.contains("no [consumers] to run"), "{log}");
    assert_eq!(files_besides(d, "oncebox.toml"), Vec::<String>::new());
}

/// The schema version oncebox records in the file.
fn schema_version(db: &Path) -> i64 {
    oncebox_sqlite::rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT version FROM oncebox_schema", [], |r| r.get(0))
        .unwrap()
}

/// Operators' commands on a database an older version keeps: refused, naming `oncebox migrate`,
/// and the file's schema is left as it was (a newer binary must not migrate a store under the
/// gateway that keeps it). `migrate` then brings it up to date, as `serve` would.
#[test]
fn operators_commands_change_no_schema() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = oncebox(d, &["migrate"]);
    assert!(out.status.success(), "{}", text(&out));
    let db = d.join("oncebox.db");
    let current = schema_version(&db);
    assert!(current > 1);
    // As the previous version left it.
    oncebox_sqlite::rusqlite::Connection::open(&db)
        .unwrap()
        .execute("UPDATE oncebox_schema SET version = ?1", [current - 1])
        .unwrap();
    for command in [
        &["stats"][..],
        &["events"],
        &["purge", "--retention", "7d"],
        &["deliveries", "list"],
    ] {
        let out = oncebox(d, command);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(4), "{command:?}: {said}");
        assert!(said.contains("oncebox migrate"), "{command:?}: {said}");
        assert_eq!(schema_version(&db), current - 1, "{command:?} migrated");
    }
}

/// `serve` on a port another process holds exits before it touches the database: none is
/// created where there was none, and one an older version keeps is not migrated (a second
/// start of a newer binary beside the running gateway would have migrated the store under it).
#[test]
fn serve_on_a_taken_port_leaves_the_database_alone() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let serve = ["serve", "--listen", addr.as_str()];
    // The port is held for the whole test, so `serve` can only exit; stderr never says this.
    let never = "oncebox listening";
    let (code, log) = until_exit_or(d, &serve, never).unwrap_or_else(|log| panic!("{log}"));
    assert_eq!(code, 1, "{log}");
    assert!(log.contains(&format!("binding {addr}")), "{log}");
    assert_eq!(files_besides(d, ""), Vec::<String>::new(), "{log}");

    assert!(oncebox(d, &["migrate"]).status.success());
    let db = d.join("oncebox.db");
    let current = schema_version(&db);
    oncebox_sqlite::rusqlite::Connection::open(&db)
        .unwrap()
        .execute("UPDATE oncebox_schema SET version = ?1", [current - 1])
        .unwrap();
    let (code, log) = until_exit_or(d, &serve, never).unwrap_or_else(|log| panic!("{log}"));
    assert_eq!(code, 1, "{log}");
    assert_eq!(schema_version(&db), current - 1, "migrated: {log}");
    drop(taken);
}

/// A database a newer oncebox migrated is used as it is where that build marked it readable by
/// this one, and otherwise refused by every command as the wrong binary for it (exit 2, naming
/// both versions), not as an unexpected failure; left as it was either way.
#[test]
fn a_database_from_a_newer_oncebox_exits_2_unless_marked_readable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(oncebox(d, &["migrate"]).status.success());
    let db = d.join("oncebox.db");
    let newer = schema_version(&db) + 1;
    let set = |sql: &str| {
        oncebox_sqlite::rusqlite::Connection::open(&db)
            .unwrap()
            .execute(sql, [newer])
            .unwrap()
    };
    // A later build whose steps keep this build's statements valid: run on as it is.
    set("UPDATE oncebox_schema SET version = ?1");
    for command in [&["stats"][..], &["migrate"], &["events"]] {
        let out = oncebox(d, command);
        assert_eq!(out.status.code(), Some(0), "{command:?}: {}", text(&out));
        assert_eq!(schema_version(&db), newer, "{command:?} changed it");
    }
    // One whose steps break this build.
    set("UPDATE oncebox_schema SET readable_from = ?1");
    for command in [&["stats"][..], &["migrate"], &["events"]] {
        let out = oncebox(d, command);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{command:?}: {said}");
        assert!(
            said.contains(&format!("version {newer} is newer")),
            "{command:?}: {said}"
        );
        assert_eq!(schema_version(&db), newer, "{command:?} changed it");
    }
}

/// Pointed at a SQLite file that is not oncebox's (another application's, a wrong path), an
/// operator's command refuses it and leaves it byte for byte as it was: not even its journal
/// mode is changed.
#[test]
fn operators_commands_leave_another_applications_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let other = d.join("other.db");
    oncebox_sqlite::rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
        .unwrap();
    let before = std::fs::read(&other).unwrap();
    let sqlite = format!("sqlite://{}", other.display());
    let out = oncebox(d, &["--database", &sqlite, "stats"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(said.contains("oncebox migrate"), "{said}");
    // Compared, not printed: a difference would dump the whole file.
    let after = std::fs::read(&other).unwrap();
    assert!(
        after == before,
        "the file changed ({} bytes before, {} after)",
        before.len(),
        after.len()
    );
}

/// A control character in `database`, from the file, the environment or the flag, for SQLite
/// or PostgreSQL, is refused under `database` (exit 2) by `check` as by every command: it
/// passed `check` before, and each command then failed as a store to retry later (exit 4).
#[test]
fn a_control_character_in_the_database_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let refused = |out: &std::process::Output, said: &str| {
        let printed = text(out);
        assert_eq!(out.status.code(), Some(2), "{said}: {printed}");
        assert!(
            printed.contains("database: ") && printed.contains("control character"),
            "{said}: {printed}"
        );
    };
    for database in [r"sqlite://o\u0000.db", r"postgres://u@127.0.0.1:1/o\u0000x"] {
        std::fs::write(
            d.join("oncebox.toml"),
            format!("database = \"{database}\"\n"),
        )
        .unwrap();
        for command in [&["check"][..], &["migrate"], &["stats"]] {
            refused(&oncebox(d, command), &format!("{database} {command:?}"));
        }
    }
    std::fs::remove_file(d.join("oncebox.toml")).unwrap();
    for database in [
        "sqlite://o\x01.db",
        "sqlite://o.db\n",
        "postgres://u@127.0.0.1:1/o\tx",
    ] {
        for command in [&["check"][..], &["migrate"], &["stats"]] {
            let args = [&["--database", database][..], command].concat();
            refused(&oncebox(d, &args), &format!("{database:?} {command:?}"));
        }
        let env = [("ONCEBOX_DATABASE", database)];
        let out = crate::support::oncebox_with_env(d, &env, &["check"]);
        refused(&out, &format!("ONCEBOX_DATABASE={database:?}"));
        assert!(text(&out).contains("ONCEBOX_DATABASE"), "{}", text(&out));
    }
    assert_eq!(files_besides(d, ""), Vec::<String>::new());
}

#[test]
fn a_store_that_cannot_be_reached_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pg = oncebox(d, &["--database", "postgres://127.0.0.1:1/x", "stats"]);
    assert_eq!(pg.status.code(), Some(4), "{}", text(&pg));
    // A file in a directory that does not exist is no store down for a while: exit 2, as
    // `migrate` says of it (`operator.rs`).
    let missing = d.join("no-such-dir").join("o.db");
    let sqlite = format!("sqlite://{}", missing.display());
    let out = oncebox(d, &["--database", &sqlite, "events", "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // One document on stdout, the failure's, for a script's `| jq`: no partial listing.
    let doc = failure_document(&out, 2);
    assert!(
        doc["error"].as_str().unwrap().contains("no-such-dir"),
        "{doc}"
    );
    let pg = oncebox(
        d,
        &[
            "--database",
            "postgres://127.0.0.1:1/x",
            "stats",
            "--output",
            "json",
        ],
    );
    failure_document(&pg, 4);
    // A mistyped file in a real directory is not created, empty, and read as a store.
    let typo = d.join("typo.db");
    let sqlite = format!("sqlite://{}", typo.display());
    for command in [
        &["stats"][..],
        &["events"],
        &["inspect", "shop", "evt_1"],
        &["purge", "--retention", "7d"],
    ] {
        let out = oncebox(d, &[&["--database", &sqlite][..], command].concat());
        assert_eq!(out.status.code(), Some(4), "{command:?}: {}", text(&out));
        assert!(text(&out).contains("no database at"), "{}", text(&out));
        assert!(!typo.exists(), "{command:?} created {}", typo.display());
    }
}

/// A database URL refused as malformed still had its password on the command line, for every
/// user of the machine to read: the warning comes with the refusal, not only when the
/// configuration loads.
#[test]
fn a_refused_url_on_the_command_line_is_still_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let out = oncebox(
        dir.path(),
        &["--database", "postgres://u:p/ss@127.0.0.1:1/x", "stats"],
    );
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(2), "{printed}");
    assert!(
        printed.contains("--database: its URL carries a credential"),
        "{printed}"
    );
    assert!(
        !printed.contains("p/ss"),
        "the value is never printed: {printed}"
    );
}
