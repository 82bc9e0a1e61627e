//! What the document declares a request may carry against what the handlers take: the lists'
//! `limit`, the keys in paths and filters, the dashboard's forms and the ingress's headers.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_testkit::run;
use serde_json::Value;

use super::{conform, document, form};
use crate::support::{ADMIN_TOKEN, TestGateway, admin_get, post};

/// The parameter `name` of the operation `method` `path`, as the document declares it.
fn parameter<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
    let params = doc["paths"][path][method]["parameters"].as_array();
    let found = params.and_then(|ps| ps.iter().find(|p| p["name"] == name));
    found.unwrap_or_else(|| panic!("{method} {path} declares no {name}"))
}

/// `limit` is declared as the lists read it: no less than 0 (taken as 1), at most 2^64 - 1 (a
/// number above 500 is taken as 500, not refused; one past 2^64 - 1 does not parse), and a
/// negative one refused.
#[test]
fn limit_is_declared_as_the_lists_read_it() {
    run(async {
        let (gw, _) = super::bodies::populated().await;
        // More than 500 of each, so that a limit above 500 shows the cap, not the whole list.
        for i in 0..500 {
            let accepted = gw
                .send(post("open", &[], format!(r#"{{"id":"bulk-{i}"}}"#)))
                .await;
            assert_eq!(accepted.status, StatusCode::ACCEPTED);
        }
        let doc = document(&gw).await;
        for path in ["/v1/events", "/v1/deliveries"] {
            let limit = parameter(&doc, path, "get", "limit");
            assert_eq!(limit["schema"]["minimum"], 0, "{path}: {limit}");
            assert_eq!(limit["schema"]["maximum"], u64::MAX, "{path}: {limit}");
            let description = limit["description"].as_str().unwrap();
            assert!(description.contains("above 500 as 500"), "{path}: {limit}");
            let count = async |query: &str| {
                let a = gw.send(admin_get(&format!("{path}?{query}"))).await;
                (a.status, a.json()["items"].as_array().map(Vec::len))
            };
            let (ok, capped, given) = (StatusCode::OK, Some(500), Some(50));
            assert_eq!(count("limit=0").await, (ok, Some(1)), "{path}");
            assert_eq!(count("").await, (ok, given), "{path}: 50 unless given");
            assert_eq!(count("limit=501").await, (ok, capped), "{path}");
            assert_eq!(
                count("limit=").await,
                (ok, given),
                "{path}: empty is not given"
            );
            assert_eq!(count("limit=-1").await.0, StatusCode::BAD_REQUEST, "{path}");
            let most = count("limit=18446744073709551615").await;
            assert_eq!(most, (ok, capped), "{path}");
            let past = count("limit=18446744073709551616").await.0;
            assert_eq!(past, StatusCode::BAD_REQUEST, "{path}");
        }
    });
}

/// The `source` and `event_id` schemas take what the server takes and refuse what it refuses,
/// but for the 255-byte limit, which `maxLength` (characters) cannot say and the description
/// does.
#[test]
fn keys_are_declared_as_the_server_reads_them() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let param = |name: &str| {
            parameter(&doc, "/v1/sources/{source}/events/{event_id}", "get", name).clone()
        };
        let valid = |schema: &Value, text: &str| {
            conform::conforms(&doc, schema, &Value::from(text), text).is_ok()
        };
        let encode = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let long = "a".repeat(64);
        let sources = [
            "a", "open", "0x.y_z-1", &long, "A", "-a", ".a", "a b", "a/b", "é", "a~",
        ];
        let filter = doc["paths"]["/v1/events"]["get"]["parameters"][0].clone();
        assert_eq!(filter["name"], "source");
        for source in sources
            .iter()
            .copied()
            .chain([&*format!("{long}a"), "shop\n"])
        {
            let path = gw
                .send(admin_get(&format!(
                    "/v1/sources/{}/events/e1",
                    encode(source)
                )))
                .await;
            let taken = path.slug() == "event-not-found";
            assert_eq!(
                valid(&param("source")["schema"], source),
                taken,
                "{source:?} {path:?}"
            );
            let listed = gw
                .send(admin_get(&format!("/v1/events?source={}", encode(source))))
                .await;
            let taken = listed.status == StatusCode::OK;
            assert_eq!(
                valid(&filter["schema"], source),
                taken,
                "{source:?} {listed:?}"
            );
        }
        let ids = [
            "e1", "a b", " a", "a ", "é", "😀", "a/b", "\u{FEFF}", "\u{200B}", "x\u{A0}", " ",
            "\u{A0}", "\u{3000}", "\u{1680}", "\u{2028}", "\t", "\u{1}x", "x\u{7F}", "\u{85}",
            "x\u{9F}",
        ];
        let at_most = "x".repeat(255);
        let event_id = param("event_id");
        for id in ids.iter().copied().chain([at_most.as_str()]) {
            let a = gw
                .send(admin_get(&format!(
                    "/v1/sources/open/events/{}",
                    encode(id)
                )))
                .await;
            let taken = a.slug() == "event-not-found";
            assert_eq!(valid(&event_id["schema"], id), taken, "{id:?} {a:?}");
        }
        // Past 255 bytes every id is refused: in characters too when they are ASCII.
        assert!(!valid(&event_id["schema"], &format!("{at_most}x")));
        for id in [format!("{at_most}x"), "é".repeat(128)] {
            let a = gw
                .send(admin_get(&format!(
                    "/v1/sources/open/events/{}",
                    encode(&id)
                )))
                .await;
            assert_eq!(a.slug(), "invalid-key", "{id:?}");
        }
        let described = event_id["description"].as_str().unwrap();
        assert!(described.contains("255 bytes"), "{event_id}");
    });
}

