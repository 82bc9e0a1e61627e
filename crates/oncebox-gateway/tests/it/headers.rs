//! What of a request the admin API shows with its event: the payload, the answer, and every
//! header that is no credential or signature, its value as it came where it is text (UTF-8, non-ASCII
//! included); a value that is not text is not kept. And the headers the gateway acts on beside
//! the signature's and the id's: `oncebox-hops`, the loop guard, and `Content-Encoding` or a
//! `Transfer-Encoding` coding, a coded body refused.

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::signature::{Encoding, Scheme, Secret, sign};
use oncebox_core::{Clock, Source};
use oncebox_gateway::policy::SourcePolicy;
use oncebox_testkit::run;

use crate::support::{NOW, TestGateway, admin_get, post};

/// A body in a content coding is refused for what it is (415, `Accept-Encoding: identity`),
/// stored nowhere: kept as the coded bytes it would reach receivers undecodable. `identity`
/// is no coding.
#[test]
fn a_coded_body_is_refused_415_and_identity_is_taken() {
    run(async {
        let gw = TestGateway::new();
        for (n, coding) in ["gzip", "identity, br", "x-custom"].into_iter().enumerate() {
            let body = format!(r#"{{"id":"coded-{n}"}}"#);
            let a = gw
                .send(post("open", &[("content-encoding", coding)], body))
                .await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "encoding-unsupported"),
                "{coding}: {a:?}"
            );
            assert_eq!(a.headers["accept-encoding"], "identity", "{a:?}");
        }
        assert_eq!(gw.rows(), 0);
        let plain = gw
            .send(post(
                "open",
                &[("content-encoding", "identity")],
                r#"{"id":"plain"}"#,
            ))
            .await;
        assert_eq!(plain.status, StatusCode::ACCEPTED, "{plain:?}");
        assert_eq!(gw.rows(), 1);
    });
}

/// A transfer coding beside `chunked` (`gzip, chunked`): hyper removes the chunking and
/// leaves the gzip, so the body would be stored coded, as with `Content-Encoding`. Through a
/// real listener, whose parser is the one that takes it.
#[test]
fn a_transfer_coding_other_than_chunked_is_refused_415() {
    run(async {
        let s = crate::wire::served(oncebox_gateway::policy::Limits::default()).await;
        let body = r#"{"id":"te"}"#;
        for (n, coding) in ["gzip, chunked", "chunked"].into_iter().enumerate() {
            let mut raw = crate::wire::Raw::connect(s.addr).await;
            raw.send(
                format!(
                    "POST /v1/sources/open/events HTTP/1.1\r\nHost: x\r\n\
                     Content-Type: application/json\r\nTransfer-Encoding: {coding}\r\n\r\n\
                     {:x}\r\n{body}\r\n0\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
            let a = raw.reply().await.answer();
            if n == 0 {
                assert_eq!(
                    (a.status, a.slug().as_str()),
                    (StatusCode::UNSUPPORTED_MEDIA_TYPE, "encoding-unsupported"),
                    "{coding}: {a:?}"
                );
                assert_eq!(s.gw.rows(), 0);
            } else {
                assert_eq!(a.status, StatusCode::ACCEPTED, "{coding}: {a:?}");
                assert_eq!(s.gw.rows(), 1);
            }
        }
    });
}

#[test]
fn one_event_shows_payload_headers_and_answer() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post(
            "open",
            &[("x-trace", "t9")],
            r#"{"id":"e1","note":"<script>"}"#,
        ))
        .await;
        let e = gw
            .send(admin_get("/v1/sources/open/events/e1"))
            .await
            .json();
        assert_eq!(e["state"], "completed");
        assert_eq!(e["payload"], r#"{"id":"e1","note":"<script>"}"#);
        assert!(
            e["headers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h[0] == "x-trace" && h[1] == "t9")
        );
        assert_eq!(e["response"]["kind"], "completed");
        assert_eq!(e["fingerprint"].as_str().unwrap().len(), 64);
        let missing = gw.send(admin_get("/v1/sources/open/events/nope")).await;
        assert_eq!(
            (missing.status, missing.slug().as_str()),
            (StatusCode::NOT_FOUND, "event-not-found")
        );
    });
}

