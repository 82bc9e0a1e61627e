//! The wall clock jumped for real: `oncebox purge` under libfaketime, a year ahead, while the
//! kernel's time since boot runs on untouched. After one purge at the right time on this boot,
//! the jumped purge deletes nothing: by real time no record is due. Without that earlier
//! purge's anchor the same jump purges everything, which shows the jump reached the binary.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{oncebox, text};

/// `oncebox purge --output json` in `dir` under `faketime` a year ahead.
fn purge_a_year_ahead(faketime: &Path, dir: &Path) -> Value {
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
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
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
