//! `POST /v1/sources/{source}/events`: read the body within its limits, verify the signature over
//! the raw bytes, extract the event id and fingerprint, store once, answer per DESIGN §4.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncebox_core::Processed;
use oncebox_core::hops::{self, HOPS_HEADER, HopsError};
use oncebox_core::json::{self, Value};
use oncebox_core::signature::{self, Scheme, SignatureError};
use oncebox_core::store::{EventStore, Ingest, Order};
use oncebox_core::{Event, Key, Meta, Source, Timestamp};

use crate::Gateway;
use crate::body::read_bounded;
use crate::policy::SourcePolicy;
use crate::problem::{Answer, Problem};
use crate::quiet::quietly;

mod event_id;
mod headers;

use event_id::{event_id, needs_json};
use headers::{content_coding, kept};

/// The most request-header bytes an event stores (as `name: value` lines). The server's own
/// read limit is several hundred KiB; past this a request is refused rather than stored, or a
/// source's body limit could be passed in its headers.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

pub(crate) async fn receive<S: EventStore>(
    State(gw): State<Arc<Gateway<S>>>,
    source: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    // The headers are read in place: the `HeaderMap` extractor would copy them all.
    let (parts, body) = request.into_parts();
    let started = Instant::now();
    // A name whose percent-encoding is not UTF-8 names no source either: a 404 like any
    // other unknown name, counted as such, not the router's 400.
    let (source, name) = match source {
        Ok(Path(source)) => {
            let name = Source::new(source.as_str());
            (source, name)
        }
        // Named as sent, still percent-encoded.
        Err(_) => {
            let raw = parts.uri.path().split('/').nth(3).unwrap_or_default();
            (
                raw.to_owned(),
                Err(oncebox_core::InvalidKey::SourceCharacters),
            )
        }
    };
    // Named, but not echoed whole: a path can be tens of kilobytes, escaped twice in the answer.
    let shown = shown_name(&source);
    let answer = match &name {
        // Even zero-config, which opens every name, cannot open this one: say why.
        Err(e) => Answer::Problem(Problem::not_found(
            "unknown-source",
            format!("no source named {shown}: {e}"),
        )),
        Ok(name) => match gw.config.source(name) {
            None => Answer::Problem(Problem::not_found(
                "unknown-source",
                format!("no source named {shown}"),
            )),
            Some(policy) => receive_for(&gw, name, policy, parts, body).await,
        },
    };
    let label = match &name {
        Ok(name) if crate::meter::known(&gw.config, name) => source.as_str(),
        _ => crate::meter::UNKNOWN,
    };
    let installed = gw.metrics.is_some();
    crate::meter::ingest(installed, label, answer.outcome(), Some(started.elapsed()));
    answer.into_response()
}

