//! Test support: a gateway on a fresh SQLite file with one source per signature scheme, a
//! manual clock, and helpers to send requests through the router or a real listener.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusHandle;
use oncebox_core::delivery::RetryPolicy;
use oncebox_core::json::{Pointer, Value};
use oncebox_core::route::Route;
use oncebox_core::signature::{Encoding, Scheme, Secret};
use oncebox_core::{FingerprintMode, ManualClock, Source, Timestamp};
use oncebox_gateway::policy::{EventIdRule, GatewayConfig, Limits, OrderGuard, SourcePolicy};
use oncebox_gateway::{Gateway, router};
use oncebox_sqlite::{Inbox, Options};
use tower::ServiceExt;

pub const NOW: Timestamp = Timestamp(1_767_225_600_000);
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const STRIPE_SECRET: &str = "whsec_stripe_test_secret";
pub const GITHUB_SECRET: &str = "It's a Secret to Everybody";
pub const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// One Prometheus recorder for the whole test process (the `metrics` facade is global).
pub fn metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            oncebox_gateway::meter::recorder()
                .install_recorder()
                .expect("install recorder")
        })
        .clone()
}

fn pointer(p: &str) -> Pointer {
    Pointer::parse(p).unwrap()
}

fn policy(scheme: Scheme, secrets: &[&str], event_id: EventIdRule) -> SourcePolicy {
    let secrets = secrets
        .iter()
        .map(|s| Secret::parse(&scheme, s).unwrap())
        .collect();
    SourcePolicy {
        scheme,
        secrets,
        event_id,
        ..SourcePolicy::open()
    }
}

/// Sources: `open` (no signature, default id rule), `shop` (standard webhooks), `stripe`,
/// `github` (raw bytes, the TESTING.md vector), `hmac` (base64 HMAC in `x-signature`),
/// `derived` (id derived from `/order_id` and `/type`), `ordered` (ordering guard), `tiny`
/// (16-byte bodies), `fields` (fingerprint of `/amount` only), `plain` (default id rule, raw
/// fingerprint: bodies need not be JSON).
pub fn config() -> GatewayConfig {
    let mut sources = BTreeMap::new();
    let mut add = |name: &str, p: SourcePolicy| sources.insert(Source::new(name).unwrap(), p);
    add("open", SourcePolicy::open());
    add(
        "shop",
        policy(
            Scheme::StandardWebhooks,
            &[SW_SECRET],
            EventIdRule::Header("webhook-id".into()),
        ),
    );
    add(
        "stripe",
        policy(
            Scheme::Stripe,
            &[STRIPE_SECRET],
            EventIdRule::Pointer(pointer("/id")),
        ),
    );
    let mut github = policy(
        Scheme::Github,
        &[GITHUB_SECRET],
        EventIdRule::Header("x-github-delivery".into()),
    );
    github.fingerprint = FingerprintMode::Raw;
    add("github", github);
    let hmac = Scheme::HmacSha256 {
        header: "x-signature".into(),
        encoding: Encoding::Base64,
        prefix: String::new(),
    };
    add("hmac", policy(hmac, &["hmac-secret"], EventIdRule::Default));
    add(
        "derived",
        SourcePolicy {
            event_id: EventIdRule::Derive(vec![pointer("/order_id"), pointer("/type")]),
            ..SourcePolicy::open()
        },
    );
    add(
        "ordered",
        SourcePolicy {
            order: Some(OrderGuard::new(
                pointer("/data/object/id"),
                pointer("/created"),
            )),
            ..SourcePolicy::open()
        },
    );
    add(
        "tiny",
        SourcePolicy {
            max_body: 16,
            ..SourcePolicy::open()
        },
    );
    add(
        "fields",
        SourcePolicy {
            fingerprint: FingerprintMode::Fields(vec![pointer("/amount")]),
            ..SourcePolicy::open()
        },
    );
    add(
        "plain",
        SourcePolicy {
            fingerprint: FingerprintMode::Raw,
            ..SourcePolicy::open()
        },
    );
    GatewayConfig {
        sources,
        open_sources: false,
        admin_token: Some(ADMIN_TOKEN.into()),
        limits: Limits {
            retry_after: Duration::from_secs(2),
            ..Limits::default()
        },
        routes: Vec::new(),
    }
}

