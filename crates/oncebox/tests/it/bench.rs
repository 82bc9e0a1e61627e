//! `oncebox bench` end to end: its invariant check passes against a real gateway, names the
//! keys a gateway accepted and did not store, and is skipped on request for another server; the
//! open loop (`--rate`) reports its percentiles and rates, and a p99 over `--p99-max` is refused.

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

/// `oncebox bench --url <a fresh gateway> args…`: its output and all it printed.
fn against_a_gateway(args: &[&str]) -> (std::process::Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_with(dir.path(), &["--listen", "127.0.0.1:0"]);
    let mut all = vec!["bench", "--url", server.1.as_str()];
    all.extend_from_slice(args);
    let out = oncebox(dir.path(), &all);
    server.stop();
    let printed = text(&out);
    (out, printed)
}

/// Every new key the run counted was listed back from the gateway, once.
fn assert_every_new_key_stored_once(printed: &str) {
    let new = requests(printed, "new ");
    assert!(
        printed.contains(&format!("invariant: ok ({new} keys)")),
        "{printed}"
    );
}

#[test]
fn against_a_real_gateway_every_accepted_key_is_stored_once() {
    let (out, printed) = against_a_gateway(&[
        "--events",
        "600",
        "--connections",
        "8",
        "--duplicates",
        "0.2",
    ]);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("status 202: 600"), "{printed}");
    let (new, duplicates) = (
        requests(&printed, "new "),
        requests(&printed, "duplicates "),
    );
    assert_eq!(new + duplicates, 600, "{printed}");
    assert!(duplicates > 0, "the run resent some ids: {printed}");
    assert_every_new_key_stored_once(&printed);
}

/// The open loop against a real gateway: every percentile, the rate asked and achieved, the
/// late starts, and the invariant check as in the closed loop.
#[test]
fn the_open_loop_reports_percentiles_and_rates_and_checks_the_invariant() {
    let (out, printed) =
        against_a_gateway(&["--rate", "1000", "--events", "300", "--connections", "8"]);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("open loop at 1000 req/s"), "{printed}");
    for column in ["p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"] {
        assert!(printed.contains(column), "{column} in {printed}");
    }
    // Five latencies after the count and the rate; how large they are is the machine's.
    let all = printed.lines().find(|l| l.starts_with("all ")).unwrap();
    assert_eq!(all.split_whitespace().count(), 8, "{printed}");
    let achieved: f64 = printed
        .lines()
        .find_map(|l| l.strip_prefix("rate asked 1000 req/s, achieved "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no achieved rate in {printed}"));
    assert!(achieved > 0.0, "{printed}");
    assert!(printed.contains("late starts "), "{printed}");
    assert!(printed.contains("status 202: 300"), "{printed}");
    assert_every_new_key_stored_once(&printed);
}

/// No request is answered within a nanosecond: the budget is broken, the p99 is named, the
/// exit code is 5, and the invariant is still checked.
#[test]
fn a_p99_above_the_budget_exits_5_and_names_the_p99() {
    let (out, printed) = against_a_gateway(&[
        "--rate",
        "1000",
        "--events",
        "100",
        "--connections",
        "4",
        "--p99-max",
        "1ns",
    ]);
    assert_eq!(out.status.code(), Some(5), "{printed}");
    assert!(printed.contains("budget: p99 "), "{printed}");
    assert!(printed.contains("is above --p99-max 1ns"), "{printed}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error: p99 latency "),
        "{printed}"
    );
    assert!(printed.contains("invariant: ok ("), "{printed}");
}

