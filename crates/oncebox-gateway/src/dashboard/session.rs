//! The dashboard's session: a signed cookie that stands for the admin token, its per-session
//! CSRF token, the login and logout handlers, and the bridge that lets the dashboard's own
//! JavaScript call the admin API with the session instead of the token.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, Mac};
use oncebox_core::Timestamp;
use oncebox_core::store::EventStore;
use sha2::Sha256;

use super::cookie::{cookie_values, set_cookie};
use crate::Gateway;

/// Name of the session cookie.
pub(crate) const COOKIE: &str = "oncebox_session";
/// Header the dashboard's JavaScript sends the CSRF token in; a cross-site page cannot set it
/// without a CORS preflight, which the gateway never grants.
pub(crate) const CSRF_HEADER: &str = "x-oncebox-csrf";
/// How long a login lasts.
pub(super) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

type HmacSha256 = Hmac<Sha256>;

/// Who is looking at a dashboard page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// Logged in; the page embeds this CSRF token for its actions.
    Session { csrf: String },
    /// No admin token is configured and only loopback peers can connect: the same rule as the
    /// admin API, so no login.
    Open,
    /// A token is configured and the request carries no valid session.
    Login,
    /// No token is configured on a listener others can reach: the admin API is closed, and so
    /// is the dashboard.
    Closed,
}

/// A MAC keyed by the admin token: changing the token ends every session.
fn mac(token: &str, parts: &[&[u8]]) -> HmacSha256 {
    // HMAC accepts keys of any length, so this never fails.
    let mut m = <HmacSha256 as Mac>::new_from_slice(token.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    for p in parts {
        m.update(p);
        // A separator no part contains keeps ("ab", "c") and ("a", "bc") apart.
        m.update(b"\x00");
    }
    m
}

/// A new cookie value for a login at `now`: `expires.nonce.mac`, all lowercase hex or digits.
pub(crate) fn issue(token: &str, now: Timestamp, nonce: [u8; 16]) -> String {
    let expires = now.plus(LIFETIME).millis().to_string();
    let nonce = hex::encode(nonce);
    let tag = mac(token, &[b"session", expires.as_bytes(), nonce.as_bytes()]).finalize();
    format!("{expires}.{nonce}.{}", hex::encode(tag.into_bytes()))
}

/// The session's nonce when `value` is a cookie this token signed and it has not expired. The
/// MAC is checked in constant time.
pub(crate) fn verify(token: &str, value: &str, now: Timestamp) -> Option<String> {
    let mut parts = value.split('.');
    let (expires, nonce, tag) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let tag = hex::decode(tag).ok()?;
    mac(token, &[b"session", expires.as_bytes(), nonce.as_bytes()])
        .verify_slice(&tag)
        .ok()?;
    let expires: i64 = expires.parse().ok()?;
    (now.millis() < expires).then(|| nonce.to_owned())
}

/// The CSRF token of the session with this nonce: derived, so nothing is stored server-side.
pub(crate) fn csrf(token: &str, nonce: &str) -> String {
    hex::encode(
        mac(token, &[b"csrf", nonce.as_bytes()])
            .finalize()
            .into_bytes(),
    )
}

/// Whether `given` is the CSRF token of the session `nonce`, compared in constant time.
pub(crate) fn csrf_ok(token: &str, nonce: &str, given: &str) -> bool {
    hex::decode(given).is_ok_and(|tag| {
        mac(token, &[b"csrf", nonce.as_bytes()])
            .verify_slice(&tag)
            .is_ok()
    })
}

/// Whether `given` is the admin token. Both sides go through the MAC first, so the comparison
/// takes the same time whatever the lengths and contents.
pub(crate) fn token_matches(token: &str, given: &str) -> bool {
    let expected = mac(token, &[b"login", token.as_bytes()])
        .finalize()
        .into_bytes();
    mac(token, &[b"login", given.as_bytes()])
        .verify_slice(&expected)
        .is_ok()
}

/// The session nonce of the first of the request's cookies that is valid now and not logged
/// out.
fn session<S>(gw: &Gateway<S>, headers: &HeaderMap) -> Option<(String, String)> {
    let token = gw.config.admin_token.as_deref()?;
    let (nonce, _) = live(gw, token, headers).next()?;
    Some((token.to_owned(), nonce))
}

/// The sessions of the request's cookies (signed with `token`) that are valid now and not
/// logged out, in the request's order: each nonce with its cookie.
pub(super) fn live<'a, S>(
    gw: &'a Gateway<S>,
    token: &'a str,
    headers: &'a HeaderMap,
) -> impl Iterator<Item = (String, &'a str)> + 'a {
    let now = gw.clock.now();
    cookie_values(headers, COOKIE).filter_map(move |value| {
        let nonce = verify(token, value, now)?;
        (!gw.logouts.ended(&nonce)).then_some((nonce, value))
    })
}

/// Whether the request names the gateway by a loopback name, or names none (a client of
/// HTTP/1.0). Without an admin token this is what keeps a web page out: a page of another site
/// whose DNS answer is later rebound to 127.0.0.1 reaches a loopback listener, but its browser
/// still sends that site's name as `Host`.
pub(crate) fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    host.to_str().is_ok_and(loopback_name)
}

/// Whether the browser that sent the request names a page of a loopback name as its `Origin`
/// (`http://127.0.0.1:8080`). A page of another site whose DNS answer was rebound to this
/// machine names its own site, and sends that as `Host` too.
pub(crate) fn loopback_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    origin
        .and_then(|o| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
        })
        .is_some_and(loopback_name)
}

