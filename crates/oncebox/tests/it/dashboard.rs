//! The dashboard in headless Chromium against a real `oncebox serve` with its relay and a real
//! receiver: log in, watch an event arrive, open it, retry a dead delivery until it is
//! delivered, settle an uncertain one, and see a payload's `<script>` shown as text, never run.
//! Screenshots go to `target/dashboard-screenshots/`. Needs Debian's `chromium` and
//! `chromium-driver`; skips without them unless `ONCEBOX_REQUIRE_SERVICES=1`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::{Server, serve};

const TOKEN: &str = "dashboard-test-token-0123456789";
/// Every wait for something the page or the relay does ends by this deadline, not a sleep.
const DEADLINE: Duration = Duration::from_secs(30);
const XSS: &str = r#"{"id":"xss-1","note":"<script>window.__pwned=1;document.title='pwned'</script><img src=x onerror=\"window.__pwned=2\">"}"#;

/// The receiver: `shop:dead-1` is refused (400, so dead) until `fixed`; `shop:unc-1` never
/// answers (so uncertain); everything else is accepted.
#[derive(Default)]
struct Receiver {
    fixed: AtomicBool,
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap) -> StatusCode {
    match headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        Some("shop:dead-1") if !r.fixed.load(Ordering::SeqCst) => StatusCode::BAD_REQUEST,
        Some("shop:unc-1") => std::future::pending().await,
        _ => StatusCode::OK,
    }
}

async fn receiver() -> (SocketAddr, Arc<Receiver>) {
    let r = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, r)
}

fn config(receiver: SocketAddr) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
admin_token = "{TOKEN}"
[sources.shop]
signature = "none"
[routes.hooks]
sources = ["shop"]
url = "http://{receiver}/hook"
idempotent = false
timeout = "1s"
max_attempts = 1
[relay]
lease = "5s"
poll = "50ms"
"#
    )
}

/// chromedriver on a free port, stopped when dropped.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn driver(program: &Path) -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(program)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver(child, port);
    let status = format!("http://127.0.0.1:{port}/status");
    let until = Instant::now() + DEADLINE;
    loop {
        if let Ok(r) = reqwest::get(&status).await
            && r.status().is_success()
        {
            return driver;
        }
        assert!(Instant::now() < until, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn browser(driver: &Driver, chromium: &Path, profile: &Path) -> Client {
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect::<Vec<_>>();
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": chromium, "args": args },
    });
    let serde_json::Value::Object(caps) = caps else {
        unreachable!()
    };
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.1))
        .await
        .expect("start a chromium session")
}

/// Screenshots live next to the build's other outputs: `target/dashboard-screenshots/`.
fn screenshots() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_oncebox"));
    let target = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

async fn ingest(server: &Server, body: &str) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sources/shop/events", server.1))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

async fn admin(server: &Server, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}{path}", server.1))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The state of `event_id`'s only delivery, once it is `want`; polled until the deadline.
async fn delivery_reaches(server: &Server, event_id: &str, want: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        let event = admin(server, &format!("/v1/sources/shop/events/{event_id}")).await;
        if event["deliveries"][0]["state"] == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "{event_id} never became {want}: {event}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for(c: &Client, css: &str) -> fantoccini::elements::Element {
    match c
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e,
        Err(e) => {
            // What the page showed instead is the first thing to look at.
            shot(c, "failed").await;
            let source = c.source().await.unwrap_or_default();
            panic!("{css} never appeared: {e}\n{source}")
        }
    }
}

/// The queue page reloaded after an action and has nothing left.
async fn queue_empties(c: &Client) {
    c.wait()
        .at_most(DEADLINE)
        .for_element(Locator::XPath("//p[text()='Nothing here.']"))
        .await
        .expect("the queue empties");
}

#[test]
fn operator_logs_in_follows_events_and_settles_deliveries_in_chromium() {
    let (Some(chromedriver), Some(chromium)) = (
        oncebox_testkit::require_program("/usr/bin/chromedriver"),
        oncebox_testkit::require_program("/usr/bin/chromium"),
    ) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(180), scenario(&chromedriver, &chromium))
            .await
            .expect("the dashboard scenario took over 180 s");
    });
}

