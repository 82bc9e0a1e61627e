//! Where an event's id comes from, by its source's rule: a header, a JSON pointer, fields it
//! is derived from, or by default `Idempotency-Key`, `webhook-id` (or Svix's `svix-id`), then
//! the body's `/id`.

use axum::http::HeaderMap;
use oncebox_core::EventId;
use oncebox_core::fingerprint::{PayloadError, derive_event_id};
use oncebox_core::json::{Pointer, Value};
use oncebox_core::signature::{SVIX_ID, Scheme, WEBHOOK_ID};

use crate::policy::{EventIdRule, SourcePolicy};
use crate::problem::Problem;

/// Whether the id or the ordering guard must read the body as JSON. The default rule reads it
/// only when no header names the id: a `raw` source may take form or text bodies that way.
pub(super) fn needs_json(policy: &SourcePolicy, headers: &HeaderMap) -> bool {
    policy.order.is_some()
        || match policy.event_id {
            EventIdRule::Pointer(_) => true,
            EventIdRule::Default => !default_headers(&policy.scheme)
                .iter()
                .any(|h| headers.contains_key(*h)),
            EventIdRule::Header(_) | EventIdRule::Derive(_) => false,
        }
}

/// The headers the default id rule reads, in order, before the body's `/id`. Svix sends
/// `webhook-id` as `svix-id` unless its account renames it; the signature check reads the same
/// pair the same way (`webhook-` names first), so a signed id is the one taken.
const DEFAULT_ID_HEADERS: [&str; 3] = ["idempotency-key", WEBHOOK_ID, SVIX_ID];

/// The headers the default rule reads on a source of `scheme`: on a signed source only those
/// its signature covers (Standard Webhooks' id), else anyone holding one signed request could
/// send it again under `Idempotency-Key: 1`, `2`, … as new events. The binary's configuration
/// never gives a signed source this rule; a library caller's `SourcePolicy` may.
fn default_headers(scheme: &Scheme) -> &'static [&'static str] {
    match scheme {
        Scheme::None => &DEFAULT_ID_HEADERS,
        Scheme::StandardWebhooks => &DEFAULT_ID_HEADERS[1..],
        _ => &[],
    }
}

pub(super) fn event_id(
    policy: &SourcePolicy,
    headers: &HeaderMap,
    payload: &[u8],
    parsed: Option<&Value>,
) -> Result<EventId, Problem> {
    let invalid = |e: oncebox_core::InvalidKey| Problem::invalid("event-id-invalid", e.to_string());
    // Sent twice (two senders' keys merged, a proxy appending its own), the header names two
    // events: taking the first would pick one silently.
    let from_header = |name: &str| {
        let mut values = headers.get_all(name).iter();
        let first = values.next()?;
        Some(match values.next() {
            None => EventId::from_bytes(first.as_bytes()).map_err(invalid),
            Some(_) => Err(Problem::invalid(
                "event-id-invalid",
                format!("header {name} is sent more than once: which one names the event?"),
            )),
        })
    };
    let missing = |what: &str| Problem::invalid("event-id-missing", format!("no event id: {what}"));
    let id = match &policy.event_id {
        EventIdRule::Header(name) => from_header(name)
            .or_else(|| {
                let svix = name.eq_ignore_ascii_case(WEBHOOK_ID);
                svix.then(|| from_header(SVIX_ID)).flatten()
            })
            .unwrap_or_else(|| Err(missing(&format!("header {name} absent")))),
        EventIdRule::Pointer(p) => {
            from_pointer(parsed, p).unwrap_or_else(|| Err(missing(&format!("{p} absent"))))
        }
        EventIdRule::Derive(pointers) => derive_event_id(payload, pointers)
            .map_err(|e| match e {
                // A body that is not JSON is named as such, as for every other id rule.
                PayloadError::Json(_) => Problem::invalid("invalid-json", e.to_string()),
                _ => Problem::invalid("event-id-missing", e.to_string()),
            })
            .and_then(|id| EventId::new(id).map_err(invalid)),
        EventIdRule::Default => default_headers(&policy.scheme)
            .iter()
            .find_map(|h| from_header(h))
            .or_else(|| from_pointer(parsed, &Pointer::from_tokens(vec!["id".to_owned()])))
            .unwrap_or_else(|| Err(missing("no Idempotency-Key, webhook-id, svix-id or /id"))),
    };
    id?.deliverable().map_err(invalid)
}

/// A string, or an integer (written out in decimal); anything else at the pointer is invalid.
fn from_pointer(parsed: Option<&Value>, p: &Pointer) -> Option<Result<EventId, Problem>> {
    let value = parsed?.pointer(p)?;
    let text = match value {
        Value::String(s) => s.clone(),
        // Past `i64` too: senders with unsigned 64-bit ids exist, and refused, every retry of
        // theirs would be.
        Value::Number(n) => match n.integer_text(EventId::MAX_LEN) {
            Some(text) => text,
            None => {
                return Some(Err(Problem::invalid(
                    "event-id-invalid",
                    format!(
                        "{p} is a number but not an integer of at most {} digits",
                        EventId::MAX_LEN
                    ),
                )));
            }
        },
        _ => {
            return Some(Err(Problem::invalid(
                "event-id-invalid",
                format!("{p} is not a string"),
            )));
        }
    };
    Some(EventId::new(text).map_err(|e| Problem::invalid("event-id-invalid", e.to_string())))
}
