//! The wall clock jumped for real: `oncebox purge` under libfaketime, a year ahead, while the
//! kernel's time since boot runs on untouched. After one purge at the right time on this boot,
//! the jumped purge deletes nothing: by real time no record is due. Without that earlier
//! purge's anchor the same jump purges everything, which shows the jump reached the binary.
//! On PostgreSQL a node a year ahead from its boot's first purge on purges by the server's
//! clock, and anchors nothing.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{oncebox, text};

/// `oncebox purge --output json` in `dir` under `faketime` a year ahead.
fn purge_a_year_ahead(faketime: &Path, dir: &Path) -> Value {
    purge_a_year_ahead_saying(faketime, dir).0
}

/// [`purge_a_year_ahead`], with what it logged.
fn purge_a_year_ahead_saying(faketime: &Path, dir: &Path) -> (Value, String) {
    let out = Command::new(faketime)
        .args(["-f", "+365d", env!("CARGO_BIN_EXE_oncebox")])
        .args(["purge", "--output", "json"])
        .current_dir(dir)
        // A wall clock set wrong moves neither the monotonic clocks nor the time since boot;
        // libfaketime fakes those too unless told not to.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .output()
        .expect("run oncebox under faketime");
    assert!(out.status.success(), "{}", text(&out));
    let json =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (json, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn purge_now(dir: &Path) -> Value {
    let out = oncebox(dir, &["purge", "--output", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stored(dir: &Path) -> i64 {
    let db = dir.join("oncebox.db");
    oncebox_sqlite::rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_purge_a_year_ahead_after_one_on_time_deletes_nothing() {
    let Some(faketime) = oncebox_testkit::require_program("/usr/bin/faketime") else {
        return;
    };
    let dir = crate::cli::two_events();
    let d = dir.path();
    // Their deliveries done, as a relay would leave them: a record whose delivery is still
    // owed is never purged, whatever the clock says.
    let delivered = oncebox_sqlite::rusqlite::Connection::open(d.join("oncebox.db"))
        .unwrap()
        .execute("UPDATE oncebox_outbox SET state = 'delivered'", [])
        .unwrap();
    assert!(delivered > 0);
    assert_eq!(purge_now(d), json!({ "purged": 0 }), "nothing is due yet");
    assert_eq!(purge_a_year_ahead(&faketime, d), json!({ "purged": 0 }));
    assert_eq!(stored(d), 2, "both records kept");

    // The same files with the anchors forgotten: the jump alone decides, and ages both.
    let copy = tempfile::tempdir().unwrap();
    for name in ["oncebox.toml", "oncebox.db"] {
        std::fs::copy(d.join(name), copy.path().join(name)).unwrap();
    }
    oncebox_sqlite::rusqlite::Connection::open(copy.path().join("oncebox.db"))
        .unwrap()
        .execute("DELETE FROM oncebox_purge_anchors", [])
        .unwrap();
    assert_eq!(
        purge_a_year_ahead(&faketime, copy.path()),
        json!({ "purged": 2 }),
        "the jump reached the binary"
    );
}

/// A PostgreSQL node whose clock is a year ahead from the start of its boot: no anchor of an
/// earlier purge bounds it, so only the server's clock can tell that no record is due.
#[test]
fn a_postgres_node_a_year_ahead_purges_by_the_servers_clock() {
    let Some(faketime) = oncebox_testkit::require_program("/usr/bin/faketime") else {
        return;
    };
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let schema = rt.block_on(crate::schema::Schema::create(&base, "skew"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndatabase = \"{}\"\n\n[sources.shop]\nsignature = \"none\"\n",
        schema.url
    );
    std::fs::write(d.join("oncebox.toml"), config).unwrap();
    let server = crate::support::serve_with(d, &["--no-relay"]);
    for id in ["evt_1", "evt_2"] {
        let out = oncebox(d, &["send", "shop", "--id", id, "--url", &server.1]);
        assert!(out.status.success(), "{}", text(&out));
    }
    server.stop();
    let sql = |sql: &str| -> i64 {
        rt.block_on(async {
            let pool = schema.pool().await;
            oncebox_postgres::sqlx::query_scalar(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        })
    };
    let count = |table: &str| sql(&format!("SELECT count(*) FROM {table}"));
    // `serve` purged at start and anchored this boot: forgotten, so the jump alone decides.
    sql("WITH gone AS (DELETE FROM oncebox_purge_anchors RETURNING 1) SELECT count(*) FROM gone");
    let (purged, said) = purge_a_year_ahead_saying(&faketime, d);
    assert_eq!(purged, json!({ "purged": 0 }), "{said}");
    assert!(
        said.contains("ahead of the database server's"),
        "the jump reached the binary, which said so: {said}"
    );
    assert_eq!(count("oncebox_inbox"), 2, "both records kept");
    assert_eq!(
        count("oncebox_purge_anchors"),
        0,
        "no anchor from the wrong clock"
    );
    // At the right time the boot's first purge anchors, and still nothing is due.
    assert_eq!(purge_now(d), json!({ "purged": 0 }));
    assert_eq!(count("oncebox_purge_anchors"), 1);
}