async fn scenario(chromedriver: &Path, chromium: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let (addr, receiver) = receiver().await;
    std::fs::write(dir.path().join("oncebox.toml"), config(addr)).unwrap();
    let server = serve(dir.path());
    ingest(&server, r#"{"id":"dead-1"}"#).await;
    ingest(&server, r#"{"id":"unc-1"}"#).await;
    delivery_reaches(&server, "dead-1", "dead").await;
    delivery_reaches(&server, "unc-1", "uncertain").await;

    let driver = driver(chromedriver).await;
    let profile = tempfile::tempdir().unwrap();
    let c = browser(&driver, chromium, profile.path()).await;
    let base = &server.1;

    // Log in.
    c.goto(&format!("{base}/")).await.unwrap();
    wait_for(&c, "input#token")
        .await
        .send_keys(TOKEN)
        .await
        .unwrap();
    shot(&c, "01-login").await;
    c.find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(&c, "#counters").await;
    wait_for(&c, "#chart rect").await;
    shot(&c, "02-overview").await;

    // An event arrives while the list is open, and opens. Before the list opens, `late-1` is
    // taken out of the table, to come back under its own lower number once the list is open:
    // as on PostgreSQL, where a number is taken before its transaction commits.
    ingest(&server, r#"{"id":"late-1"}"#).await;
    ingest(&server, r#"{"id":"before-1"}"#).await;
    let db = oncebox_sqlite::rusqlite::Connection::open(dir.path().join("oncebox.db")).unwrap();
    db.busy_timeout(DEADLINE).unwrap();
    db.execute_batch(
        "CREATE TABLE held AS SELECT * FROM oncebox_inbox WHERE event_id = 'late-1';
         DELETE FROM oncebox_inbox WHERE event_id = 'late-1';",
    )
    .unwrap();
    c.goto(&format!("{base}/events")).await.unwrap();
    wait_for(&c, "tbody#events[data-live]").await;
    db.execute_batch("INSERT INTO oncebox_inbox SELECT * FROM held")
        .unwrap();
    ingest(&server, r#"{"id":"live-1","amount":5}"#).await;
    c.wait()
        .at_most(DEADLINE)
        .for_element(Locator::XPath(
            "//a[@class='event-link' and text()='live-1']",
        ))
        .await
        .expect("the new event appears in the open list");
    wait_for(&c, "tr.arrived a[href='/events/shop/late-1']").await;
    // The poll that listed `live-1` looked back over `before-1` and `late-1`, and the next
    // ones will again: each is still listed once.
    ingest(&server, r#"{"id":"live-2"}"#).await;
    wait_for(&c, "a[href='/events/shop/live-2']").await;
    for id in ["before-1", "late-1", "live-1", "live-2"] {
        let rows = c
            .find_all(Locator::Css(&format!("a[href='/events/shop/{id}']")))
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{id} listed once");
    }
    // An id that is a dot-segment links to its own page, live and as served: a browser
    // resolves `/events/shop/..`, and `/events/shop/%2E%2E` too, to `/events/`.
    ingest(&server, r#"{"id":".."}"#).await;
    let live = wait_for(&c, "tr.arrived a.event-link[href*='id=..']").await;
    let resolved = format!("{base}/event?source=shop&id=..");
    assert_eq!(
        live.prop("href").await.unwrap().as_deref(),
        Some(&*resolved)
    );
    shot(&c, "03-event-arrived").await;
    c.goto(&format!("{base}/events")).await.unwrap();
    let served = wait_for(&c, "a.event-link[href*='id=..']").await;
    assert_eq!(
        served.prop("href").await.unwrap().as_deref(),
        Some(&*resolved)
    );
    served.click().await.unwrap();
    let shown = wait_for(&c, "#event-id").await.text().await.unwrap();
    assert_eq!(shown, "..");
    c.goto(&format!("{base}/events")).await.unwrap();
    let link = wait_for(&c, "a.event-link[href='/events/shop/live-1']").await;
    link.click().await.unwrap();
    wait_for(&c, "section.delivery[data-state='delivered']").await;
    let id = c
        .find(Locator::Css("#event-id"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(id, "live-1");
    shot(&c, "04-event").await;

    // Retry the dead delivery, now that the receiver takes it, and see it delivered.
    receiver.fixed.store(true, Ordering::SeqCst);
    c.goto(&format!("{base}/deliveries/dead")).await.unwrap();
    shot(&c, "05-dead-queue").await;
    wait_for(&c, "button[data-action='retry']")
        .await
        .click()
        .await
        .unwrap();
    queue_empties(&c).await;
    c.goto(&format!("{base}/events/shop/dead-1")).await.unwrap();
    wait_for(&c, "section.delivery[data-state='delivered']").await;
    shot(&c, "06-retried-delivered").await;
    delivery_reaches(&server, "dead-1", "delivered").await;

    // Settle the uncertain one by hand.
    c.goto(&format!("{base}/deliveries/uncertain"))
        .await
        .unwrap();
    shot(&c, "07-uncertain-queue").await;
    wait_for(&c, "button[data-action='delivered']")
        .await
        .click()
        .await
        .unwrap();
    queue_empties(&c).await;
    delivery_reaches(&server, "unc-1", "delivered").await;

    // A payload's markup is text: shown, never run.
    ingest(&server, XSS).await;
    c.goto(&format!("{base}/events/shop/xss-1")).await.unwrap();
    let payload = wait_for(&c, "#payload").await.text().await.unwrap();
    assert!(payload.contains("<script>window.__pwned=1"), "{payload}");
    let ran = c
        .execute("return [document.title, typeof window.__pwned];", vec![])
        .await
        .unwrap();
    assert_eq!(ran, json!(["Event shop:xss-1 · oncebox", "undefined"]));
    shot(&c, "08-script-as-text").await;

    c.close().await.unwrap();
    drop(driver);
    server.stop();
}
