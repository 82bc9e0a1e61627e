//! A gateway open without a token on a loopback listener, behind a proxy on the same machine:
//! the proxy connects from loopback and, by default, sends the gateway's own loopback address
//! as `Host`, so only its forwarding headers tell its requests from this machine's own clients.
//! With a token, the dashboard's forms work through such a proxy: the browser's `Origin` is
//! checked against the proxy's `X-Forwarded-Host`, and the session cookie is `Secure` when the
//! proxy says the browser came over TLS.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncebox_testkit::run;

use crate::support::{ADMIN_TOKEN, TestGateway, local_get};

/// What a proxy adds, one header at a time.
const FORWARDED: [(&str, &str); 5] = [
    ("forwarded", "for=203.0.113.7;proto=https"),
    ("x-forwarded-for", "203.0.113.7"),
    ("x-forwarded-host", "gw.example.com"),
    ("x-real-ip", "203.0.113.7"),
    ("via", "1.1 nginx"),
];

fn request(path: &str, forwarded: Option<(&'static str, &str)>) -> Request<Body> {
    let mut r = local_get(path);
    if let Some((name, value)) = forwarded {
        r.headers_mut().insert(name, value.parse().unwrap());
    }
    r
}

#[test]
fn a_proxied_request_finds_the_tokenless_admin_api_and_dashboard_closed() {
    run(async {
        let gw = TestGateway::tokenless();
        let ask = async |r: Request<Body>| gw.send_local(r).await;
        // This machine's own clients: open.
        assert_eq!(ask(request("/v1/stats", None)).await.status, StatusCode::OK);
        assert_eq!(ask(request("/", None)).await.status, StatusCode::OK);
        for header in FORWARDED {
            let a = ask(request("/v1/stats", Some(header))).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::FORBIDDEN, "proxied"),
                "{header:?}: {a:?}"
            );
            let page = ask(request("/", Some(header))).await;
            assert_eq!(page.status, StatusCode::FORBIDDEN, "{header:?}");
            assert!(
                String::from_utf8_lossy(&page.body).contains("no proxy"),
                "the closed page says why"
            );
        }
        // The probes stay open to the proxy: they show nothing stored.
        let health = ask(request("/healthz", Some(FORWARDED[0]))).await;
        assert_eq!(health.status, StatusCode::OK);
    });
}

#[test]
fn a_login_through_a_proxy_is_checked_against_the_host_it_forwards() {
    run(async {
        let gw = TestGateway::new();
        let login = |forwarded: Option<&str>| {
            let mut r = Request::post("/login")
                .header("content-type", "application/x-www-form-urlencoded")
                .header("host", "127.0.0.1:8080")
                .header("origin", "https://oncebox.example.com");
            if let Some(f) = forwarded {
                r = r.header("x-forwarded-host", f);
            }
            r.body(Body::from(format!("token={ADMIN_TOKEN}"))).unwrap()
        };
        let through = gw.send(login(Some("oncebox.example.com"))).await;
        assert_eq!(through.status, StatusCode::SEE_OTHER, "{through:?}");
        let chained = gw.send(login(Some("oncebox.example.com, 10.0.0.2"))).await;
        assert_eq!(chained.status, StatusCode::SEE_OTHER, "{chained:?}");
        for other in [Some("evil.example"), None] {
            let r = gw.send(login(other)).await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{other:?}: {r:?}");
        }
    });
}

/// Behind a TLS proxy the session cookie is `Secure`, so the browser never sends it back over
/// plain HTTP; straight to the gateway, or through a proxy the browser reached over HTTP, it
/// cannot be (the browser would drop it).
#[test]
fn the_session_cookie_is_secure_when_a_proxy_says_the_browser_came_over_tls() {
    run(async {
        let gw = TestGateway::new();
        let post = |path: &str, body: String, headers: &[(&str, &str)]| {
            let mut r = Request::post(path)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("host", "127.0.0.1:8080");
            for (name, value) in headers {
                r = r.header(*name, *value);
            }
            r.body(Body::from(body)).unwrap()
        };
        let cookie = |headers: &[(&str, &str)]| {
            let r = post("/login", format!("token={ADMIN_TOKEN}"), headers);
            async {
                let r = gw.send(r).await;
                assert_eq!(r.status, StatusCode::SEE_OTHER, "{r:?}");
                r.headers["set-cookie"].to_str().unwrap().to_owned()
            }
        };
        let tls: [&[(&str, &str)]; 4] = [
            &[("x-forwarded-proto", "https")],
            &[("x-forwarded-proto", "HTTPS, http")],
            &[("forwarded", "for=203.0.113.7;proto=https")],
            &[(
                "forwarded",
                "for=\"[2001:db8::1]\";Proto=\"https\", proto=http",
            )],
        ];
        for headers in tls {
            let c = cookie(headers).await;
            assert!(c.ends_with("; Secure"), "{headers:?}: {c}");
        }
        let plain: [&[(&str, &str)]; 4] = [
            &[],
            &[("x-forwarded-proto", "http")],
            &[("x-forwarded-proto", "http, https")],
            &[("forwarded", "for=203.0.113.7;proto=http, proto=https")],
        ];
        for headers in plain {
            let c = cookie(headers).await;
            assert!(!c.contains("Secure"), "{headers:?}: {c}");
        }
        // The logout's clearing cookie carries it too: a cookie set `Secure` is replaced only
        // by one that is.
        let via = [("x-forwarded-proto", "https")];
        let pair = cookie(&via).await.split(';').next().unwrap().to_owned();
        let page = gw
            .send(
                Request::get("/")
                    .header("cookie", &pair)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        let html = String::from_utf8_lossy(&page.body).into_owned();
        let csrf = html
            .split(r#"name="oncebox-csrf" content=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the page carries its CSRF token")
            .to_owned();
        let out = gw
            .send(post(
                "/logout",
                format!("csrf={csrf}"),
                &[("cookie", &pair), ("x-forwarded-proto", "https")],
            ))
            .await;
        assert_eq!(out.status, StatusCode::SEE_OTHER, "{out:?}");
        let cleared = out.headers["set-cookie"].to_str().unwrap();
        assert!(
            cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"),
            "{cleared}"
        );
    });
}