#[test]
fn header_values_are_kept_as_text_non_ascii_included() {
    run(async {
        let gw = TestGateway::new();
        let mut r = Request::post("/v1/sources/open/events")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id":"e2"}"#))
            .unwrap();
        let h = r.headers_mut();
        h.insert(
            "x-name",
            HeaderValue::from_bytes("Zoë «ünï»".as_bytes()).unwrap(),
        );
        h.insert("x-binary", HeaderValue::from_bytes(b"\xff\xfe<b>").unwrap());
        h.insert("x-plain", HeaderValue::from_static("ok"));
        assert_eq!(gw.send(r).await.status, StatusCode::ACCEPTED);
        let e = gw
            .send(admin_get("/v1/sources/open/events/e2"))
            .await
            .json();
        let kept: Vec<(String, String)> = e["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h[0].as_str().unwrap().into(), h[1].as_str().unwrap().into()))
            .collect();
        let value = |name: &str| {
            kept.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(value("x-name"), Some("Zoë «ünï»"), "{kept:?}");
        assert_eq!(value("x-plain"), Some("ok"));
        assert_eq!(value("x-binary"), None, "not text: not kept");
    });
}

/// The loop guard: `oncebox-hops` at the limit, or no count, is refused with nothing stored;
/// below it the event's delivery carries one hop more. Of two such headers the higher counts.
#[test]
fn an_event_relayed_round_too_often_is_refused_and_a_relayed_one_counted_on() {
    run(async {
        let mut cfg = crate::support::config();
        cfg.routes = vec![crate::support::route("all", None)];
        let gw = TestGateway::with(cfg, oncebox_sqlite::Options::new);
        for (id, hops, slug) in [
            ("h1", &["16"][..], "hop-limit"),
            ("h2", &["99999999999"], "hop-limit"),
            ("h3", &["1", "16"], "hop-limit"),
            ("h4", &["two"], "hops-invalid"),
            ("h5", &["-1"], "hops-invalid"),
        ] {
            let mut r = post("open", &[], format!(r#"{{"id":"{id}"}}"#));
            for h in hops {
                r.headers_mut()
                    .append("oncebox-hops", HeaderValue::from_static(h));
            }
            let refused = gw.send(r).await;
            assert_eq!(
                (refused.status, refused.slug().as_str()),
                (StatusCode::BAD_REQUEST, slug),
                "{hops:?}"
            );
            let path = format!("/v1/sources/open/events/{id}");
            assert_eq!(
                gw.send(admin_get(&path)).await.status,
                StatusCode::NOT_FOUND
            );
        }
        let sent = gw
            .send(post("open", &[("oncebox-hops", "15")], r#"{"id":"h6"}"#))
            .await;
        assert_eq!(sent.status, StatusCode::ACCEPTED, "{sent:?}");
        let outside = gw.send(post("open", &[], r#"{"id":"h7"}"#)).await;
        assert_eq!(outside.status, StatusCode::ACCEPTED);
        let claimed = gw
            .inbox
            .claim(gw.clock.now(), 10, std::time::Duration::from_secs(60), &[])
            .await
            .unwrap();
        let mut hops: Vec<(&str, u32)> = claimed
            .iter()
            .map(|c| (c.key.event_id.as_str(), c.hops))
            .collect();
        hops.sort();
        assert_eq!(hops, [("h6", 16), ("h7", 1)]);
    });
}

#[test]
fn credentials_are_not_stored_with_the_event() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post(
            "open",
            &[
                ("authorization", "Bearer secret"),
                ("X-Gitlab-Token", "gitlab-secret"),
                ("X-API-Key", "api-key-secret"),
                ("x-auth-token", "auth-token-secret"),
                ("X-Telegram-Bot-Api-Secret-Token", "telegram-secret"),
                ("X-Hook-Secret", "asana-secret"),
                ("X-Functions-Key", "functions-secret"),
                ("Ocp-Apim-Subscription-Key", "apim-secret"),
                ("X-Authorization", "Bearer x-authorization-secret"),
                ("X-Auth", "x-auth-secret"),
                ("X-Webhook-Auth", "webhook-auth-secret"),
                ("X-Credentials", "credentials-secret"),
                ("X-Passphrase", "passphrase-secret"),
                ("x-trace", "t1"),
                ("X-Event-Key", "repo:push"),
            ],
            r#"{"id":"h1"}"#,
        ))
        .await;
        let headers: String = gw
            .inbox
            .read_blocking(|c| c.query_row("SELECT headers FROM oncebox_inbox", [], |r| r.get(0)))
            .unwrap();
        assert!(
            headers.contains("x-trace: t1")
                && headers.contains("x-event-key: repo:push")
                && !headers.contains("secret"),
            "{headers}"
        );
    });
}

/// Signatures are not stored either: GitHub's and a plain HMAC's sign no timestamp, so a
/// stored body beside its signature could be posted again at any time. Neither is the header
/// a source's `hmac-sha256` scheme names, whatever its name; other headers are kept.
#[test]
fn signatures_are_not_stored_with_the_event() {
    run(async {
        let scheme = Scheme::HmacSha256 {
            header: "X-Mac".into(),
            encoding: Encoding::Hex,
            prefix: String::new(),
        };
        let mut config = crate::support::config();
        let secret = Secret::parse(&scheme, "mac-secret").unwrap();
        let policy = SourcePolicy {
            scheme: scheme.clone(),
            secrets: vec![secret.clone()],
            ..SourcePolicy::open()
        };
        config.sources.insert(Source::new("mac").unwrap(), policy);
        let gw = TestGateway::with(config, oncebox_sqlite::Options::new);
        let named = [
            ("X-Hub-Signature-256", "sha256=hub-sig"),
            ("X-Hub-Signature", "sha1=hub-sig"),
            ("Stripe-Signature", "t=1,v1=stripe-sig"),
            ("webhook-signature", "v1,sw-sig"),
            ("svix-signature", "v1,svix-sig"),
            ("X-Slack-Signature", "v0=slack-sig"),
            ("X-Shopify-Hmac-Sha256", "shopify-sig"),
            ("x-trace", "t1"),
        ];
        let a = gw.send(post("open", &named, r#"{"id":"s1"}"#)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        let body = r#"{"id":"s2"}"#;
        let signed = sign(&scheme, &secret, "", NOW, body.as_bytes());
        let mut sent: Vec<(&str, &str)> = signed
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        sent.push(("x-trace", "t2"));
        let a = gw.send(post("mac", &sent, body)).await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        let stored: Vec<String> = gw
            .inbox
            .read_blocking(|c| {
                c.prepare("SELECT headers FROM oncebox_inbox ORDER BY id")?
                    .query_map([], |r| r.get(0))?
                    .collect()
            })
            .unwrap();
        let mac = &signed
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-mac"))
            .unwrap()
            .1;
        assert!(
            stored[0].contains("x-trace: t1") && !stored[0].contains("-sig"),
            "{}",
            stored[0]
        );
        assert!(
            stored[1].contains("x-trace: t2") && !stored[1].contains(mac.as_str()),
            "{}",
            stored[1]
        );
    });
}