/// `host[:port]` names this machine's loopback.
fn loopback_name(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // `[::1]:8080`: the address is inside the brackets.
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| match ip {
            std::net::IpAddr::V4(v4) => v4.is_loopback(),
            // `[::ffff:127.0.0.1]`, the IPv4 loopback spelt as IPv6, is loopback too.
            std::net::IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
}

/// Headers a proxy adds to what it forwards.
const FORWARDING: [&str; 5] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
    "via",
];

/// Whether a proxy says it forwarded the request. A TLS proxy on the same machine connects from
/// loopback and, by default (nginx's `proxy_pass http://127.0.0.1:8080`), names the gateway by
/// its loopback address in `Host`: without this, a gateway open to its own machine without a
/// token would be open to everyone the proxy serves.
pub(crate) fn proxied(headers: &HeaderMap) -> bool {
    FORWARDING.iter().any(|h| headers.contains_key(*h))
}

/// What a page request may see.
pub(crate) fn access<S>(gw: &Gateway<S>, headers: &HeaderMap) -> Access {
    match &gw.config.admin_token {
        None if gw.loopback_only && loopback_host(headers) && !proxied(headers) => Access::Open,
        None => Access::Closed,
        Some(_) => match session(gw, headers) {
            Some((token, nonce)) => Access::Session {
                csrf: csrf(&token, &nonce),
            },
            None => Access::Login,
        },
    }
}

/// A state-changing request from a browser must come from the gateway's own pages: when the
/// browser names an `Origin`, its host must be the one the request was sent to, as `Host`
/// says or, behind a proxy that sends its own upstream address as `Host`, as the proxy's
/// `X-Forwarded-Host` says. A cross-site page cannot set that header on a browser's request
/// (a form sets none, and a script's would need a preflight this gateway never grants), and
/// without a token a proxied request is refused before this is asked.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        // Browsers send Origin on every cross-site POST; its absence means a same-origin
        // navigation or a non-browser client, which the cookie and CSRF token still guard.
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    // The first proxy's, where several appended theirs.
    let forwarded = headers
        .get("x-forwarded-host")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim);
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    origin_host.is_some_and(|o| host == Some(o) || forwarded == Some(o))
}

/// `POST /login` with the form field `token`.
pub(crate) async fn login<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    let Some(token) = gw.config.admin_token.as_deref() else {
        return Redirect::to("/").into_response();
    };
    if !same_origin(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    if !token_matches(token, form.token.trim()) {
        let page = super::layout::login_page(Some("That is not the admin token."));
        return (StatusCode::UNAUTHORIZED, page).into_response();
    }
    let value = issue(token, gw.clock.now(), rand::random());
    (
        [(
            header::SET_COOKIE,
            set_cookie(&value, LIFETIME.as_secs(), &headers),
        )],
        Redirect::to("/"),
    )
        .into_response()
}

#[derive(Debug, serde::Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// Runs before the admin guard: a request that carries a valid session cookie *and* that
/// session's CSRF token in [`CSRF_HEADER`] (from the same origin) is let through as if it
/// carried the admin token, whatever `Authorization` it had (a sign-in proxy's own). The
/// cookie alone is never enough, and without both the request's own credential is judged.
pub(crate) async fn bridge<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    // A credential already there (a sign-in proxy in front adds its own, Basic or Bearer, to
    // every request) is replaced: left, it failed the guard, and every call of the page
    // answered 401 to a signed-in operator, sent round from /login back to a page that
    // polled into 401 again. The session with its CSRF token is the whole authority here.
    if let Some((token, nonce)) = session(&gw, headers)
        && let Some(given) = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok())
        && csrf_ok(&token, &nonce, given)
        && (request.method() == Method::GET || same_origin(headers))
        && let Ok(bearer) = HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, bearer);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "s3cret-token";

    #[test]
    fn an_issued_cookie_verifies_until_it_expires() {
        let now = Timestamp(1_000_000);
        let c = issue(T, now, [7; 16]);
        assert_eq!(
            verify(T, &c, now).as_deref(),
            Some(hex::encode([7; 16]).as_str())
        );
        assert_eq!(verify(T, &c, now.plus(LIFETIME)), None);
        assert_eq!(
            verify("other-token", &c, now),
            None,
            "another token's cookie"
        );
    }

    #[test]
    fn a_tampered_cookie_is_refused() {
        let now = Timestamp(1_000_000);
        let c = issue(T, now, [7; 16]);
        let (expires, rest) = c.split_once('.').unwrap();
        let later = format!("{}.{rest}", expires.parse::<i64>().unwrap() + 1);
        assert_eq!(verify(T, &later, now), None);
        for bad in ["", ".", "..", "1.2.3.4", "x.y.zz", &format!("{c}0")] {
            assert_eq!(verify(T, bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn only_the_admin_token_logs_in() {
        assert!(token_matches(T, T));
        assert!(!token_matches(T, "s3cret-toke"));
        assert!(!token_matches(T, ""));
    }

    #[test]
    fn csrf_token_belongs_to_its_session() {
        let a = csrf(T, "aa");
        assert!(csrf_ok(T, "aa", &a));
        assert!(!csrf_ok(T, "bb", &a));
        assert!(!csrf_ok(T, "aa", "not hex"));
        assert!(!csrf_ok(T, "aa", ""));
    }

    #[test]
    fn origin_must_match_host_when_present() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; oncebox_session=x.y.z; b=2"),
        );
        fn all(h: &HeaderMap, name: &str) -> Vec<String> {
            cookie_values(h, name).map(str::to_owned).collect()
        }
        assert_eq!(all(&h, COOKIE), ["x.y.z"]);
        assert!(all(&h, "c").is_empty());
        h.append(
            header::COOKIE,
            HeaderValue::from_static("oncebox_session=u.v.w"),
        );
        assert_eq!(all(&h, COOKIE), ["x.y.z", "u.v.w"], "every one, in order");
    }
}
