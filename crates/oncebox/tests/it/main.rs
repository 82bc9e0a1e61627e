//! The binary's command line, run as a user would run it.

mod bench;
mod cli;
mod consume;
mod consume_handshake;
mod counting;
mod dashboard;
mod databases;
mod faketime;
mod figures;
mod gateway;
mod help;
mod kill;
mod loops;
mod multinode;
mod nodes;
mod operator;
mod outage;
mod pgopen;
mod pipes;
mod private;
mod purge;
mod quickstart;
mod race;
mod relay;
#[path = "../shared/schema.rs"]
mod schema;
mod send;
mod skew;
mod stop;
mod support;

use std::process::Command;

fn oncebox(db: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("--database")
        .arg(format!("sqlite://{}", db.display()))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run oncebox")
}

#[test]
fn migrate_creates_the_database_and_stats_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    let out = oncebox(&db, &["migrate"]);
    assert!(out.status.success(), "{out:?}");
    assert!(db.exists());
    let stats = oncebox(&db, &["stats"]);
    let text = String::from_utf8(stats.stdout).unwrap();
    assert!(
        text.contains("conflicts    0") && text.contains("outbox       0"),
        "{text}"
    );
}

#[test]
fn inspect_of_an_unknown_key_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    assert!(oncebox(&db, &["migrate"]).status.success());
    let out = oncebox(&db, &["inspect", "shop", "evt-1"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no record for shop:evt-1"));
    let bad = oncebox(&db, &["inspect", "Shop", "evt-1"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("source must match"),
        "{bad:?}"
    );
}

#[test]
fn unsupported_database_url_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["--database", "mysql://localhost/x", "stats"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use sqlite://PATH or postgres://"));
}

/// A mistyped scheme is refused by every command, `check` included, under the field's name and
/// without the password the URL carries.
#[test]
fn a_mistyped_database_scheme_is_refused_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = "postgress://app:hunter2@db/oncebox";
    for command in [
        &["check"][..],
        &["stats"],
        &["migrate"],
        &["serve", "--listen", "127.0.0.1:0"],
    ] {
        let out = support::oncebox(dir.path(), &[&["--database", url][..], command].concat());
        let text = support::text(&out);
        assert_eq!(out.status.code(), Some(2), "{command:?}: {text}");
        assert!(
            text.contains("database: unsupported URL"),
            "{command:?}: {text}"
        );
        assert!(!text.contains("hunter2"), "{command:?}: {text}");
    }
}

/// A PostgreSQL URL the driver cannot read is refused by `check` as by every command that
/// opens the store, under `database` and without its password; none of these reaches a server.
#[test]
fn a_postgres_url_the_driver_cannot_read_is_refused_by_check_too() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres://u:hunter2@127.0.0.1:5432/db?sslmode=bogus",
        "postgres://u:hunter2@127.0.0.1:notaport/db",
        "postgres://u:hunter2@[::1:19199/db",
    ] {
        for command in [&["check"][..], &["stats"], &["migrate"]] {
            let args = [&["--database", url][..], command].concat();
            let out = support::oncebox(dir.path(), &args);
            let text = support::text(&out);
            assert_eq!(out.status.code(), Some(2), "{command:?} {url}: {text}");
            assert!(
                text.contains("database: PostgreSQL 127.0.0.1")
                    || text.contains("database: PostgreSQL [::1"),
                "{command:?}: {text}"
            );
            assert!(!text.contains("hunter2"), "{command:?}: {text}");
            // The driver wraps its reason in its configuration error twice: said once.
            assert!(
                text.matches("error with configuration").count() <= 1,
                "{command:?}: {text}"
            );
        }
    }
}

/// A node that neither verifies events nor signs deliveries starts without their secrets in its
/// environment; one that does names the variable's field and refuses to start.
#[test]
fn a_command_needs_only_the_secrets_it_uses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "[sources.shop]\npreset = \"standard-webhooks\"\nsecrets_env = [\"SHOP_SECRET\"]\n\
         [routes.r]\nsources = [\"shop\"]\nurl = \"https://example.com/hooks\"\n\
         signing_secret_env = \"ROUTE_SECRET\"\n",
    )
    .unwrap();
    assert!(support::oncebox(d, &["migrate"]).status.success());
    for args in [
        &["stats"][..],
        &["events"],
        &["purge"],
        &["deliveries", "list"],
    ] {
        let out = support::oncebox(d, args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            support::text(&out)
        );
    }
    for (args, field) in [
        (&["check"][..], "sources.shop.secrets_env[0]"),
        (&["check"], "routes.r.signing_secret_env"),
        (&["relay"], "routes.r.signing_secret_env"),
        (&["send", "shop"], "sources.shop.secrets_env[0]"),
    ] {
        let out = support::oncebox(d, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            support::text(&out)
        );
        assert!(
            support::text(&out).contains(field),
            "{args:?}: {}",
            support::text(&out)
        );
    }
}

/// A stderr nobody reads (its pipe closed) loses the message, not the exit code: the error
/// still exits 2, not with a panic's 101.
#[test]
fn an_error_with_stderr_closed_keeps_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["check", "--config", "/nonexistent/oncebox.toml"])
        .current_dir(dir.path())
        .env_remove("RUST_BACKTRACE")
        .stderr(writer)
        .status()
        .expect("run oncebox");
    assert_eq!(status.code(), Some(2), "{status:?}");
}

/// A file that is no SQLite database stays so: the command fails (1), it does not ask to be
/// retried later (4) as for a locked or unreachable store.
#[test]
fn a_file_that_is_no_database_is_a_failure_not_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let out = oncebox(&garbage, &["stats"]);
    let printed = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("garbage.db"), "{printed}");
}

/// A database damaged inside (a page of the inbox's key index overwritten) opens, and fails
/// when a command reads that index: as for a file damaged as a whole, the command fails (1)
/// saying the file is damaged, not "retry later" (4), on which a retrying script would loop.
#[test]
fn a_damaged_database_met_by_a_query_is_a_failure_not_a_retry() {
    let dir = cli::two_events();
    let db = dir.path().join("oncebox.db");
    oncebox_testkit::damage::damage_key_index(&db);

    let out = support::oncebox(dir.path(), &["inspect", "shop", "evt_1"]);
    let printed = support::text(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(
        printed.contains("the database file is damaged")
            && printed.contains("malformed")
            && !printed.contains("unavailable"),
        "{printed}"
    );
}

/// A gateway's base URL may carry a path prefix but no query or fragment, which would land in
/// the middle of each request's URL: refused before anything is sent.
#[test]
fn a_base_url_with_a_query_is_refused_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    for url in [
        "http://127.0.0.1:9/?token=x",
        "http://127.0.0.1:9/base#frag",
    ] {
        for command in [&["send", "demo"][..], &["bench"]] {
            let out = oncebox(&db, &[command, &["--url", url]].concat());
            let printed = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command:?} {url}: {printed}");
            assert!(printed.contains("no query or fragment"), "{printed}");
        }
    }
}