/// The `route` filter of the deliveries list takes what the handler takes: any name but one
/// with a control character (400 `invalid-query`).
#[test]
fn the_route_filter_is_declared_as_the_list_reads_it() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let route = parameter(&doc, "/v1/deliveries", "get", "route");
        let names = [
            "", "all", "a b", "é", "😀", "\u{A0}", "\0", "a\0", "\t", "x\n", "\u{1}x", "x\u{7F}",
            "\u{85}", "x\u{9F}",
        ];
        for name in names {
            let encoded =
                percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
            let a = gw
                .send(admin_get(&format!("/v1/deliveries?route={encoded}")))
                .await;
            let declared = conform::conforms(&doc, &route["schema"], &Value::from(name), name);
            assert_eq!(
                declared.is_ok(),
                a.status == StatusCode::OK,
                "{name:?} {a:?}"
            );
        }
    });
}

/// The headers the default rule reads an id from are declared 1 to 255 long, as the ingress
/// reads them (past 255 bytes refused, in characters too when they are ASCII).
#[test]
fn the_id_headers_are_declared_as_long_as_an_id() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        for header in ["Idempotency-Key", "webhook-id"] {
            let param = parameter(&doc, "/v1/sources/{source}/events", "post", header);
            for length in [0, 1, 255, 256] {
                let id = format!("{header}-{}", "x".repeat(255))[..length].to_owned();
                let declared =
                    conform::conforms(&doc, &param["schema"], &Value::from(&*id), header);
                let a = gw.send(post("open", &[(header, &id)], "{}")).await;
                let taken = a.status == StatusCode::ACCEPTED;
                assert_eq!(declared.is_ok(), taken, "{header} of {length}: {a:?}");
            }
        }
    });
}

/// `oncebox-hops` is declared as the counts the ingress takes: a decimal count below the hop
/// limit, with leading zeros and blanks around it; empty, signed, fractional or 16 refused.
#[test]
fn the_hop_count_is_declared_as_the_ingress_reads_it() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let param = parameter(&doc, "/v1/sources/{source}/events", "post", "oncebox-hops");
        let counts = [
            "", "0", "7", "015", "15", "16", "99", " 3\t", "-1", "+1", "1.0", "1e1", "1 2", "x",
        ];
        for (i, count) in counts.into_iter().enumerate() {
            let declared =
                conform::conforms(&doc, &param["schema"], &Value::from(count), "oncebox-hops");
            let id = format!("hops-{i}");
            let headers = [("oncebox-hops", count), ("Idempotency-Key", id.as_str())];
            let a = gw.send(post("open", &headers, "{}")).await;
            let taken = a.status == StatusCode::ACCEPTED;
            assert_eq!(declared.is_ok(), taken, "{count:?}: {a:?}");
        }
    });
}