/// A gateway on a fresh database; the tempdir lives as long as the returned value.
pub struct TestGateway {
    pub gateway: Arc<Gateway<Inbox>>,
    pub inbox: Inbox,
    pub clock: ManualClock,
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TestGateway {
    pub fn new() -> TestGateway {
        TestGateway::with(config(), Options::new)
    }

    pub fn with(
        config: GatewayConfig,
        options: impl FnOnce(std::path::PathBuf) -> Options,
    ) -> TestGateway {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.db");
        let clock = ManualClock::new(NOW);
        let inbox = Inbox::open(options(path.clone()).clock(Arc::new(clock.clone()))).unwrap();
        let gateway = Arc::new(Gateway {
            store: inbox.clone(),
            config,
            clock: Arc::new(clock.clone()),
            metrics: Some(metrics()),
            loopback_only: false,
            logouts: Default::default(),
        });
        TestGateway {
            gateway,
            inbox,
            clock,
            path,
            _dir: dir,
        }
    }

    pub fn router(&self) -> Router {
        router(self.gateway.clone())
    }

    /// A gateway without an admin token: its API and dashboard open only behind a loopback
    /// listener ([`TestGateway::send_local`]).
    pub fn tokenless() -> TestGateway {
        let config = GatewayConfig {
            admin_token: None,
            ..config()
        };
        TestGateway::with(config, Options::new)
    }

    /// Sends one request through [`TestGateway::loopback_router`].
    pub async fn send_local(&self, request: Request<Body>) -> Answer {
        Answer::from(self.loopback_router().oneshot(request).await.unwrap()).await
    }

    /// The router of this gateway's store and config behind a loopback-only listener.
    pub fn loopback_router(&self) -> Router {
        router(Arc::new(Gateway {
            store: self.inbox.clone(),
            config: self.gateway.config.clone(),
            clock: self.gateway.clock.clone(),
            metrics: None,
            loopback_only: true,
            logouts: Default::default(),
        }))
    }

    /// Sends one request through the router in-process.
    pub async fn send(&self, request: Request<Body>) -> Answer {
        Answer::from(self.router().oneshot(request).await.unwrap()).await
    }

    /// Serves the router on a real loopback listener until the returned sender is dropped.
    pub async fn listen(
        &self,
        limits: Limits,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = self.router();
        let server = tokio::spawn(async move {
            oncebox_gateway::serve(listener, app, limits, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        (addr, stop, server)
    }

    /// Committed inbox rows.
    pub fn rows(&self) -> i64 {
        self.inbox
            .read_blocking(|c| c.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0)))
            .unwrap()
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub async fn from(res: axum::response::Response) -> Answer {
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem slug (`type` ends with it).
    pub fn slug(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{self:?}"
        );
        self.json()["type"]
            .as_str()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

/// `POST /v1/sources/{source}/events` with headers.
/// An event for the `ordered` source's guard: entity `pi_1` at version `created`.
pub fn ordered_event(id: &str, created: i64) -> String {
    format!(r#"{{"id":"{id}","created":{created},"data":{{"object":{{"id":"pi_1"}}}}}}"#)
}

pub fn post(source: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Request<Body> {
    let mut r = Request::post(format!("/v1/sources/{source}/events"))
        .header("content-type", "application/json");
    for (n, v) in headers {
        r = r.header(*n, *v);
    }
    r.body(body.into()).unwrap()
}

/// `GET path` addressed to the gateway by its loopback address.
pub fn local_get(path: &str) -> Request<Body> {
    Request::get(path)
        .header("host", "127.0.0.1:8080")
        .body(Body::empty())
        .unwrap()
}

/// `GET` with the admin token.
pub fn admin_get(path: &str) -> Request<Body> {
    Request::get(path)
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::empty())
        .unwrap()
}

/// `POST` with the admin token and `body`.
pub fn admin_post(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// A route taking every event of `open` (those whose `filter` pointer holds the value, if
/// given), idempotent, to a port nothing listens on.
pub fn route(name: &str, filter: Option<(&str, &str)>) -> Route {
    Route {
        name: name.to_owned(),
        sources: vec![Source::new("open").unwrap()],
        filter: filter.map(|(p, v)| (Pointer::parse(p).unwrap(), Value::String(v.to_owned()))),
        url: "http://127.0.0.1:9/hooks".to_owned(),
        timeout: Duration::from_secs(5),
        signing_secret: None,
        idempotent: true,
        status_url: None,
        retry: RetryPolicy::default(),
        concurrency: 4,
        rate: None,
        ca_pem: None,
    }
}