async fn receive_for<S: EventStore>(
    gw: &Gateway<S>,
    source: &Source,
    policy: &SourcePolicy,
    parts: Parts,
    body: Body,
) -> Answer {
    let headers = &parts.headers;
    // An unsigned source takes anything that reaches it, and browsers reach loopback too: a
    // web page's simple `POST` (no preflight) would be stored and relayed, signed with the
    // route's secret. Senders of webhooks are servers and send no `Origin`; a browser sends
    // one on every `POST`, and one not of this gateway's loopback pages is refused before the
    // body is read: another site's, and also one whose DNS answer was rebound to this machine
    // (its `Host` then names that site too, so the two agree).
    let browser = headers.contains_key(axum::http::header::ORIGIN);
    let own_page = || {
        crate::dashboard::session::same_origin(headers)
            && crate::dashboard::session::loopback_origin(headers)
    };
    if policy.scheme == Scheme::None && browser && !own_page() {
        return Answer::Problem(Problem::new(
            StatusCode::FORBIDDEN,
            "cross-origin",
            "Cross-origin request",
            "a browser sent this from another site's page; an unsigned source takes events \
             only from clients that are not browsers on other origins",
        ));
    }
    let header_bytes = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 3)
        .sum::<usize>();
    if header_bytes > MAX_HEADER_BYTES {
        return Answer::Problem(Problem::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Request headers too large",
            format!(
                "the request's headers take {header_bytes} bytes; an event stores at most \
                 {MAX_HEADER_BYTES}"
            ),
        ));
    }
    // A body in a content coding (gzip, say) would be stored, fingerprinted and relayed as the
    // coded bytes, without the coding: a receiver could not read it, and a JSON source would
    // refuse it as invalid-json, which says nothing of why. Refused for what it is, unread.
    if let Some((header, coding)) = content_coding(headers) {
        return Answer::Problem(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "encoding-unsupported",
            "Content coding not supported",
            format!("the body is sent with {header} {coding:?}; send it uncoded"),
        ));
    }
    // Headers before the body: a request without its signature's headers, or signed too long
    // ago, would fail verification anyway, and refused now it holds no permit and no memory
    // for up to `max_body` bytes while a slow sender trickles them in.
    if let Err(e) = signature::verify_headers(
        &policy.scheme,
        &HeaderLookup(headers),
        gw.clock.now(),
        policy.tolerance,
    ) {
        quietly!(info, %source, error = %e, "signature rejected before the body");
        return Answer::Problem(unauthorized(&e));
    }
    let read = read_bounded(
        headers,
        body,
        policy.max_body,
        &gw.config.limits,
        "this source",
    );
    let payload = match read.await {
        Ok(b) => b,
        Err(p) => return Answer::Problem(p),
    };
    crate::crash::point!("after-body-read");
    let now = gw.clock.now();
    // Authenticity first, over the exact bytes, before parsing anything and before any query:
    // a flood of forged requests costs one HMAC each and never reaches the database.
    let lookup = HeaderLookup(headers);
    if let Err(e) = signature::verify(
        &policy.scheme,
        &policy.secrets,
        &lookup,
        &payload,
        now,
        policy.tolerance,
    ) {
        quietly!(info, %source, error = %e, "signature rejected");
        return Answer::Problem(unauthorized(&e));
    }
    crate::crash::point!("after-signature-check");
    // The loop guard: an event another oncebox relayed here too many times is refused (400,
    // so that relay gives it up as dead rather than trying again).
    let hops = match arrived_hops(headers) {
        Ok(hops) => hops,
        Err(e) => {
            // A loop in the operator's routes, most likely: said where they look.
            quietly!(warn, %source, problem = e.slug(), "event refused: {e}");
            return Answer::Problem(Problem::invalid(e.slug(), e.to_string()));
        }
    };
    // A body the id or the guard needs as JSON must be JSON; one only routes' filters read may
    // be anything else (a `raw` source), and then matches no filter.
    let strict = needs_json(policy, headers);
    let parsed = match (strict || gw.config.routes_read_body(source)).then(|| json::parse(&payload))
    {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(e)) if strict => {
            return Answer::Problem(Problem::invalid("invalid-json", e.to_string()));
        }
        Some(Err(_)) => None,
    };
    let event_id = match event_id(policy, headers, &payload, parsed.as_ref()) {
        Ok(id) => id,
        Err(p) => return Answer::Problem(p),
    };
    let order = match order(source, policy, parsed.as_ref()) {
        Ok(o) => o,
        Err(p) => return Answer::Problem(p),
    };
    let key = Key::new(source.clone(), event_id);
    let mut event = match Event::parsed(key, payload.to_vec(), &policy.fingerprint, parsed.as_ref())
    {
        Ok(e) => e.with_meta(meta(headers, header_bytes, &policy.scheme).with_hops(hops)),
        Err(e) => return Answer::Problem(Problem::invalid("invalid-json", e.to_string())),
    };
    event.recheck.clone_from(&policy.recheck);
    let key = event.key.clone();
    let ingest = Ingest {
        accepted: accepted_body(&event.key, now, false),
        // Only a source with an ordering guard can produce a stale answer.
        stale: if order.is_some() {
            accepted_body(&event.key, now, true)
        } else {
            Vec::new()
        },
        routes: gw.config.routes_for(source, parsed.as_ref()),
        event,
        order,
    };
    // Freed here, on the thread that allocated them: the answer may resume on another one.
    drop((parsed, payload, parts));
    let outcome = gw.store.ingest(ingest).await;
    // The store's own words, for the log only: the client is told the kind (`public_detail`).
    let cause = match &outcome {
        Ok(Processed::Applied(_) | Processed::Duplicate(_) | Processed::Stale) => None,
        Ok(other) => Some(format!("unexpected outcome {other:?}")),
        Err(e) => Some(e.to_string()),
    };
    let answer = Answer::from_outcome(outcome, gw.config.limits.retry_after);
    // The key is logged, never a secret or a payload.
    match &answer {
        Answer::Problem(p) if p.status.is_server_error() => {
            let cause = cause.as_deref().unwrap_or(&p.detail);
            tracing::warn!(%key, %cause, "event not stored");
        }
        Answer::Problem(p) => quietly!(info, %key, problem = p.slug, "event refused"),
        other => tracing::debug!(%key, outcome = other.outcome(), "event stored"),
    }
    answer
}

/// A 401 names a challenge (RFC 9110 §15.5.2 requires one): here the signature the source's
/// scheme carries, which no client answers by itself, only its sender's configuration.
fn unauthorized(e: &SignatureError) -> Problem {
    let problem = match e {
        SignatureError::TimestampOutOfTolerance => Problem::new(
            StatusCode::UNAUTHORIZED,
            "timestamp-out-of-tolerance",
            "Timestamp out of tolerance",
            e.to_string(),
        ),
        _ => Problem::new(
            StatusCode::UNAUTHORIZED,
            "signature-invalid",
            "Signature invalid",
            e.to_string(),
        ),
    };
    problem.challenge("Signature realm=\"oncebox\"")
}