/// The sign-in and sign-out forms are declared with the fields the dashboard's pages send, and
/// a form of just those fields is what the handlers take.
#[test]
fn the_forms_are_declared_with_the_fields_the_pages_send() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let fields = |path: &str| -> Vec<String> {
            let body = &doc["paths"][path]["post"]["requestBody"];
            assert_eq!(body["required"], true, "{path}");
            let schema = &body["content"]["application/x-www-form-urlencoded"]["schema"];
            let required = schema["required"].as_array().unwrap();
            let names: Vec<String> = schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert_eq!(required.len(), names.len(), "{path}: {schema}");
            names
        };
        let page = |a: &crate::support::Answer| String::from_utf8_lossy(&a.body).into_owned();
        let login_page = page(
            &gw.send(Request::get("/login").body(Body::empty()).unwrap())
                .await,
        );
        assert_eq!(fields("/login"), ["token"]);
        assert!(login_page.contains(r#"name="token""#), "{login_page}");
        let urlencoded = Some("application/x-www-form-urlencoded");
        let login = gw
            .send(form("/login", urlencoded, &format!("token={ADMIN_TOKEN}")))
            .await;
        assert_eq!(login.status, StatusCode::SEE_OTHER, "{login:?}");
        let cookie = login.headers["set-cookie"].to_str().unwrap();
        let cookie = cookie.split(';').next().unwrap().to_owned();
        let signed_in = Request::get("/")
            .header("cookie", &cookie)
            .body(Body::empty());
        let overview = page(&gw.send(signed_in.unwrap()).await);
        // Signed in, the form sends the browser on to the dashboard, as documented.
        let again = Request::get("/login").header("cookie", &cookie);
        let again = gw.send(again.body(Body::empty()).unwrap()).await;
        assert_eq!(again.status, StatusCode::SEE_OTHER, "{again:?}");
        let documented = &doc["paths"]["/login"]["get"]["responses"];
        assert!(documented.get("303").is_some(), "{documented}");
        assert_eq!(fields("/logout"), ["csrf"]);
        let csrf = overview
            .split(r#"name="csrf" value=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no csrf field: {overview}"));
        let mut logout = form("/logout", urlencoded, &format!("csrf={csrf}"));
        logout
            .headers_mut()
            .insert("cookie", cookie.parse().unwrap());
        let out = gw.send(logout).await;
        assert_eq!(out.status, StatusCode::SEE_OTHER, "{out:?}");
        assert_eq!(out.headers["location"], "/login");
    });
}

/// The ingress's declared headers are the ones it reads: each header a signed source asks for
/// when it is missing, and each header the default and github rules take an event id from.
#[test]
fn the_ingress_declares_the_headers_it_reads() {
    run(async {
        let gw = TestGateway::new();
        let doc = document(&gw).await;
        let op = &doc["paths"]["/v1/sources/{source}/events"]["post"];
        let declared: Vec<String> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "header")
            .map(|p| p["name"].as_str().unwrap().to_ascii_lowercase())
            .collect();
        let sw = [("webhook-id", "m1"), ("webhook-timestamp", "1767225600")];
        for (source, given) in [
            ("shop", &sw[..0]),
            ("shop", &sw[..1]),
            ("shop", &sw[..2]),
            ("stripe", &[][..]),
            ("github", &[][..]),
        ] {
            let a = gw.send(post(source, given, "{}")).await;
            let detail = a.json()["detail"].as_str().unwrap().to_owned();
            let asked = detail.split('`').nth(1).unwrap_or_else(|| panic!("{a:?}"));
            assert!(
                declared.iter().any(|h| h == asked),
                "{source}: {asked} undeclared"
            );
        }
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        for (source, header, body) in [
            ("open", "idempotency-key", "{}"),
            ("open", "webhook-id", "{}"),
            ("github", "x-github-delivery", "Hello, World!"),
        ] {
            assert!(declared.iter().any(|h| h == header), "{header} undeclared");
            // The header's own name as the id: each post is a new event, named by its header.
            let headers = [(header, header), ("x-hub-signature-256", sig)];
            let a = gw.send(post(source, &headers, body)).await;
            assert_eq!(a.status, StatusCode::ACCEPTED, "{header}: {a:?}");
            assert_eq!(a.json()["event_id"], header, "{header}");
        }
    });
}
