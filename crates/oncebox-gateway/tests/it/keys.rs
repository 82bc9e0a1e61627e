//! Which key an event gets, through the real router: where the event id comes from (header,
//! pointer, derived from business fields), sources as namespaces, names no source can have,
//! and ids too long to be ids.

use axum::http::StatusCode;
use oncebox_gateway::policy::GatewayConfig;
use oncebox_testkit::run;

use crate::support::{TestGateway, config, post};

#[test]
fn event_id_sources_follow_the_default_order() {
    run(async {
        let gw = TestGateway::new();
        let a = gw
            .send(post(
                "open",
                &[("idempotency-key", "k1"), ("webhook-id", "w1")],
                r#"{"id":"b1"}"#,
            ))
            .await;
        assert_eq!(a.json()["event_id"], "k1");
        let b = gw
            .send(post("open", &[("webhook-id", "w2")], r#"{"id":"b2"}"#))
            .await;
        assert_eq!(b.json()["event_id"], "w2");
        let c = gw.send(post("open", &[], r#"{"id":42}"#)).await;
        assert_eq!(c.json()["event_id"], "42");
        // A header sent twice names two events: refused, not the first taken.
        for name in ["idempotency-key", "webhook-id"] {
            let twice = [(name, "k3"), (name, "k4")];
            let d = gw.send(post("open", &twice, r#"{"id":"b3"}"#)).await;
            assert_eq!(
                (d.status, d.slug().as_str()),
                (StatusCode::BAD_REQUEST, "event-id-invalid"),
                "{name}"
            );
        }
        assert_eq!(gw.rows(), 3);
    });
}

/// A `raw` source with the default id rule takes bodies that are not JSON when a header names
/// the id: the body is read as JSON only to find `/id`.
#[test]
fn a_raw_source_takes_a_form_body_keyed_by_a_header() {
    run(async {
        let gw = TestGateway::new();
        let form = "amount=100&currency=eur";
        for header in ["idempotency-key", "webhook-id"] {
            let key = format!("{header}-1");
            let first = gw.send(post("plain", &[(header, &key)], form)).await;
            assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
            assert_eq!(first.json()["event_id"], key.as_str());
            let again = gw.send(post("plain", &[(header, &key)], form)).await;
            assert!(again.replayed(), "{again:?}");
            // The raw fingerprint compares the bytes: another body under the key is a conflict.
            let other = gw
                .send(post("plain", &[(header, &key)], "amount=999&currency=eur"))
                .await;
            assert_eq!(
                (other.status, other.slug().as_str()),
                (StatusCode::UNPROCESSABLE_ENTITY, "key-reused"),
                "{other:?}"
            );
        }
        // Without a header the id can only be the body's `/id`, so the body must be JSON.
        let bare = gw.send(post("plain", &[], form)).await;
        assert_eq!(
            (bare.status, bare.slug().as_str()),
            (StatusCode::BAD_REQUEST, "invalid-json"),
            "{bare:?}"
        );
        let json = gw.send(post("plain", &[], r#"{"id":"j1"}"#)).await;
        assert_eq!(json.json()["event_id"], "j1");
        assert_eq!(gw.rows(), 3);
    });
}

#[test]
fn derived_ids_make_business_duplicates_one_event() {
    run(async {
        let gw = TestGateway::new();
        let a = gw
            .send(post("derived", &[], r#"{"order_id":"o1","type":"paid"}"#))
            .await;
        let id = a.json()["event_id"].as_str().unwrap().to_owned();
        assert_eq!(id.len(), 64, "SHA-256 hex");
        let b = gw
            .send(post("derived", &[], r#"{"type":"paid","order_id":"o1"}"#))
            .await;
        assert!(b.replayed());
        let c = gw
            .send(post(
                "derived",
                &[],
                r#"{"order_id":"o1","type":"refunded"}"#,
            ))
            .await;
        assert_ne!(c.json()["event_id"].as_str().unwrap(), id);
    });
}

#[test]
fn same_event_id_from_two_sources_is_two_events() {
    run(async {
        let gw = TestGateway::new();
        // Both sources take the id from the body by the default rule, so both events carry
        // the same id: only the source tells them apart.
        let a = gw
            .send(post("open", &[], r#"{"id":"same","amount":1}"#))
            .await;
        let b = gw
            .send(post("fields", &[], r#"{"id":"same","amount":2}"#))
            .await;
        for answer in [&a, &b] {
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
            assert_eq!(answer.json()["event_id"], "same");
            assert!(!answer.replayed(), "{answer:?}");
        }
        assert_eq!(a.json()["source"], "open");
        assert_eq!(b.json()["source"], "fields");
        // A retry to either source replays that source's own event.
        let again = gw
            .send(post("fields", &[], r#"{"id":"same","amount":2}"#))
            .await;
        assert!(
            again.replayed() && again.json()["source"] == "fields",
            "{again:?}"
        );
        let stored: Vec<(String, String)> = gw
            .inbox
            .read_blocking(|c| {
                c.prepare("SELECT source, event_id FROM oncebox_inbox ORDER BY source")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .unwrap();
        let same = |s: &str| (s.to_owned(), "same".to_owned());
        assert_eq!(stored, vec![same("fields"), same("open")]);
    });
}

#[test]
fn unknown_source_is_404_and_any_source_is_open_only_in_zero_config() {
    run(async {
        let gw = TestGateway::new();
        // `%ff` decodes to no UTF-8 at all: still just a name no source has.
        for name in ["nope", "Bad", "a%2Fb", "%ff", "x".repeat(65).as_str()] {
            let a = gw.send(post(name, &[], r#"{"id":"1"}"#)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::NOT_FOUND, "unknown-source"),
                "{name}"
            );
        }
        let zero = TestGateway::with(
            GatewayConfig {
                open_sources: true,
                ..GatewayConfig::default()
            },
            oncebox_sqlite::Options::new,
        );
        assert_eq!(
            zero.send(post("anything", &[], r#"{"id":"1"}"#))
                .await
                .status,
            StatusCode::ACCEPTED
        );
        // A name no source can have is refused there too, with the rule it breaks.
        for name in ["Shop", "%ff", "x".repeat(65).as_str()] {
            let a = zero.send(post(name, &[], r#"{"id":"1"}"#)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::NOT_FOUND, "unknown-source"),
                "{name}"
            );
            let detail = a.json()["detail"].as_str().unwrap().to_owned();
            assert!(detail.contains("source must"), "{name}: {detail}");
        }
        // A name tens of kilobytes long is named, not echoed: cut, with its length.
        let long = "%01".repeat(20_000);
        for gw in [&gw, &zero] {
            let a = gw.send(post(&long, &[], r#"{"id":"1"}"#)).await;
            assert_eq!(a.slug(), "unknown-source");
            let detail = a.json()["detail"].as_str().unwrap().to_owned();
            assert!(a.body.len() < 1024, "{} bytes: {detail}", a.body.len());
            assert!(detail.contains("… (20000 bytes)"), "{detail}");
        }
    });
}

/// In the body 400; in a header 431 at the router (a real server's parser answers so long a
/// header itself, before any router).
#[test]
fn a_ten_megabyte_event_id_is_refused_and_stores_nothing() {
    run(async {
        let mut cfg = config();
        // A body limit the id fits under, so that the id's own check is what refuses it.
        let roomy = oncebox_gateway::policy::SourcePolicy {
            max_body: 16 << 20,
            ..oncebox_gateway::policy::SourcePolicy::open()
        };
        cfg.sources
            .insert(oncebox_core::Source::new("roomy").unwrap(), roomy);
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        let huge = "i".repeat(10 << 20);
        let in_body = gw
            .send(post("roomy", &[], format!(r#"{{"id":"{huge}"}}"#)))
            .await;
        // In a header it passes the headers an event stores, refused before the body is read.
        let in_header = gw
            .send(post("roomy", &[("idempotency-key", &huge)], r#"{"n":1}"#))
            .await;
        let long = "i".repeat(256);
        let long_header = gw
            .send(post("roomy", &[("idempotency-key", &long)], r#"{"n":1}"#))
            .await;
        for (a, status, slug) in [
            (&in_body, StatusCode::BAD_REQUEST, "event-id-invalid"),
            (&long_header, StatusCode::BAD_REQUEST, "event-id-invalid"),
            (
                &in_header,
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers-too-large",
            ),
        ] {
            assert_eq!((a.status, a.slug().as_str()), (status, slug));
            // The refusal names the limit; it does not echo ten megabytes back.
            assert!(a.body.len() < 1024, "{} bytes", a.body.len());
        }
        // The default limit refuses the same body before it is parsed.
        let limited = gw
            .send(post("open", &[], format!(r#"{{"id":"{huge}"}}"#)))
            .await;
        assert_eq!(
            (limited.status, limited.slug().as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "body-too-large")
        );
        assert_eq!(gw.rows(), 0);
    });
}

/// A browser posts to loopback too: another site's page could send an unsigned source events
/// (a simple `POST`, no preflight) that the relay would then sign and deliver. A foreign
/// `Origin` is refused there before the body is read, as is one rebound by DNS to this machine;
/// servers send none, and a signed source needs its secret whatever the origin.
#[test]
fn another_sites_page_cannot_post_to_an_unsigned_source() {
    run(async {
        let gw = TestGateway::new();
        let page = [
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:8080"),
        ];
        // The same page after its DNS answer was rebound to this machine: its browser names
        // the site as `Host` too.
        let rebound = [
            ("origin", "http://rebind.evil.example:8080"),
            ("host", "rebind.evil.example:8080"),
        ];
        for headers in [&page, &rebound] {
            let refused = gw.send(post("open", headers, r#"{"id":"x1"}"#)).await;
            assert_eq!(
                (refused.status, refused.slug().as_str()),
                (StatusCode::FORBIDDEN, "cross-origin"),
                "{refused:?}"
            );
        }
        assert_eq!(gw.rows(), 0);
        let own = [
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080"),
        ];
        let same = gw.send(post("open", &own, r#"{"id":"x2"}"#)).await;
        assert_eq!(same.status, StatusCode::ACCEPTED, "{same:?}");
        let server = gw.send(post("open", &[], r#"{"id":"x3"}"#)).await;
        assert_eq!(server.status, StatusCode::ACCEPTED, "{server:?}");
        assert_eq!(gw.rows(), 2);
    });
}

/// An id ending in a space is refused: its deliveries' `Idempotency-Key` header would reach
/// the receiver trimmed, as another event's key. Other whitespace stays (the id is never
/// trimmed). And the request's content type is what its deliveries carry, on an ordered source
/// with routes too: a tab inside is header whitespace, not a reason to refuse the event.
#[test]
fn an_id_ending_in_a_space_is_400_and_the_content_type_is_delivered_as_sent() {
    run(async {
        let mut cfg = config();
        cfg.routes = vec![oncebox_core::route::Route {
            name: "hooks".to_owned(),
            sources: vec![oncebox_core::Source::new("ordered").unwrap()],
            filter: None,
            url: "http://127.0.0.1:9/hooks".to_owned(),
            timeout: std::time::Duration::from_secs(5),
            signing_secret: None,
            idempotent: true,
            status_url: None,
            retry: oncebox_core::delivery::RetryPolicy::default(),
            concurrency: 4,
            rate: None,
            ca_pem: None,
        }];
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        let refused = gw.send(post("open", &[], r#"{"id":"x "}"#)).await;
        assert_eq!(
            (refused.status, refused.slug().as_str()),
            (StatusCode::BAD_REQUEST, "event-id-invalid")
        );
        assert!(String::from_utf8_lossy(&refused.body).contains("end with a space"));
        assert_eq!(gw.rows(), 0);
        for kept in [" x", "x\u{a0}"] {
            let a = gw
                .send(post("open", &[], format!(r#"{{"id":"{kept}"}}"#)))
                .await;
            assert_eq!(a.status, StatusCode::ACCEPTED, "{kept:?}");
        }
        // Through a route's queue too: ids a header keeps are queued as they are.
        for kept in [" pi", "pi\u{a0}"] {
            let body =
                format!(r#"{{"id":"{kept}","created":1,"data":{{"object":{{"id":"o1"}}}}}}"#);
            let a = gw.send(post("ordered", &[], body)).await;
            assert_eq!(a.status, StatusCode::ACCEPTED, "{kept:?}: {a:?}");
        }
        let tabbed = axum::http::Request::post("/v1/sources/ordered/events")
            .header("content-type", "text/plain;\tcharset=utf-8")
            .body(axum::body::Body::from(crate::support::ordered_event(
                "paid", 20,
            )))
            .unwrap();
        let a = gw.send(tabbed).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        use oncebox_core::relay_store::DeliveryStore;
        let claimed = gw
            .inbox
            .claim(
                crate::support::NOW,
                10,
                std::time::Duration::from_secs(60),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(claimed.len(), 3);
        let tabbed = claimed.iter().find(|c| c.key.event_id.as_str() == "paid");
        assert_eq!(
            tabbed.map(|c| c.content_type.as_str()),
            Some("text/plain;\tcharset=utf-8")
        );
    });
}