/// The ordering guard applies when both fields are present; an event without them (another
/// kind of object) is not ordered. A version that is not an integer is refused.
fn order(
    source: &Source,
    policy: &SourcePolicy,
    parsed: Option<&Value>,
) -> Result<Option<Order>, Problem> {
    let (Some(guard), Some(doc)) = (&policy.order, parsed) else {
        return Ok(None);
    };
    let order = guard
        .read(doc)
        .map_err(|e| Problem::invalid("order-field-invalid", e.to_string()))?;
    if order.is_none() {
        // Counted and said: a pointer mistyped in the configuration (`/created_at` for
        // `/created`) leaves every event of the source unguarded, which nothing else shows.
        metrics::counter!("oncebox_order_unguarded_total", "source" => source.to_string())
            .increment(1);
        // Debug: a source may mix objects the guard orders with others it does not.
        quietly!(
            debug,
            %source,
            "an event without the ordering guard's fields: applied unordered"
        );
    }
    Ok(order)
}

/// A source name as a refusal shows it: quoted, and cut after 64 characters (a valid name has
/// at most 64), the cut said.
fn shown_name(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{:?}… ({} bytes)", &name[..at], name.len()),
        None => format!("{name:?}"),
    }
}

/// The hops the request says it passed through; of several `oncebox-hops` headers, the most
/// (a sender cannot lower its count by adding one).
fn arrived_hops(headers: &HeaderMap) -> Result<u32, HopsError> {
    hops::highest(headers.get_all(HOPS_HEADER).iter().map(|v| v.as_bytes()))
}

/// `bytes`: the headers' size as lines ("name: value\n"), for one allocation for them all (a
/// little more if some are not kept).
fn meta(headers: &HeaderMap, bytes: usize, scheme: &signature::Scheme) -> Meta {
    let signed = match scheme {
        signature::Scheme::HmacSha256 { header, .. } => Some(header.as_str()),
        _ => None,
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut meta = Meta::new(content_type);
    meta.reserve_headers(bytes);
    for (name, value) in headers {
        // Text as it came, UTF-8 beyond ASCII included (`to_str` takes visible ASCII only);
        // bytes that are no text cannot be shown or sent on as they came, and are not kept.
        let text = std::str::from_utf8(value.as_bytes());
        if let (true, Ok(value)) = (kept(name.as_str(), signed), text) {
            meta.push_header(name.as_str(), value);
        }
    }
    meta
}

/// The 202 body, stored as the first answer and replayed byte for byte. Written directly, in
/// the key order `serde_json` gives a map (sorted), which earlier records hold: building a
/// `serde_json::Value` and printing it was a sixth of the handler's instructions.
pub fn accepted_body(key: &Key, now: Timestamp, stale: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(128 + key.event_id.as_str().len());
    body.extend_from_slice(br#"{"event_id":"#);
    json_string(&mut body, key.event_id.as_str());
    body.extend_from_slice(br#","received_at":""#);
    crate::write_rfc3339(&mut body, now);
    body.extend_from_slice(br#"","source":"#);
    json_string(&mut body, key.source.as_str());
    if stale {
        body.extend_from_slice(br#","stale":true"#);
    }
    body.extend_from_slice(br#","status":"accepted"}"#);
    body
}

/// Appends `s` as a JSON string, escaped as `serde_json` escapes it.
fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a `&str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// The request's headers as the signature schemes read them: the first value of a name.
struct HeaderLookup<'a>(&'a HeaderMap);

impl signature::Headers for HeaderLookup<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.get(name).map(|v| v.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use oncebox_core::{Key, Timestamp};

    /// The body written by hand is byte for byte what the `serde_json` map gave, which stored
    /// records hold and replays repeat.
    #[test]
    fn the_accepted_body_matches_the_serde_json_form() {
        let tricky = ["evt_1", "a\"quote\\slash", "ünï\u{2028}x", "</script>"];
        for id in tricky {
            let key = Key::parse("stripe", id).unwrap();
            let now = Timestamp(1_700_000_000_123);
            for stale in [false, true] {
                let mut expected = serde_json::json!({
                    "status": "accepted",
                    "source": key.source.as_str(),
                    "event_id": key.event_id.as_str(),
                    "received_at": crate::rfc3339(now),
                });
                if stale {
                    expected["stale"] = serde_json::Value::Bool(true);
                }
                assert_eq!(
                    String::from_utf8(super::accepted_body(&key, now, stale)).unwrap(),
                    expected.to_string()
                );
            }
        }
    }
}
