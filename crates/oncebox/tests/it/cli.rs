//! The command line as scripts use it: `--output json` documents with their stable fields, and
//! the exit codes of `oncebox --help` for success, bad configuration, unknown keys, refused
//! actions and a store that cannot be reached.

use std::path::Path;

use serde_json::Value;

use crate::support::{Server, failure_document, json, oncebox, serve_with, text};

/// A configured source and a route whose deliveries stay pending: the gateway runs without
/// its relay, so every state the test reads was written by the commands it ran.
const CONFIG: &str = r#"
listen = "127.0.0.1:0"

[sources.shop]
signature = "none"
event_id = { header = "idempotency-key" }

[routes.orders]
sources = ["shop"]
url = "http://127.0.0.1:9/hook"
"#;

fn code(dir: &Path, args: &[&str]) -> Option<i32> {
    oncebox(dir, args).status.code()
}

/// `oncebox serve --no-relay` in `dir`, once it printed its address.
fn serve_without_relay(dir: &Path) -> Server {
    serve_with(dir, &["--no-relay"])
}

/// A directory with `oncebox.toml` and two events of `shop` stored by a real gateway.
pub(crate) fn two_events() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let server = serve_without_relay(dir.path());
    let url = server.1.clone();
    for id in ["evt_1", "evt_2"] {
        let out = oncebox(dir.path(), &["send", "shop", "--id", id, "--url", &url]);
        assert!(out.status.success(), "{}", text(&out));
    }
    // The default body depends on the id alone: sending it again is a replay.
    let again = oncebox(
        dir.path(),
        &["send", "shop", "--id", "evt_1", "--url", &url],
    );
    assert!(text(&again).contains("(replayed)"), "{}", text(&again));
    server.stop();
    dir
}

