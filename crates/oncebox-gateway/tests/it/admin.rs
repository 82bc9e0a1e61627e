//! The admin API, health endpoints and metrics through the router.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_testkit::run;

use crate::support::{TestGateway, admin_get, post};

#[test]
fn admin_endpoints_need_the_token() {
    run(async {
        let gw = TestGateway::new();
        for path in [
            "/v1/events",
            "/v1/stats",
            "/metrics",
            "/v1/sources/open/events/e1",
        ] {
            let a = gw
                .send(Request::get(path).body(Body::empty()).unwrap())
                .await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{path}"
            );
            assert_eq!(a.headers["www-authenticate"], r#"Bearer realm="oncebox""#);
            let wrong = Request::get(path)
                .header("authorization", "Bearer wrong-token-0123456")
                .body(Body::empty())
                .unwrap();
            assert_eq!(
                gw.send(wrong).await.status,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
            // The scheme's name is case-insensitive; the token itself is not, nor may it be
            // a prefix or carry anything more.
            let token = crate::support::ADMIN_TOKEN;
            for (value, ok) in [
                (format!("bearer {token}"), true),
                (format!("BEARER  {token}"), true),
                (format!("Bearer {}", token.to_uppercase()), false),
                (format!("Bearer {}", &token[..token.len() - 1]), false),
                (format!("Bearer {token}x"), false),
                (format!("Basic {token}"), false),
                (format!("Bearer{token}"), false),
                ("Bearer ".to_owned(), false),
            ] {
                let req = Request::get(path)
                    .header("authorization", value.as_str())
                    .body(Body::empty())
                    .unwrap();
                let a = gw.send(req).await;
                // Past the guard the event may be unknown (404): only a 401 is a refusal.
                let passed = a.status != StatusCode::UNAUTHORIZED;
                assert_eq!(passed, ok, "{path} {value:?}: {a:?}");
            }
        }
    });
}

#[test]
fn events_are_listed_in_arrival_order_with_a_cursor() {
    run(async {
        let gw = TestGateway::new();
        for i in 0..5 {
            gw.send(post("open", &[], format!(r#"{{"id":"e{i}"}}"#)))
                .await;
        }
        gw.send(post("derived", &[], r#"{"order_id":"1","type":"t"}"#))
            .await;
        let page = gw
            .send(admin_get("/v1/events?source=open&limit=3"))
            .await
            .json();
        let ids: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["e0", "e1", "e2"]);
        let next = page["next"].as_str().unwrap();
        let rest = gw
            .send(admin_get(&format!("/v1/events?source=open&after={next}")))
            .await
            .json();
        let ids: Vec<&str> = rest["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["e3", "e4"]);
        assert!(rest["next"].is_null());
        let all = gw.send(admin_get("/v1/events")).await.json();
        assert_eq!(all["items"].as_array().unwrap().len(), 6);
        // Payloads and headers are kept out of every cache, the browser's too.
        for path in ["/v1/events", "/v1/sources/open/events/e0", "/v1/stats"] {
            let answer = gw.send(admin_get(path)).await;
            assert_eq!(answer.headers["cache-control"], "no-store", "{path}");
        }
    });
}

#[test]
fn stats_and_metrics_count_outcomes_per_source() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post("fields", &[], r#"{"id":"m1","amount":1}"#))
            .await;
        gw.send(post("fields", &[], r#"{"id":"m1","amount":1}"#))
            .await;
        gw.send(post("fields", &[], r#"{"id":"m1","amount":2}"#))
            .await;
        gw.send(post("fields", &[], r#"{"amount":2}"#)).await;
        let stats = gw.send(admin_get("/v1/stats")).await.json();
        assert_eq!(stats["events"]["completed"], 1);
        // Every state is named, those with none as 0: a script's `.events.uncertain == 0`
        // must not read `null`.
        for state in ["processing", "uncertain", "rejected", "stale"] {
            assert_eq!(stats["events"][state], 0, "{state}: {stats}");
        }
        assert_eq!(stats["conflicts"], 1);
        let text = String::from_utf8(gw.send(admin_get("/metrics")).await.body).unwrap();
        for outcome in ["accepted", "duplicate", "conflict", "invalid"] {
            let line = format!(r#"oncebox_ingest_total{{source="fields",outcome="{outcome}"}}"#);
            assert!(
                text.lines().any(|l| l.starts_with(&line)),
                "{line} missing in:\n{text}"
            );
        }
        assert!(text.contains("oncebox_ingest_duration_seconds"), "{text}");
    });
}

/// Exact counts per outcome and one duration sample per request, for a source no other test
/// uses (the recorder is shared by the whole test process), with the recorder's upkeep folding
/// samples in between requests as `oncebox serve` does on a timer; an unknown source name is
/// counted under `_unknown`, never under the name the sender chose, nor under a source that is
/// named `unknown`.
#[test]
fn metrics_count_each_request_once_across_upkeep() {
    run(async {
        let mut config = crate::support::config();
        for name in ["metered", "unknown"] {
            config.sources.insert(
                oncebox_core::Source::new(name).unwrap(),
                oncebox_gateway::policy::SourcePolicy::open(),
            );
        }
        let gw = TestGateway::with(config, oncebox_sqlite::Options::new);
        let handle = gw.gateway.metrics.clone().unwrap();
        let sends = [
            r#"{"id":"k1","amount":1}"#,
            r#"{"id":"k2","amount":1}"#,
            r#"{"id":"k1","amount":1}"#,
            r#"{"id":"k1","amount":2}"#,
            r#"{"amount":2}"#,
            r#"{"id":"k3","amount":1}"#,
        ];
        for (i, body) in sends.into_iter().enumerate() {
            gw.send(post("metered", &[], body)).await;
            if i % 2 == 1 {
                handle.run_upkeep();
            }
        }
        gw.send(post("no-such-source-metered", &[], r#"{"id":"k1"}"#))
            .await;
        let text = String::from_utf8(gw.send(admin_get("/metrics")).await.body).unwrap();
        let value = |prefix: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(prefix)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{prefix} missing in:\n{text}"))
        };
        for (outcome, n) in [
            ("accepted", 3.0),
            ("duplicate", 1.0),
            ("conflict", 1.0),
            ("invalid", 1.0),
        ] {
            let line = format!(r#"oncebox_ingest_total{{source="metered",outcome="{outcome}"}}"#);
            assert_eq!(value(&line), n, "{line}");
        }
        assert_eq!(
            value(r#"oncebox_ingest_duration_seconds_count{source="metered"}"#),
            6.0
        );
        // A histogram, not a summary: buckets add up across gateways.
        assert_eq!(
            value(r#"oncebox_ingest_duration_seconds_bucket{source="metered",le="10"}"#),
            6.0
        );
        assert_eq!(
            value(r#"oncebox_ingest_duration_seconds_bucket{source="metered",le="+Inf"}"#),
            6.0
        );
        assert!(value(r#"oncebox_ingest_total{source="_unknown",outcome="invalid"}"#) >= 1.0);
        assert!(!text.contains(r#"source="unknown""#), "{text}");
        assert!(!text.contains("no-such-source-metered"), "{text}");
    });
}

/// The outcomes the test above cannot reach on an open source: stale (an ordering guard),
/// unauthorized (a signature) and unavailable (the store's write lock held elsewhere), each
/// counted once under a source no other test uses.
#[test]
fn metrics_count_stale_unauthorized_and_unavailable() {
    run(async {
        use oncebox_core::signature::{Encoding, Scheme};
        use oncebox_gateway::policy::SourcePolicy;
        let mut config = crate::support::config();
        let ordered = config.sources[&oncebox_core::Source::new("ordered").unwrap()].clone();
        let hmac = Scheme::HmacSha256 {
            header: "x-signature".into(),
            encoding: Encoding::Hex,
            prefix: String::new(),
        };
        let signed = SourcePolicy {
            secrets: vec![oncebox_core::signature::Secret::parse(&hmac, "s3cret").unwrap()],
            scheme: hmac,
            ..SourcePolicy::open()
        };
        for (name, policy) in [("gauged", ordered), ("gauged-signed", signed)] {
            config
                .sources
                .insert(oncebox_core::Source::new(name).unwrap(), policy);
        }
        let gw = TestGateway::with(config, |p| {
            oncebox_sqlite::Options::new(p).busy_timeout(std::time::Duration::from_millis(50))
        });
        let ev = crate::support::ordered_event;
        assert_eq!(
            gw.send(post("gauged", &[], ev("new", 20))).await.status,
            StatusCode::ACCEPTED
        );
        let late = gw.send(post("gauged", &[], ev("old", 10))).await;
        assert_eq!(late.json()["stale"], true, "{late:?}");
        let forged = gw
            .send(post(
                "gauged-signed",
                &[("x-signature", "00")],
                r#"{"id":"f"}"#,
            ))
            .await;
        assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{forged:?}");
        let lock = oncebox_sqlite::rusqlite::Connection::open(&gw.path).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let locked = gw.send(post("gauged", &[], ev("locked", 30))).await;
        assert_eq!(locked.status, StatusCode::SERVICE_UNAVAILABLE, "{locked:?}");
        drop(lock);

        let text = String::from_utf8(gw.send(admin_get("/metrics")).await.body).unwrap();
        for (source, outcome) in [
            ("gauged", "accepted"),
            ("gauged", "stale"),
            ("gauged", "unavailable"),
            ("gauged-signed", "unauthorized"),
        ] {
            let line =
                format!(r#"oncebox_ingest_total{{source="{source}",outcome="{outcome}"}} 1"#);
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
    });
}

/// An event id no key can have is 400 `invalid-key` on the admin API; a gateway without a
/// metrics recorder answers `/metrics` with 404 `metrics-disabled`.
#[test]
fn admin_refusals_carry_their_slugs() {
    run(async {
        let gw = TestGateway::new();
        let long = "x".repeat(300);
        for path in [
            format!("/v1/sources/open/events/{long}"),
            "/v1/sources/open/events/%01".to_owned(),
        ] {
            let a = gw.send(admin_get(&path)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "invalid-key"),
                "{path}: {a:?}"
            );
        }
        let unmetered = std::sync::Arc::new(oncebox_gateway::Gateway {
            store: gw.inbox.clone(),
            config: crate::support::config(),
            clock: std::sync::Arc::new(gw.clock.clone()),
            metrics: None,
            loopback_only: false,
            logouts: Default::default(),
        });
        let res =
            tower::ServiceExt::oneshot(oncebox_gateway::router(unmetered), admin_get("/metrics"))
                .await
                .unwrap();
        let a = crate::support::Answer::from(res).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::NOT_FOUND, "metrics-disabled"),
            "{a:?}"
        );
    });
}

#[test]
fn health_and_readiness_are_open() {
    run(async {
        let gw = TestGateway::new();
        for path in ["/healthz", "/readyz", "/openapi.json"] {
            let a = gw
                .send(Request::get(path).body(Body::empty()).unwrap())
                .await;
            assert_eq!(a.status, StatusCode::OK, "{path}");
        }
    });
}

#[test]
fn without_a_token_the_admin_api_answers_only_on_a_loopback_listener() {
    run(async {
        let gw = TestGateway::tokenless();
        let get = || Request::get("/v1/stats").body(Body::empty()).unwrap();
        let off = gw.send(get()).await;
        assert_eq!(
            (off.status, off.slug().as_str()),
            (StatusCode::FORBIDDEN, "admin-disabled"),
            "bound to a network address"
        );
        // No token can open it either.
        let with_one = Request::get("/v1/stats")
            .header("authorization", "Bearer anything-at-all")
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.send(with_one).await.status, StatusCode::FORBIDDEN);
        let local = gw.loopback_router();
        let a = crate::support::Answer::from(
            tower::ServiceExt::oneshot(local.clone(), get())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");

        // Open, but not to web pages: a page of another site rebound to 127.0.0.1 sends its own
        // name as Host, and a cross-site POST its own Origin.
        let ask = |request: Request<Body>| {
            let local = local.clone();
            async move {
                crate::support::Answer::from(
                    tower::ServiceExt::oneshot(local, request).await.unwrap(),
                )
                .await
            }
        };
        for host in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:8080",
            "app.localhost",
        ] {
            let request = Request::get("/v1/stats")
                .header("host", host)
                .body(Body::empty())
                .unwrap();
            assert_eq!(ask(request).await.status, StatusCode::OK, "{host}");
        }
        for host in [
            "rebind.evil.example:8080",
            "127.0.0.1.evil.example",
            "10.0.0.1",
        ] {
            let request = Request::get("/v1/stats")
                .header("host", host)
                .body(Body::empty())
                .unwrap();
            let a = ask(request).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::FORBIDDEN, "host-not-loopback"),
                "{host}"
            );
        }
        // The dashboard's pages too.
        for (host, status) in [
            ("127.0.0.1:8080", StatusCode::OK),
            ("rebind.evil.example:8080", StatusCode::FORBIDDEN),
        ] {
            let page = Request::get("/")
                .header("host", host)
                .body(Body::empty())
                .unwrap();
            assert_eq!(ask(page).await.status, status, "the overview for {host}");
        }
        let resolve = |origin: Option<&str>| {
            let mut r = Request::post("/v1/deliveries/1/resolve")
                .header("host", "127.0.0.1:8080")
                .header("content-type", "text/plain");
            if let Some(origin) = origin {
                r = r.header("origin", origin);
            }
            r.body(Body::from(r#"{"outcome":"delivered","note":"csrf"}"#))
                .unwrap()
        };
        let a = ask(resolve(Some("http://evil.example"))).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::FORBIDDEN, "cross-origin"),
            "{a:?}"
        );
        // The gateway's own pages, and clients that are no browser, still may (no such
        // delivery here: the 404 is the handler's).
        for origin in [Some("http://127.0.0.1:8080"), None] {
            let a = ask(resolve(origin)).await;
            assert_eq!(a.status, StatusCode::NOT_FOUND, "{origin:?}: {a:?}");
        }
    });
}
