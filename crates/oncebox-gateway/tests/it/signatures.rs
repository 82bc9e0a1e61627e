//! Webhook authenticity through the router: known vectors, tampering, hostile signature
//! headers and timestamps. Every rejection is a 401 and writes nothing.

use std::time::Duration;

use axum::http::StatusCode;
use oncebox_core::Timestamp;
use oncebox_core::signature::{Scheme, Secret, sign};
use oncebox_testkit::run;

use crate::support::{GITHUB_SECRET, NOW, STRIPE_SECRET, SW_SECRET, TestGateway, post};

fn headers(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

#[test]
fn github_known_vector_is_accepted() {
    run(async {
        let gw = TestGateway::new();
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let ok = gw
            .send(post(
                "github",
                &[("x-hub-signature-256", sig), ("x-github-delivery", "d-1")],
                "Hello, World!",
            ))
            .await;
        assert_eq!(ok.status, StatusCode::ACCEPTED, "{ok:?}");
        let tampered = gw
            .send(post(
                "github",
                &[("x-hub-signature-256", sig), ("x-github-delivery", "d-2")],
                "Hello, World?",
            ))
            .await;
        assert_eq!(
            (tampered.status, tampered.slug().as_str()),
            (StatusCode::UNAUTHORIZED, "signature-invalid")
        );
        // RFC 9110: a 401 names its challenge.
        assert_eq!(
            tampered.headers["www-authenticate"], "Signature realm=\"oncebox\"",
            "{tampered:?}"
        );
        assert_eq!(gw.rows(), 1);
    });
}

/// GitHub signs the body alone: a captured delivery replayed as it was is a duplicate, and the
/// same signed body under a new `X-GitHub-Delivery` is a new event (`docs/github.md` says so).
#[test]
fn a_github_body_replayed_under_a_new_delivery_id_is_a_new_event() {
    run(async {
        let gw = TestGateway::new();
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let send = |delivery: &'static str| {
            post(
                "github",
                &[
                    ("x-hub-signature-256", sig),
                    ("x-github-delivery", delivery),
                ],
                "Hello, World!",
            )
        };
        let first = gw.send(send("d-1")).await;
        let replay = gw.send(send("d-1")).await;
        let renamed = gw.send(send("d-other")).await;
        assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(renamed.status, StatusCode::ACCEPTED, "{renamed:?}");
        assert!(!renamed.replayed(), "{renamed:?}");
        assert_eq!(gw.rows(), 2);
    });
}

