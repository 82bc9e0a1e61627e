//! What `send` and `bench` share as clients of a running gateway: its base URL, test event
//! bodies that carry the event id where the source's rule reads it, and requests that carry
//! it in a header and signed.

use anyhow::{Context, Result};
use oncebox_core::Timestamp;
use oncebox_core::fingerprint::derive_event_id;
use oncebox_core::json::Pointer;
use oncebox_core::signature::sign;
use oncebox_gateway::policy::{EventIdRule, SourcePolicy};
use serde_json::{Map, Value};

use crate::config::Settings;

/// How a command talks to a gateway over HTTP: redirects are not followed. The gateway never
/// answers 3xx, so one comes from something in between (a sign-in proxy, say), and followed,
/// the POST of an event became a GET whose 200 read as the event's acceptance: `send` printed
/// success for an event no gateway saw.
pub fn http() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// The gateway's base URL without a trailing `/`: `url` (the `--url` flag), else
/// `http://<listen>`. One that is not `http(s)://HOST…` is the caller's mistake (exit 2), said
/// so here rather than as the HTTP client's "relative URL without a base" (exit 1).
pub fn gateway_base(url: Option<&str>, settings: &Settings) -> Result<String> {
    let Some(url) = url else {
        return Ok(format!("http://{}", settings.listen));
    };
    if !crate::config::http_url(url) {
        return Err(crate::exit::usage(format!(
            "--url {}: expected the gateway's base URL, e.g. http://127.0.0.1:8080",
            crate::config::redact_url(url)
        )));
    }
    // A path is a prefix (a gateway behind a proxy at `/oncebox`); a query or a fragment would
    // end up in the middle of every request's URL.
    if reqwest::Url::parse(url).is_ok_and(|u| u.query().is_some() || u.fragment().is_some()) {
        return Err(crate::exit::usage(format!(
            "--url {}: a base URL takes no query or fragment, e.g. http://127.0.0.1:8080/prefix",
            crate::config::redact_url(url)
        )));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// The header a request for `policy`'s source carries the event id in, if any: the one its
/// rule reads, or the scheme's own (Standard Webhooks signs `webhook-id`).
pub fn id_header(policy: &SourcePolicy) -> Option<&str> {
    match &policy.event_id {
        EventIdRule::Header(name) => Some(name.as_str()),
        EventIdRule::Default => Some("idempotency-key"),
        _ if policy.scheme == oncebox_core::signature::Scheme::StandardWebhooks => {
            Some("webhook-id")
        }
        _ => None,
    }
}

/// `request` with the event's id where `policy` reads it from a header, and signed by the
/// source's first secret as `now`. The id goes once: a scheme that signs it (`webhook-id`)
/// already carries it, and the gateway refuses an id header sent twice.
pub fn identified(
    mut request: reqwest::RequestBuilder,
    policy: &SourcePolicy,
    id: &str,
    body: &[u8],
    now: Timestamp,
) -> reqwest::RequestBuilder {
    let signed = match policy.secrets.first() {
        Some(secret) => sign(&policy.scheme, secret, id, now, body),
        None => Vec::new(),
    };
    let carried = |name: &&str| signed.iter().any(|(s, _)| s.eq_ignore_ascii_case(name));
    if let Some(name) = id_header(policy).filter(|n| !carried(n)) {
        request = request.header(name, id);
    }
    for (name, value) in signed {
        request = request.header(name, value);
    }
    request
}

/// Sets `id` in `doc` wherever `rule` reads the event id from the body: at its JSON pointer,
/// or at each field a derived id is computed from (a unique id there makes the derived id
/// unique too). Header rules read no body field, and `doc` is left as it is.
pub fn place_id(rule: &EventIdRule, doc: &mut Value, id: &str) {
    match rule {
        EventIdRule::Pointer(p) => set(doc, p.tokens(), Value::String(id.to_owned())),
        EventIdRule::Derive(pointers) => {
            for p in pointers {
                set(doc, p.tokens(), Value::String(id.to_owned()));
            }
        }
        _ => {}
    }
}

/// The id the gateway stores `body` under when the sender's id is `id`: the derived one for
/// a derived rule, else `id` itself (a body built by [`place_id`] holds it at the pointer).
pub fn stored_id(rule: &EventIdRule, body: &str, id: &str) -> Result<String> {
    match rule {
        EventIdRule::Derive(pointers) => {
            derive_event_id(body.as_bytes(), pointers).context("deriving the event id")
        }
        _ => Ok(id.to_owned()),
    }
}

/// The id a body given by hand holds at `p`, as the gateway reads one: a string, or an
/// integer. `None` when it holds none (the gateway's answer then says why).
pub fn id_at(p: &Pointer, body: &str) -> Option<String> {
    let doc = oncebox_core::json::parse(body.as_bytes()).ok()?;
    match doc.pointer(p)? {
        oncebox_core::json::Value::String(s) => Some(s.clone()),
        oncebox_core::json::Value::Number(n) => n.integer_text(oncebox_core::EventId::MAX_LEN),
        _ => None,
    }
}

/// Sets the value at a JSON pointer, creating objects on the way; the root cannot be set.
fn set(doc: &mut Value, tokens: &[String], value: Value) {
    let Some((last, path)) = tokens.split_last() else {
        return;
    };
    let mut at = doc;
    for token in path {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else { return };
        at = map
            .entry(token.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    if let Value::Object(map) = at {
        map.insert(last.clone(), value);
    }
}