/// A run that measured only refusals (every request `404 unknown-source`: a gateway with
/// sources of its own, and the fresh one bench names) is a failed run, not a pass whose
/// invariant held of no key.
#[test]
fn a_run_the_gateway_refused_entirely_exits_5() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("oncebox.toml"),
        "[sources.shop]\nsignature = \"none\"\n",
    )
    .unwrap();
    let server = serve_with(dir.path(), &["--listen", "127.0.0.1:0"]);
    let elsewhere = tempfile::tempdir().unwrap();
    let args = ["bench", "--url", server.1.as_str(), "--events", "20"];
    let out = oncebox(elsewhere.path(), &args);
    server.stop();
    let printed = text(&out);
    assert!(printed.contains("status 404: 20"), "{printed}");
    assert_eq!(out.status.code(), Some(5), "{printed}");
    assert!(
        printed.contains("no request was accepted (2xx)"),
        "{printed}"
    );
}

/// Rates whose schedule cannot be computed, budgets that are not durations and connection
/// counts no machine could open are refused before anything is sent (no gateway listens at the
/// URL), naming the flag.
#[test]
fn bad_rates_and_budgets_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--rate", "0"),
        ("--rate", "-5"),
        ("--rate", "NaN"),
        ("--rate", "inf"),
        ("--rate", "1e300"),
        ("--rate", "1e-300"),
        ("--rate", "fast"),
        ("--p99-max", "soon"),
        ("--p99-max", "-1s"),
        ("--p99-max", "10"),
        ("--connections", "0"),
        ("--connections", "2000000"),
    ] {
        let out = oncebox(
            dir.path(),
            &["bench", "--url", "http://127.0.0.1:9", flag, value],
        );
        let printed = text(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {printed}");
        assert!(printed.contains(flag), "{flag} {value}: {printed}");
        assert!(!printed.contains("is `oncebox serve` running"), "{printed}");
    }
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
    stand_in(app).await
}

/// A stand-in that takes at least `SLOW` to answer each event and stores nothing.
async fn slow() -> (String, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/v1/sources/{source}/events",
            post(|| async {
                // A floor on each answer's time, not a barrier: the test asserts only the lower
                // bounds this floor implies, which no slow machine can break.
                tokio::time::sleep(SLOW).await;
                (StatusCode::ACCEPTED, r#"{"status":"accepted"}"#)
            }),
        );
    stand_in(app).await
}

/// Serves `app` on a free loopback port: its base URL and the serving task.
async fn stand_in(app: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, task)
}

/// The least time [`slow`] takes to answer.
const SLOW: std::time::Duration = std::time::Duration::from_millis(5);

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

/// 50 requests due within 50 µs on 4 connections to a gateway that takes at least 5 ms each:
/// all but the first 4 fall due while every connection is busy, and the last waits for 12
/// answers before its own, a wait its latency includes because it runs from the due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_due_while_every_connection_is_busy_starts_late_and_its_wait_counts() {
    let (url, task) = slow().await;
    let out = bench(&url, &["--rate", "1000000", "--no-check"]).await;
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    let late: usize = printed
        .lines()
        .find_map(|l| l.strip_prefix("late starts ")?.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no late starts in {printed}"));
    // A pacer descheduled past the first answers (a loaded machine) finds connections free
    // again: those requests are still late, counted as the generator's own lag.
    let lagged: usize = printed
        .lines()
        .filter(|l| l.contains("more started that late"))
        .find_map(|l| l.strip_prefix("note: ")?.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((46..=50).contains(&(late + lagged)), "{printed}");
    let max_ms: f64 = printed
        .lines()
        .find(|l| l.starts_with("all "))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no max latency in {printed}"));
    // The 50th request is the 4th of its connection's 13th: 13 answers of at least 5 ms each
    // end after it fell due (all fell due within the first 50 µs).
    let floor = 13.0 * SLOW.as_secs_f64() * 1000.0 - 0.05;
    assert!(
        max_ms >= floor,
        "max {max_ms} ms below {floor} ms: {printed}"
    );
    task.abort();
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
    // Credentials in `--url` stay out of the message.
    let with_user = url.replacen("http://", "http://user:tok3n@", 1);
    let said = text(&bench(&with_user, &[]).await);
    assert!(said.contains("GET http://***@127.0.0.1:"), "{said}");
    assert!(!said.contains("tok3n") && !said.contains("user:"), "{said}");
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