#[test]
fn standard_webhooks_spec_vector_is_accepted_at_its_time() {
    run(async {
        let gw = TestGateway::new();
        gw.clock.set(Timestamp(1_614_265_330_000));
        let h = [
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            (
                "webhook-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ];
        let a = gw.send(post("shop", &h, r#"{"test": 2432232314}"#)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(a.json()["event_id"], "msg_p5jXN8AQM9LWM0D4loKWxJek");
    });
}

#[test]
fn stripe_fixed_vector_is_accepted_at_its_time() {
    run(async {
        let gw = TestGateway::new();
        gw.clock.set(Timestamp(1_700_000_000_000));
        // Computed independently with Python's standard library, from Stripe's scheme:
        // hmac.new(b"whsec_stripe_test_secret", b'1700000000.{"id":"evt_1","object":"event"}',
        //          hashlib.sha256).hexdigest()
        let sig =
            "t=1700000000,v1=f0b45ad397b7d5f0c0a066aba48c4fdbf1e7da80b9ce240806f9bd530f378263";
        let body = r#"{"id":"evt_1","object":"event"}"#;
        let a = gw
            .send(post("stripe", &[("stripe-signature", sig)], body))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(a.json()["event_id"], "evt_1");
        // The same header a byte off in its digest, or over another body, is refused.
        let off = sig.replace("263", "264");
        let b = gw
            .send(post("stripe", &[("stripe-signature", &off)], body))
            .await;
        let other = r#"{"id":"evt_1","object":"Event"}"#;
        let c = gw
            .send(post("stripe", &[("stripe-signature", sig)], other))
            .await;
        for refused in [&b, &c] {
            assert_eq!(
                (refused.status, refused.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "signature-invalid")
            );
        }
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn one_changed_byte_of_body_id_or_timestamp_is_401() {
    run(async {
        let gw = TestGateway::new();
        let scheme = Scheme::StandardWebhooks;
        let secret = Secret::parse(&scheme, SW_SECRET).unwrap();
        let body = r#"{"order":1}"#;
        let signed = sign(&scheme, &secret, "msg_1", NOW, body.as_bytes());
        let mut h = headers(&signed);
        assert_eq!(
            gw.send(post("shop", &h, body)).await.status,
            StatusCode::ACCEPTED
        );
        assert_eq!(
            gw.send(post("shop", &h, r#"{"order":2}"#)).await.status,
            StatusCode::UNAUTHORIZED
        );
        let ts = (NOW.millis() / 1000 + 1).to_string();
        for (name, value) in [("webhook-id", "msg_2"), ("webhook-timestamp", ts.as_str())] {
            h = headers(&signed);
            h.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value;
            let a = gw.send(post("shop", &h, body)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "signature-invalid"),
                "{name}"
            );
        }
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn every_prefix_of_a_valid_signature_and_hostile_headers_are_401() {
    run(async {
        let gw = TestGateway::new();
        let scheme = Scheme::Stripe;
        let secret = Secret::parse(&scheme, STRIPE_SECRET).unwrap();
        let body = r#"{"id":"evt_s1"}"#;
        let signed = sign(&scheme, &secret, "", NOW, body.as_bytes());
        let valid = signed[0].1.clone();
        for cut in 0..valid.len() {
            let a = gw
                .send(post("stripe", &[("stripe-signature", &valid[..cut])], body))
                .await;
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "prefix {cut}: {a:?}");
        }
        let t = NOW.millis() / 1000;
        let hostile = [
            format!("t={t},v1="),
            format!("t={t},v1=zz"),
            format!("t={},v1={}", i64::MIN, "0".repeat(64)),
            format!("t={},v1={}", "9".repeat(30), "0".repeat(64)),
            format!("t=-1,v1={}", "0".repeat(64)),
            format!(
                "t={t},{}",
                vec![format!("v1={}", "0".repeat(64)); 10_000].join(",")
            ),
            "x".repeat(100_000),
        ];
        for h in &hostile {
            let a = gw
                .send(post("stripe", &[("stripe-signature", h)], body))
                .await;
            // Past what an event stores, the headers are refused before they are read.
            let refused = if h.len() > oncebox_gateway::MAX_HEADER_BYTES {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            } else {
                StatusCode::UNAUTHORIZED
            };
            assert_eq!(a.status, refused, "{}", &h[..h.len().min(40)]);
        }
        let a = gw
            .send(post("stripe", &[("stripe-signature", &valid)], body))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn timestamps_outside_tolerance_are_401_in_both_directions() {
    run(async {
        let gw = TestGateway::new();
        let scheme = Scheme::Stripe;
        let secret = Secret::parse(&scheme, STRIPE_SECRET).unwrap();
        let body = r#"{"id":"evt_t"}"#;
        for offset in [-301i64, 301] {
            let at = Timestamp(NOW.millis() + offset * 1000);
            let signed = sign(&scheme, &secret, "", at, body.as_bytes());
            let a = gw.send(post("stripe", &headers(&signed), body)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "timestamp-out-of-tolerance"),
                "{offset}"
            );
        }
        let inside = sign(
            &scheme,
            &secret,
            "",
            Timestamp(NOW.millis() - 299_000),
            body.as_bytes(),
        );
        assert_eq!(
            gw.send(post("stripe", &headers(&inside), body))
                .await
                .status,
            StatusCode::ACCEPTED
        );
        gw.clock.advance(Duration::from_secs(3600));
        let replayed_late = gw.send(post("stripe", &headers(&inside), body)).await;
        assert_eq!(
            replayed_late.status,
            StatusCode::UNAUTHORIZED,
            "a captured request expires"
        );
    });
}

#[test]
fn a_sources_secret_never_works_for_another_source() {
    run(async {
        let gw = TestGateway::new();
        let body = r#"{"id":"u1"}"#;
        // Well-formed signatures in each source's own scheme and header, made with another
        // source's secret: refused for the secret, not for their form.
        let stripe = Scheme::Stripe;
        let hmac = Scheme::HmacSha256 {
            header: "x-signature".into(),
            encoding: oncebox_core::signature::Encoding::Base64,
            prefix: String::new(),
        };
        let cases = [
            ("stripe", &stripe, SW_SECRET),
            ("stripe", &stripe, GITHUB_SECRET),
            ("hmac", &hmac, STRIPE_SECRET),
            ("hmac", &hmac, GITHUB_SECRET),
        ];
        for (source, scheme, foreign) in cases {
            let key = Secret::parse(scheme, foreign).unwrap();
            let signed = sign(scheme, &key, "u1", NOW, body.as_bytes());
            let a = gw.send(post(source, &headers(&signed), body)).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "signature-invalid"),
                "{source} with another source's secret"
            );
        }
        let missing = gw.send(post("shop", &[("webhook-id", "m1")], "{}")).await;
        assert_eq!(
            (missing.status, missing.slug().as_str()),
            (StatusCode::UNAUTHORIZED, "signature-invalid")
        );
        assert_eq!(
            gw.rows(),
            0,
            "U = 0: nothing stored under another source's name"
        );
    });
}

/// A flood of forgeries makes no database query: no write (with the write lock held, a request
/// that reached the writer would be answered 503, or a replay) and no read (the store's count
/// of reads it served stands still, and moves for a genuine duplicate).
#[test]
fn forged_requests_are_refused_before_the_database() {
    run(async {
        // Without the memory of recent answers: a duplicate of the stored key is then answered
        // by a read, the look-up a forgery must never cause.
        let gw = TestGateway::with(crate::support::config(), |p| {
            oncebox_sqlite::Options::new(p)
                .busy_timeout(Duration::from_millis(50))
                .recent_answers(0)
        });
        let scheme = Scheme::Stripe;
        let key = Secret::parse(&scheme, STRIPE_SECRET).unwrap();
        let signed = |body: &str| sign(&scheme, &key, "", NOW, body.as_bytes());
        let stored = r#"{"id":"evt_stored"}"#;
        let first = gw
            .send(post("stripe", &headers(&signed(stored)), stored))
            .await;
        assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
        // Another connection holds the write lock: whatever reaches the store for a new key now
        // waits out the busy timeout and is answered 503.
        let lock = oncebox_sqlite::rusqlite::Connection::open(&gw.path).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let fresh = r#"{"id":"evt_new"}"#;
        let genuine = gw
            .send(post("stripe", &headers(&signed(fresh)), fresh))
            .await;
        assert_eq!(
            genuine.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{genuine:?}"
        );
        // Forgeries for new keys and for the stored one: a 401 each, never the 503 or the
        // replay the store would have given, so none of them reached the writer; and not one
        // read, so none looked anything up either.
        let reads = gw.inbox.stats().reads();
        let forged = format!("t={},v1={}", NOW.millis() / 1000, "0".repeat(64));
        for n in 0..200 {
            let body = if n % 2 == 0 {
                format!(r#"{{"id":"evt_forged_{n}"}}"#)
            } else {
                stored.to_owned()
            };
            let a = gw
                .send(post("stripe", &[("stripe-signature", &forged)], body))
                .await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNAUTHORIZED, "signature-invalid"),
                "forgery {n}"
            );
            assert!(!a.replayed());
        }
        assert_eq!(
            gw.inbox.stats().reads(),
            reads,
            "200 forgeries made no read of the database"
        );
        // The same key genuinely signed is read: the writer cannot answer under the lock, a
        // reader finds its committed record and the first answer is replayed.
        let duplicate = gw
            .send(post("stripe", &headers(&signed(stored)), stored))
            .await;
        assert_eq!(duplicate.status, StatusCode::ACCEPTED, "{duplicate:?}");
        assert!(duplicate.replayed());
        assert!(
            gw.inbox.stats().reads() > reads,
            "a genuine duplicate is counted as a read"
        );
        lock.execute_batch("ROLLBACK").unwrap();
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn hmac_base64_source_accepts_its_own_signature() {
    run(async {
        let gw = TestGateway::new();
        let scheme = oncebox_core::signature::Scheme::HmacSha256 {
            header: "x-signature".into(),
            encoding: oncebox_core::signature::Encoding::Base64,
            prefix: String::new(),
        };
        let secret = Secret::parse(&scheme, "hmac-secret").unwrap();
        let body = r#"{"id":"h1"}"#;
        let signed = sign(&scheme, &secret, "", NOW, body.as_bytes());
        assert_eq!(
            gw.send(post("hmac", &headers(&signed), body)).await.status,
            StatusCode::ACCEPTED
        );
    });
}

/// Svix sends the Standard Webhooks headers under its own names unless an account renames
/// them: such a delivery is verified and stored under its `svix-id`, a retry replays it, and a
/// captured one cannot be sent again under another id by adding a `webhook-id`.
#[test]
fn svix_header_names_are_verified_and_name_the_event() {
    run(async {
        let gw = TestGateway::new();
        gw.clock.set(Timestamp(1_614_265_330_000));
        let h = [
            ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("svix-timestamp", "1614265330"),
            (
                "svix-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ];
        let body = r#"{"test": 2432232314}"#;
        let a = gw.send(post("shop", &h, body)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert_eq!(a.json()["event_id"], "msg_p5jXN8AQM9LWM0D4loKWxJek");
        let retry = gw.send(post("shop", &h, body)).await;
        assert!(retry.replayed(), "{retry:?}");

        let mut renamed = h.to_vec();
        renamed.push(("webhook-id", "msg_forged"));
        let forged = gw.send(post("shop", &renamed, body)).await;
        assert_eq!(
            (forged.status, forged.slug().as_str()),
            (StatusCode::UNAUTHORIZED, "signature-invalid"),
            "{forged:?}"
        );
        // An unsigned source's default id rule reads `svix-id` after `webhook-id` too.
        let open = gw
            .send(post("open", &[("svix-id", "msg_open")], r#"{"a":1}"#))
            .await;
        assert_eq!(open.json()["event_id"], "msg_open", "{open:?}");
        assert_eq!(gw.rows(), 2);
    });
}
