//! The relay inside `oncebox serve`: accepted events reach a real receiver (never through the
//! environment's proxy), an uncertain delivery is settled through the CLI, and a delivery owed
//! across a restart is not lost.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use tokio::sync::Notify;

use crate::support::{Server, oncebox, serve, serve_by};

/// A receiver that counts requests per idempotency key; `hang` makes it never answer.
#[derive(Default)]
struct Receiver {
    hits: Mutex<HashMap<String, u32>>,
    arrived: Notify,
    hang: bool,
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap) -> &'static str {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    *r.hits.lock().unwrap().entry(key).or_insert(0) += 1;
    r.arrived.notify_one();
    if r.hang {
        std::future::pending::<()>().await;
    }
    "ok"
}

async fn receiver(hang: bool, addr: SocketAddr) -> Arc<Receiver> {
    let r = Arc::new(Receiver {
        hang,
        ..Receiver::default()
    });
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    r
}

fn config(receiver: SocketAddr, idempotent: bool) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
[sources.shop]
signature = "none"
[routes.hooks]
sources = ["shop"]
url = "http://{receiver}/hook"
idempotent = {idempotent}
timeout = "1s"
backoff = {{ base = "100ms", cap = "200ms" }}
[relay]
lease = "2s"
poll = "50ms"
"#
    )
}

async fn post(server: &Server, id: &str) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sources/shop/events", server.1))
        .header("content-type", "application/json")
        .body(format!(r#"{{"id":"{id}"}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

fn deliveries(dir: &Path, state: &str) -> Vec<serde_json::Value> {
    let out = oncebox(
        dir,
        &["deliveries", "list", "--state", state, "--output", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["items"].as_array().unwrap().clone()
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn arrived(r: &Receiver) {
    tokio::time::timeout(Duration::from_secs(20), r.arrived.notified())
        .await
        .expect("the relay delivered to the receiver");
}

#[test]
fn serve_delivers_accepted_events_to_the_route() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_port();
        let r = receiver(false, addr).await;
        std::fs::write(dir.path().join("oncebox.toml"), config(addr, true)).unwrap();
        let server = serve(dir.path());
        post(&server, "evt_1").await;
        arrived(&r).await;
        server.stop();
        assert_eq!(r.hits.lock().unwrap().get("shop:evt_1"), Some(&1));
        assert_eq!(deliveries(dir.path(), "delivered").len(), 1);
    });
}

/// The environment's proxy settings (set for something else, a package install in the image) are
/// not used for deliveries: a proxy would see every signed body, and a filtering one's own
/// `200` would be recorded as delivered while the receiver saw nothing. The stand-in proxy
/// here answers `200` to whatever reaches it.
#[test]
fn the_environments_proxy_is_not_used_for_deliveries() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_port();
        let r = receiver(false, addr).await;
        let proxy_addr = free_port();
        let proxy = receiver(false, proxy_addr).await;
        std::fs::write(dir.path().join("oncebox.toml"), config(addr, true)).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"));
        for var in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
            command.env(var, format!("http://{proxy_addr}"));
        }
        command.env_remove("NO_PROXY").env_remove("no_proxy");
        let server = serve_by(command, dir.path(), &[]);
        post(&server, "evt_1").await;
        arrived(&r).await;
        server.stop();
        assert_eq!(r.hits.lock().unwrap().get("shop:evt_1"), Some(&1));
        assert!(proxy.hits.lock().unwrap().is_empty(), "the proxy was used");
    });
}

#[test]
fn uncertain_delivery_is_resolved_through_the_cli() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_port();
        // Accepts the request and never answers: the outcome is unknown.
        let r = receiver(true, addr).await;
        std::fs::write(dir.path().join("oncebox.toml"), config(addr, false)).unwrap();
        let server = serve(dir.path());
        post(&server, "evt_u").await;
        arrived(&r).await;
        // The route timeout (1 s) ends the attempt as uncertain; the graceful stop waits for it.
        server.stop();
        let uncertain = deliveries(dir.path(), "uncertain");
        assert_eq!(uncertain.len(), 1, "a plain route is not retried blindly");
        let id = uncertain[0]["id"].to_string();
        let out = oncebox(
            dir.path(),
            &[
                "deliveries",
                "resolve",
                &id,
                "--delivered",
                "--note",
                "confirmed",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(deliveries(dir.path(), "delivered").len(), 1);
        let again = oncebox(dir.path(), &["deliveries", "resolve", &id, "--dead"]);
        assert_eq!(
            again.status.code(),
            Some(5),
            "a delivered delivery is not resolved again"
        );
        assert_eq!(r.hits.lock().unwrap().get("shop:evt_u"), Some(&1));
    });
}

#[test]
fn a_delivery_owed_across_a_restart_is_delivered_after_it() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_port(); // nobody listens yet: connections are refused
        std::fs::write(dir.path().join("oncebox.toml"), config(addr, true)).unwrap();
        let server = serve(dir.path());
        post(&server, "evt_r").await;
        server.kill();
        let owed = [
            deliveries(dir.path(), "pending"),
            deliveries(dir.path(), "retrying"),
            deliveries(dir.path(), "in_flight"),
        ]
        .concat();
        assert_eq!(owed.len(), 1, "still owed after the crash");
        let r = receiver(false, addr).await;
        let server = serve(dir.path());
        arrived(&r).await;
        server.stop();
        assert_eq!(deliveries(dir.path(), "delivered").len(), 1);
        assert_eq!(r.hits.lock().unwrap().get("shop:evt_r"), Some(&1));
    });
}
