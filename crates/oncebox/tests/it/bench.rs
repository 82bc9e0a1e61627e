//! `oncebox bench` end to end: its invariant check passes against a real gateway, names the
//! keys a gateway accepted and did not store, and is skipped on request for another server.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};

use crate::support::{oncebox, serve_with, text};

/// The count in the line starting with `label` (`new   540 requests …`).
fn requests(printed: &str, label: &str) -> usize {
    printed
        .lines()
        .find_map(|l| {
            l.strip_prefix(label)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {label:?} line in {printed}"))
}

#[test]
fn against_a_real_gateway_every_accepted_key_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with(dir.path(), &["--listen", "127.0.0.1:0"]);
    let url = server.1.clone();
    let out = oncebox(
        dir.path(),
        &[
            "bench",
            "--url",
            &url,
            "--events",
            "600",
            "--connections",
            "8",
            "--duplicates",
            "0.2",
        ],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("status 202: 600"), "{printed}");
    let (new, duplicates) = (
        requests(&printed, "new "),
        requests(&printed, "duplicates "),
    );
    assert_eq!(new + duplicates, 600, "{printed}");
    assert!(duplicates > 0, "the run resent some ids: {printed}");
    // Every new key was listed back from the gateway, once.
    assert!(
        printed.contains(&format!("invariant: ok ({new} keys)")),
        "{printed}"
    );
    server.stop();
}

/// A stand-in for a broken gateway: it answers every event 202 and stores nothing.
async fn forgetful(listing: bool) -> (String, tokio::task::JoinHandle<()>) {
    let mut app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/v1/sources/{source}/events",
            post(|| async { (StatusCode::ACCEPTED, r#"{"status":"accepted"}"#) }),
        );
    if listing {
        app = app.route(
            "/v1/events",
            get(|| async {
                (
                    [("content-type", "application/json")],
                    r#"{"items":[],"next":null}"#,
                )
            }),
        );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, task)
}

/// Runs `oncebox bench` against `url` off the runtime's threads, which serve the stand-in.
async fn bench(url: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let fixed = [
        "bench",
        "--url",
        url,
        "--events",
        "50",
        "--connections",
        "4",
        "--duplicates",
        "0",
    ];
    let args: Vec<String> = fixed.iter().chain(extra).map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        oncebox(dir.path(), &args)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_accepted_but_not_stored_fail_the_check_by_name() {
    let (url, task) = forgetful(true).await;
    let out = bench(&url, &[]).await;
    let printed = text(&out);
    // 5: refused, the command ran and the answer is no.
    assert_eq!(out.status.code(), Some(5), "{printed}");
    assert!(
        printed.contains("invariant: 50 keys accepted (2xx) but not stored: "),
        "{printed}"
    );
    assert!(!printed.contains("invariant: ok"), "{printed}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_check_prints_the_figures_of_a_server_that_lists_nothing() {
    let (url, task) = forgetful(false).await;
    // Without the flag the missing listing is an error, not a pass.
    let checked = bench(&url, &[]).await;
    assert!(!checked.status.success(), "{}", text(&checked));
    assert!(
        text(&checked).contains("/v1/events for the invariant check: 404"),
        "{}",
        text(&checked)
    );
    let out = bench(&url, &["--no-check"]).await;
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert_eq!(requests(&printed, "new "), 50, "{printed}");
    assert!(printed.contains("status 202: 50"), "{printed}");
    assert!(
        printed.contains("invariant: not checked (--no-check)"),
        "{printed}"
    );
    task.abort();
}