fn keys(v: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn listings_print_json_with_stable_fields() {
    let dir = two_events();
    let d = dir.path();

    let events = json(d, &["events", "--source", "shop", "--output", "json"]);
    let items = events["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(events["next"], Value::Null);
    assert_eq!(
        keys(&items[0]),
        [
            "completed_at",
            "conflicts",
            "content_type",
            "event_id",
            "fingerprint",
            "received_at",
            "seq",
            "source",
            "state"
        ]
    );
    assert_eq!(items[0]["event_id"], "evt_1");
    assert_eq!(items[1]["event_id"], "evt_2");
    assert_eq!(items[0]["state"], "completed");
    assert_eq!(items[0]["fingerprint"].as_str().map(str::len), Some(64));

    // A page of one names the cursor of the next.
    let first = json(d, &["events", "--limit", "1", "--output", "json"]);
    let next = first["next"].as_str().expect("a cursor");
    let second = json(d, &["events", "--after", next, "--output", "json"]);
    assert_eq!(second["items"][0]["event_id"], "evt_2");

    let stats = json(d, &["stats", "--output", "json"]);
    assert_eq!(stats["events"]["completed"], 2, "{stats}");
    assert_eq!(
        (&stats["conflicts"], &stats["outbox"]),
        (&0.into(), &2.into())
    );
    // No handler took action keys or versions here: the rows kept forever are counted as 0.
    assert_eq!(
        stats["kept"],
        serde_json::json!({ "actions": 0, "versions": 0, "offsets": 0 })
    );

    let deliveries = json(d, &["deliveries", "list", "--output", "json"]);
    let items = deliveries["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(
        keys(&items[0]),
        [
            "attempts",
            "created_at",
            "event_id",
            "hops",
            "id",
            "idempotency_key",
            "last_error",
            "last_status",
            "next_attempt_at",
            "note",
            "route",
            "source",
            "state"
        ]
    );
    assert_eq!(
        (
            &items[0]["route"],
            &items[0]["state"],
            &items[0]["attempts"]
        ),
        (&"orders".into(), &"pending".into(), &0.into())
    );
    // The key the receiver is sent, as the admin API lists it.
    let (source, id) = (&items[0]["source"], &items[0]["event_id"]);
    assert_eq!(
        items[0]["idempotency_key"].as_str(),
        Some(format!("{}:{}", source.as_str().unwrap(), id.as_str().unwrap()).as_str())
    );
    let dead = json(
        d,
        &["deliveries", "list", "--state", "dead", "--output", "json"],
    );
    assert_eq!(dead["items"], Value::Array(vec![]));

    let record = json(d, &["inspect", "shop", "evt_1", "--output", "json"]);
    assert_eq!(record["state"], "completed");
    assert_eq!(record["event_id"], "evt_1");
    // Shaped as the admin API shows an event's first answer.
    assert_eq!(record["response"]["kind"], "completed");
    assert_eq!(record["response"]["status"], 202);
    let body: Value = serde_json::from_str(record["response"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["status"], "accepted");

    let check = json(d, &["check", "--output", "json"]);
    assert_eq!(check["ok"], true);
    assert_eq!(check["sources"][0]["name"], "shop");
    assert_eq!(check["sources"][0]["signature"], "none");
    assert_eq!(check["routes"][0]["name"], "orders");

    let purged = json(d, &["purge", "--output", "json"]);
    assert_eq!(purged, serde_json::json!({ "purged": 0 }));
    // A zero retention would purge every completed record, including those whose senders
    // still retry: refused as a usage error, as it is in the file, and nothing is deleted.
    for bad in ["0s", "300000000000y"] {
        let out = oncebox(d, &["purge", "--retention", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(text(&out).contains("--retention"), "{bad}: {}", text(&out));
    }
    let record = json(d, &["inspect", "shop", "evt_1", "--output", "json"]);
    assert_eq!(record["state"], "completed");

    // Run from where no configuration is found (a cron job's directory), a purge cannot know
    // what the gateway keeps its sources for: it must be told, and deletes nothing until then.
    let elsewhere = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", d.join("oncebox.db").display());
    let out = oncebox(elsewhere.path(), &["--database", &db, "purge"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--retention"), "{}", text(&out));
    let told = oncebox(
        elsewhere.path(),
        &[
            "--database",
            &db,
            "purge",
            "--retention",
            "30d",
            "--output",
            "json",
        ],
    );
    assert!(told.status.success(), "{}", text(&told));
    let record = json(d, &["inspect", "shop", "evt_1", "--output", "json"]);
    assert_eq!(record["state"], "completed");
}

#[test]
fn redeliver_one_event_or_a_whole_source() {
    let dir = two_events();
    let d = dir.path();
    assert_eq!(code(d, &["redeliver", "shop", "evt_1"]), Some(0));

    let dry = json(
        d,
        &[
            "redeliver",
            "--source",
            "shop",
            "--since",
            "1h",
            "--dry-run",
            "--output",
            "json",
        ],
    );
    assert_eq!(
        dry,
        serde_json::json!({ "events": 2, "deliveries": 2, "dry_run": true })
    );
    // Without a window the whole history is not replayed by a slip: --all says so.
    let unbounded = oncebox(d, &["redeliver", "--source", "shop"]);
    assert_eq!(unbounded.status.code(), Some(2), "{}", text(&unbounded));
    assert!(text(&unbounded).contains("--since"), "{}", text(&unbounded));
    let done = json(
        d,
        &["redeliver", "--source", "shop", "--all", "--output", "json"],
    );
    assert_eq!(
        done,
        serde_json::json!({ "events": 2, "deliveries": 2, "dry_run": false })
    );
    // Nothing was received in the future: nothing to redeliver, said in the same document as
    // any run with nothing due; a source with no events is not found.
    let future = oncebox(
        d,
        &[
            "redeliver",
            "--source",
            "shop",
            "--since",
            "2999-01-01T00:00:00Z",
            "--output",
            "json",
        ],
    );
    assert_eq!(future.status.code(), Some(5));
    let said: Value = serde_json::from_slice(&future.stdout).expect("a JSON document");
    assert_eq!(
        said,
        serde_json::json!({ "events": 0, "deliveries": 0, "dry_run": false })
    );
    let missing = oncebox(
        d,
        &[
            "redeliver",
            "--source",
            "nosuchsource",
            "--since",
            "1h",
            "--output",
            "json",
        ],
    );
    assert_eq!(missing.status.code(), Some(3));
    failure_document(&missing, 3);
    // One event, or a source: not both, not neither.
    assert_eq!(
        code(d, &["redeliver", "shop", "evt_1", "--source", "shop"]),
        Some(2)
    );
    assert_eq!(code(d, &["redeliver"]), Some(2));
    // Arguments clap refuses: still one document for a script that asked for JSON.
    let clash = oncebox(
        d,
        &[
            "redeliver",
            "--source",
            "shop",
            "--all",
            "--since",
            "1h",
            "--output",
            "json",
        ],
    );
    assert_eq!(clash.status.code(), Some(2));
    failure_document(&clash, 2);
}

#[test]
fn exit_codes_tell_scripts_what_happened() {
    let dir = two_events();
    let d = dir.path();

    // 3: unknown event, unknown delivery, unknown source.
    assert_eq!(code(d, &["inspect", "shop", "evt_unknown"]), Some(3));
    assert_eq!(code(d, &["redeliver", "shop", "evt_unknown"]), Some(3));
    assert_eq!(code(d, &["deliveries", "retry", "999999"]), Some(3));
    let unknown = oncebox(d, &["send", "nosuchsource", "--url", "http://127.0.0.1:9"]);
    assert_eq!(unknown.status.code(), Some(3), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("no source \"nosuchsource\""),
        "named as written: {}",
        text(&unknown)
    );
    assert_eq!(
        code(
            d,
            &["bench", "--source", "nosuch", "--url", "http://127.0.0.1:9"]
        ),
        Some(3)
    );

    // 5: the delivery exists but its state refuses the action.
    let first = json(
        d,
        &["deliveries", "list", "--limit", "1", "--output", "json"],
    );
    let id = first["items"][0]["id"].to_string();
    let refused = oncebox(d, &["deliveries", "retry", &id]);
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused));
    assert!(text(&refused).contains("is pending"), "{}", text(&refused));
    // A pending delivery is given up by hand (its route retired, say).
    let given_up = oncebox(
        d,
        &["deliveries", "resolve", &id, "--dead", "--note", "retired"],
    );
    assert_eq!(given_up.status.code(), Some(0), "{}", text(&given_up));
    let listed = json(
        d,
        &["deliveries", "list", "--state", "dead", "--output", "json"],
    );
    assert_eq!(listed["items"][0]["id"].to_string(), id);
    assert_eq!(listed["items"][0]["note"], "retired");

    // 2: invalid arguments, keys and database URLs.
    assert_eq!(code(d, &["events", "--output", "yaml"]), Some(2));
    assert_eq!(code(d, &["inspect", "Shop", "evt_1"]), Some(2));
    let bad_id = oncebox(d, &["send", "shop", "--id", "a\nb"]);
    assert_eq!(bad_id.status.code(), Some(2), "{}", text(&bad_id));
    assert!(text(&bad_id).contains("--id"), "{}", text(&bad_id));
    // An id the gateway would refuse (too long) and a source name it cannot have: usage
    // errors, named before anything is sent (nothing listens at port 9).
    let long = "x".repeat(256);
    for args in [
        &["send", "shop", "--id", &long, "--url", "http://127.0.0.1:9"][..],
        &["send", "Shop", "--url", "http://127.0.0.1:9"][..],
    ] {
        let out = oncebox(d, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }
    assert_eq!(
        code(d, &["--database", "mysql://localhost/x", "stats"]),
        Some(2)
    );
    // Flags of send and bench that cannot work, refused before anything is sent.
    std::fs::write(
        d.join("two.toml"),
        "[sources.a]\nsignature = \"none\"\n[sources.b]\nsignature = \"none\"\n",
    )
    .unwrap();
    let bench = ["bench", "--source", "shop", "--url", "http://127.0.0.1:9"];
    for args in [
        &[&bench[..], &["--connections", "0"]].concat(),
        &[&bench[..], &["--duplicates", "1.5"]].concat(),
        &["bench", "--source", "shop", "--url", "localhost:8080"][..],
        &["send", "shop", "--url", "localhost:8080"],
        // Which of the configured sources to load is not guessed.
        &[
            "--config",
            "two.toml",
            "bench",
            "--url",
            "http://127.0.0.1:9",
        ],
    ] {
        let out = oncebox(d, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
    }

    // 0.
    assert_eq!(code(d, &["stats"]), Some(0));
}

#[test]
fn invalid_configuration_exits_2_and_check_says_why_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let bad = CONFIG.replace("signature = \"none\"", "signature = \"rot13\"");
    std::fs::write(dir.path().join("oncebox.toml"), bad).unwrap();
    let out = oncebox(dir.path(), &["check", "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let verdict: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["ok"], false);
    assert!(
        verdict["error"]
            .as_str()
            .unwrap()
            .contains("sources.shop.signature"),
        "{verdict}"
    );
    // Every command reads the configuration first, and fails the same way.
    assert_eq!(code(dir.path(), &["stats"]), Some(2));
    assert_eq!(
        code(dir.path(), &["--config", "missing.toml", "stats"]),
        Some(2)
    );
}

/// `oncebox serve` beside a log whose database file is gone (a restore that missed it) stops
/// with the reason instead of starting an empty inbox over the log: every key it remembered
/// would be new again.
#[test]
fn serve_refuses_a_database_file_lost_beside_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A real log: a store commits a key, and the log is kept without its file.
    let kept = d.join("kept");
    std::fs::create_dir(&kept).unwrap();
    let server = serve_with(&kept, &["--listen", "127.0.0.1:0", "--no-relay"]);
    let sent = oncebox(
        &kept,
        &["send", "shop", "--id", "evt_1", "--url", &server.1],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    let log = std::fs::read(kept.join("oncebox.db-wal")).unwrap();
    server.kill();
    assert!(!log.is_empty());
    std::fs::write(d.join("oncebox.db-wal"), &log).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--no-relay"])
        .current_dir(d)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve started over a lost database file");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("lost or truncated"), "{stderr}");
    assert_eq!(std::fs::read(d.join("oncebox.db-wal")).unwrap(), log);
    assert!(
        !d.join("oncebox.db").exists(),
        "an empty database was created"
    );
}
