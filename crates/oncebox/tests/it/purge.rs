//! Which records a purge reaches: with `[sources]`, those of the sources the configuration
//! names, each by its own retention, and none of a source it does not name (another gateway's
//! sharing the database, whose retention it cannot know); `--retention` reaches those too.
//! Before, they were purged after the default 7 days, silently.

use std::path::Path;

use serde_json::Value;

use crate::support::{oncebox, serve_with, text};

const CONFIG: &str = r#"
listen = "127.0.0.1:0"

[sources.shop]
signature = "none"
event_id = { header = "idempotency-key" }
"#;

/// Moves every record `days` back in time, the two named ids to `source`.
fn age(dir: &Path, days: i64, renamed: &[&str], source: &str) {
    let db = oncebox_sqlite::rusqlite::Connection::open(dir.join("oncebox.db")).unwrap();
    let ms = days * 86_400_000;
    db.execute(
        "UPDATE oncebox_inbox SET received_at = received_at - ?1, \
         completed_at = completed_at - ?1",
        [ms],
    )
    .unwrap();
    for id in renamed {
        db.execute(
            "UPDATE oncebox_inbox SET source = ?1 WHERE event_id = ?2",
            [source, id],
        )
        .unwrap();
    }
}

fn sources(dir: &Path) -> Vec<String> {
    let db = oncebox_sqlite::rusqlite::Connection::open(dir.join("oncebox.db")).unwrap();
    let mut s = db
        .prepare("SELECT source || ':' || event_id FROM oncebox_inbox ORDER BY event_id")
        .unwrap();
    s.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn purged(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["purge", "--output", "json"];
    all.extend_from_slice(args);
    let out = oncebox(dir, &all);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_purge_keeps_the_sources_its_configuration_does_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), CONFIG).unwrap();
    let server = serve_with(d, &["--no-relay"]);
    for id in ["evt_1", "evt_2", "evt_3"] {
        let out = oncebox(d, &["send", "shop", "--id", id, "--url", &server.1]);
        assert!(out.status.success(), "{}", text(&out));
    }
    server.stop();
    // Thirty days old, past the default 7 days: evt_2 and evt_3 now belong to a source this
    // configuration does not name.
    age(d, 30, &["evt_2", "evt_3"], "elsewhere");

    assert_eq!(purged(d, &[]), serde_json::json!({ "purged": 1 }));
    assert_eq!(sources(d), ["elsewhere:evt_2", "elsewhere:evt_3"]);
    // Told a retention, the purge reaches every source.
    assert_eq!(
        purged(d, &["--retention", "10d"]),
        serde_json::json!({ "purged": 2 })
    );
    assert!(sources(d).is_empty());
}
