//! `oncebox send` against a real gateway: its default body carries the event id where the
//! source's rule reads it, as `bench`'s bodies do, so any source can be tried with `--id`; a
//! `--url` with credentials is never printed whole.

use serde_json::Value;

use crate::support::{json, oncebox, serve_with, text};

/// One source reads its id at a JSON pointer, the other derives it from two body fields.
const CONFIG: &str = r#"
listen = "127.0.0.1:0"

[sources.shop]
signature = "none"
event_id = { pointer = "/data/id" }

[sources.ledger]
signature = "none"
event_id = { derive = ["/data/order", "/data/id"] }
"#;

fn event_ids(dir: &std::path::Path, source: &str) -> Vec<String> {
    let out = oncebox(dir, &["events", "--source", source, "--output", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    listing["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn send_puts_the_id_where_the_source_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), CONFIG).unwrap();
    let server = serve_with(d, &["--no-relay"]);
    let url = server.1.clone();
    let send = |source: &str, id: &str| {
        let out = oncebox(d, &["send", source, "--id", id, "--url", &url]);
        assert_eq!(out.status.code(), Some(0), "{source} {id}: {}", text(&out));
        assert!(
            text(&out).starts_with("202"),
            "{source} {id}: {}",
            text(&out)
        );
        text(&out).contains("(replayed)")
    };
    assert!(!send("shop", "evt_1"));
    // Two ids are two events of a derived source; the same id again is a replay.
    assert!(!send("ledger", "evt_1"));
    assert!(!send("ledger", "evt_2"));
    assert!(send("ledger", "evt_1"));
    server.stop();

    assert_eq!(event_ids(d, "shop"), ["evt_1"]);
    let derived = event_ids(d, "ledger");
    assert_eq!(derived.len(), 2, "{derived:?}");
    assert_ne!(derived[0], derived[1]);
}

/// A `--url` carrying credentials (`http://user:token@host/`) is shown redacted when the
/// request fails, in oncebox's message and in the HTTP client's (nothing listens at port 9).
#[test]
fn send_never_prints_the_credentials_in_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), CONFIG).unwrap();
    let url = "http://user:tok3n@127.0.0.1:9/";
    let out = oncebox(d, &["send", "shop", "--id", "evt_1", "--url", url]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("POST http://***@127.0.0.1:9/v1/sources/shop/events"),
        "{said}"
    );
    assert!(!said.contains("tok3n") && !said.contains("user:"), "{said}");
}

/// Something in front of the gateway (a sign-in proxy) answers the POST with a redirect to a
/// page that answers 200: `send` reports the 302 and fails, since no gateway saw the event.
/// Followed, the POST became a GET of that page and `send` printed its 200 as success.
#[test]
fn send_does_not_follow_a_redirect() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("oncebox.toml"), CONFIG).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = axum::Router::new()
        .route(
            "/v1/sources/shop/events",
            axum::routing::post(|| async {
                (
                    axum::http::StatusCode::FOUND,
                    [("location", "/sign-in")],
                    "",
                )
            }),
        )
        .route("/sign-in", axum::routing::get(|| async { "sign in" }));
    rt.spawn(async move { axum::serve(listener, proxy).await });
    let url = format!("http://{addr}");
    let out = oncebox(d, &["send", "shop", "--id", "evt_1", "--url", &url]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(5), "{said}");
    assert!(said.starts_with("302 Found"), "{said}");
    assert!(
        said.contains("redirected to /sign-in, not followed"),
        "{said}"
    );
}

/// `--id` is checked against where the source carries it: in a header (its rule's, or the
/// scheme's `webhook-id`) HTTP takes no control character and drops a leading space, so such
/// an id is refused before any request (before, the signature covered the space the gateway never
/// saw, and the answer was a puzzling 401); in the body alone any text goes, as the gateway
/// takes it. A body that is no JSON is not sent as JSON.
#[test]
fn send_checks_the_id_where_it_travels_and_labels_the_body_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = format!(
        "{CONFIG}
[sources.signed]
signature = \"standard-webhooks\"
secrets = [\"whsec_Wm9JjiPDd5fcsH+Gt4qvU/uyQoaWDmhs\"]
event_id = {{ pointer = \"/data/id\" }}

[sources.raw]
signature = \"none\"
event_id = {{ header = \"x-event-id\" }}
fingerprint = \"raw\"
"
    );
    std::fs::write(d.join("oncebox.toml"), config).unwrap();
    let server = serve_with(d, &["--no-relay"]);
    let url = server.1.clone();
    let run = |args: &[&str]| {
        let mut all = vec!["send"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--url", &url]);
        oncebox(d, &all)
    };
    for (source, id) in [
        ("signed", " evt_1"),
        ("raw", " evt_1"),
        ("raw", "evt\u{7f}"),
    ] {
        let out = run(&[source, "--id", id]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{source} {id:?}: {}",
            text(&out)
        );
        assert!(text(&out).contains("header"), "{}", text(&out));
    }
    // In the body, or in a header as UTF-8: stored as sent.
    let out = run(&["shop", "--id", "evt_é"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&["raw", "--id", "raw_é"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&["raw", "--id", "r1", "--body", "a=1&b=2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    server.stop();

    assert_eq!(event_ids(d, "shop"), ["evt_é"]);
    assert_eq!(event_ids(d, "raw"), ["raw_é", "r1"]);
    assert!(event_ids(d, "signed").is_empty());
    let out = oncebox(d, &["events", "--source", "raw", "--output", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    let types: Vec<&Value> = listing["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["content_type"])
        .collect();
    assert_eq!(
        types,
        [
            &Value::from("application/json"),
            &Value::from("text/plain; charset=utf-8")
        ],
        "{listing}"
    );
}

/// `send --body` without `--id` sends the id the body holds where the source reads one
/// (`/id` for a source with no `event_id` rule): the same body sent twice is one event,
/// replayed the second time, stored under the body's id.
#[test]
fn send_with_a_body_and_no_id_keeps_the_bodys_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("oncebox.toml"),
        "listen = \"127.0.0.1:0\"\n[sources.plain]\nsignature = \"none\"\n",
    )
    .unwrap();
    let server = serve_with(d, &["--no-relay"]);
    let body = r#"{"id":"evt_in_body","amount":1}"#;
    let send = || oncebox(d, &["send", "plain", "--body", body, "--url", &server.1]);
    let first = send();
    assert!(first.status.success(), "{}", text(&first));
    assert!(!text(&first).contains("(replayed)"), "{}", text(&first));
    let again = send();
    assert!(text(&again).contains("(replayed)"), "{}", text(&again));
    // A body's id the gateway would refuse is named as the body's, not as an --id never given.
    let empty = oncebox(
        d,
        &[
            "send",
            "plain",
            "--body",
            r#"{"id":""}"#,
            "--url",
            &server.1,
        ],
    );
    assert_eq!(empty.status.code(), Some(2), "{}", text(&empty));
    assert!(
        text(&empty).contains("the body's id \"\""),
        "{}",
        text(&empty)
    );
    server.stop();
    let events = json(d, &["events", "--source", "plain", "--output", "json"]);
    let ids: Vec<&str> = events["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .collect();
    assert_eq!(ids, ["evt_in_body"]);
}
