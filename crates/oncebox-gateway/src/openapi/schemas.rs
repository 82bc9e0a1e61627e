//! The document's components and the parameters several operations share: bodies as the handlers
//! write them, and keys, filters and headers as the handlers read them.

use serde_json::{Value, json};

/// A source name as `Source::new` takes it: a lowercase slug of at most 64 bytes (all ASCII, so
/// the pattern's count is the byte count).
const SOURCE_PATTERN: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";

/// Characters no event id contains: `char::is_control` (C0, DEL, C1).
const CONTROL: &str = r"\u0000-\u001F\u007F-\u009F";

/// The whitespace of `char::is_whitespace` that is not also a control character: an id of
/// nothing else is refused. Spelt out, not `\s`, which also takes U+FEFF, a valid id on its own.
const BLANK: &str = r" \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000";

/// `EventId::new`'s rules but its length in bytes: no control character, one that is not blank.
fn event_id_pattern() -> String {
    format!("^[^{CONTROL}]*[^{CONTROL}{BLANK}][^{CONTROL}]*$")
}

/// The schema of a `{source}` path segment.
pub(super) fn source() -> Value {
    json!({ "type": "string", "pattern": SOURCE_PATTERN })
}

/// The schema of an `{event_id}` path segment. `maxLength` counts characters, the rule bytes:
/// every id it refuses is refused, but not every id it takes is taken.
pub(super) fn event_id() -> Value {
    json!({ "type": "string", "minLength": 1, "maxLength": 255, "pattern": event_id_pattern() })
}

/// What a path parameter's description says, by its name.
pub(super) fn path_description(name: &str) -> Option<&'static str> {
    match name {
        "source" => Some("a source's name: a lowercase slug of 1 to 64 bytes"),
        "event_id" => Some(
            "the sender's event id, percent-encoded: 1 to 255 bytes of UTF-8 (maxLength counts \
             characters, so fewer multi-byte ones fit), no control characters (C0, DEL, C1), \
             not whitespace alone",
        ),
        _ => None,
    }
}

/// What a list filter's description adds: the list handlers read an empty value as none.
const EMPTY: &str = "; empty is the same as not given";

/// The `source` filter of `GET /v1/events`.
pub(super) fn source_filter() -> Value {
    json!({ "name": "source", "in": "query", "schema": source(), "allowEmptyValue": true,
            "description": format!("only this source's events{EMPTY}") })
}

/// The `route` filter of `GET /v1/deliveries`. A name with a control character is refused (no
/// route's name holds one, and PostgreSQL cannot bind a NUL), not answered with an empty page.
pub(super) fn route_filter() -> Value {
    json!({ "name": "route", "in": "query", "allowEmptyValue": true,
            "schema": { "type": "string", "pattern": format!("^[^{CONTROL}]*$") },
            "description": format!(
                "only this route's deliveries; no control characters (C0, DEL, C1): 400 \
                 invalid-query{EMPTY}") })
}

/// The cursor of a list.
pub(super) fn after() -> Value {
    json!({ "name": "after", "in": "query", "schema": { "type": "integer", "format": "int64" },
            "allowEmptyValue": true,
            "description": format!("the `next` of the page before: only items after it{EMPTY}") })
}

/// The page size of a list. A number above 500 is not refused but taken as 500; the `maximum`
/// is what parses at all (2^64 - 1).
pub(super) fn limit() -> Value {
    json!({ "name": "limit", "in": "query",
            "schema": { "type": "integer", "minimum": 0, "maximum": u64::MAX },
            "allowEmptyValue": true,
            "description": format!(
                "items per page, 50 when not given; 0 is taken as 1 and a number above 500 as \
                 500 (one past 2^64 - 1 does not parse: 400 invalid-query){EMPTY}") })
}

/// The headers the ingress may read an event id from, held to an id's length as far as
/// `maxLength` (characters) can say it (the rule counts bytes, as the descriptions say).
const ID_HEADERS: [&str; 2] = ["Idempotency-Key", "webhook-id"];

/// The headers the ingress reads an event id or a signature from; none is required of every
/// source, and a source may name another header for its id or its `hmac-sha256` signature.
const INGRESS_HEADERS: [(&str, &str); 8] = [
    (
        "Idempotency-Key",
        "the event id, for a source with the default id rule (read first); as an id: 1 to 255 \
         bytes of UTF-8, no control characters",
    ),
    (
        "webhook-id",
        "Standard Webhooks: the message id, signed; the event id of a standard-webhooks source, \
         and of a default-rule one without Idempotency-Key; as an id: 1 to 255 bytes of UTF-8, \
         no control characters",
    ),
    (
        "webhook-timestamp",
        "Standard Webhooks: the send time in Unix seconds, signed; within the source's tolerance",
    ),
    (
        "webhook-signature",
        "Standard Webhooks: `v1,<base64>` entries separated by spaces (at most 64)",
    ),
    (
        "Stripe-Signature",
        "Stripe: `t=<seconds>,v1=<hex>[,v1=<hex>…]` over `{t}.{body}`; t within the source's \
         tolerance",
    ),
    (
        "X-Hub-Signature-256",
        "GitHub: `sha256=<hex>`, the HMAC of the raw body",
    ),
    (
        "X-GitHub-Delivery",
        "GitHub: the event id of a source with the github preset",
    ),
    (
        "oncebox-hops",
        "The loop guard: how many oncebox relays passed this event on (a decimal count; an \
         oncebox relay sends it). 16 or more is refused as hop-limit; of several, the highest \
         counts",
    ),
];

/// [`INGRESS_HEADERS`] as the ingress operation's parameters.
pub(super) fn ingress_headers() -> Value {
    INGRESS_HEADERS
        .iter()
        .map(|(name, description)| {
            let schema = if ID_HEADERS.contains(name) {
                json!({ "type": "string", "minLength": 1, "maxLength": 255 })
            } else if *name == "oncebox-hops" {
                // The counts the ingress takes: 0 to 15, leading zeros and surrounding blanks
                // allowed; anything else is refused (hops-invalid, hop-limit).
                json!({ "type": "string", "pattern": "^[ \\t]*0*(1[0-5]|[0-9])[ \\t]*$" })
            } else {
                json!({ "type": "string" })
            };
            json!({ "name": name, "in": "header", "required": false,
                    "schema": schema, "description": description })
        })
        .collect()
}

/// A form body the dashboard posts: every field named, each a string.
pub(super) fn form(fields: &[(&str, &str)]) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(name, description)| {
            let field = json!({ "type": "string", "description": description });
            ((*name).to_owned(), field)
        })
        .collect();
    let required: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
    json!({ "required": true, "content": { "application/x-www-form-urlencoded": { "schema": {
        "type": "object", "properties": properties, "required": required } } } })
}

/// A reference to one of [`components`]' schemas.
pub(super) fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// A JSON body of one of [`components`]' schemas.
pub(super) fn body(description: &str, name: &str) -> Value {
    json!({ "description": description,
            "content": { "application/json": { "schema": schema(name) } } })
}

/// A time as `crate::rfc3339` writes it, or `null` when `nullable`.
fn time(nullable: bool) -> Value {
    let kind = if nullable {
        json!(["string", "null"])
    } else {
        json!("string")
    };
    json!({ "type": kind, "format": "date-time" })
}

/// A page of a list: its items and the cursor of the next page (`null` on the last).
fn page(item: &str) -> Value {
    json!({ "type": "object", "required": ["items", "next"], "properties": {
        "items": { "type": "array", "items": schema(item) },
        "next": { "type": ["string", "null"],
                  "description": "the `after` of the next page, in decimal; null on the last" } } })
}

/// The document's `components`: its security schemes and the bodies the handlers write.
pub(super) fn components() -> Value {
    let text = json!({ "type": "string" });
    let text_or_null = json!({ "type": ["string", "null"] });
    let integer = json!({ "type": "integer", "format": "int64" });
    json!({
        "securitySchemes": {
            "bearer": { "type": "http", "scheme": "bearer", "description":
                "`Authorization: Bearer <admin_token>`. A gateway with no admin_token answers \
                 the admin API without one, but only on a loopback-only listener and only its \
                 own machine's clients; this document does not say which a gateway is" },
            "session": { "type": "apiKey", "in": "cookie", "name": "oncebox_session" },
            "csrf": { "type": "apiKey", "in": "header", "name": "X-Oncebox-CSRF", "description":
                "the dashboard session's CSRF token, which its pages carry; with the session's \
                 cookie it stands for the admin token (a request that changes something must \
                 also come from the gateway's own origin)" } },
        "schemas": {
            "Problem": { "type": "object", "required": ["type", "title", "status", "detail"],
                "properties": {
                    "type": { "type": "string", "description": "urn:oncebox:problem:<slug>" },
                    "title": text, "status": { "type": "integer" }, "detail": text } },
            "Accepted": { "type": "object",
                "required": ["status", "source", "event_id", "received_at"], "properties": {
                    "status": { "const": "accepted" }, "source": text, "event_id": text,
                    "received_at": time(false),
                    "stale": { "const": true, "description": "only on a stale event's answer" } } },
            "Event": { "type": "object", "required": ["seq", "source", "event_id", "state",
                    "received_at", "completed_at", "fingerprint", "content_type", "conflicts"],
                "properties": {
                    "seq": integer, "source": text, "event_id": text,
                    "state": { "type": "string",
                        "description": "processing, completed, rejected, stale or uncertain" },
                    "received_at": time(false), "completed_at": time(true),
                    "fingerprint": text_or_null, "content_type": text_or_null,
                    "conflicts": { "type": "integer", "description": "reuses of its key with \
                                   another payload" } } },
            "EventDetail": { "allOf": [schema("Event"), { "type": "object",
                "required": ["payload", "payload_encoding", "headers", "response", "deliveries"],
                "properties": {
                    "payload": text, "payload_encoding": { "enum": ["text", "hex"] },
                    "headers": { "type": "array", "description": "[name, value] as received, less those that carry credentials (never stored)",
                        "items": { "type": "array", "items": text, "minItems": 2, "maxItems": 2 } },
                    "response": { "type": ["object", "null"],
                        "required": ["kind", "status", "body"], "properties": {
                            "kind": text, "status": { "const": 202 }, "body": text } },
                    "deliveries": { "type": "array", "items": { "allOf": [schema("Delivery"),
                        { "type": "object", "required": ["attempt_log"], "properties": {
                            "attempt_log": { "type": "array", "items": schema("Attempt") } } }] } }
                } }] },
            "EventPage": page("Event"),
            "Delivery": { "type": "object", "required": ["id", "route", "source", "event_id",
                    "idempotency_key", "state", "attempts", "created_at", "next_attempt_at",
                    "last_status", "last_error", "note", "hops"],
                "properties": {
                    "id": integer, "route": text, "source": text, "event_id": text,
                    "idempotency_key": text,
                    "state": { "enum": oncebox_core::delivery::DeliveryState::NAMES },
                    "attempts": { "type": "integer", "minimum": 0 },
                    "created_at": time(false), "next_attempt_at": time(true),
                    "last_status": { "type": ["integer", "null"] },
                    "last_error": text_or_null, "note": text_or_null,
                    "hops": { "type": "integer", "minimum": 1,
                        "description": "what its requests carry in oncebox-hops (the loop guard)" } } },
            "DeliveryPage": page("Delivery"),
            "Attempt": { "type": "object",
                "required": ["started_at", "duration_ms", "status", "error"], "properties": {
                    "started_at": time(false), "duration_ms": { "type": "integer", "minimum": 0 },
                    "status": { "type": ["integer", "null"] }, "error": text_or_null } },
            "Resolve": { "type": "object", "required": ["outcome"], "properties": {
                "outcome": { "enum": ["delivered", "dead"] },
                "note": { "type": ["string", "null"], "pattern": r"^[^\u0000]*$",
                          "description": "free text without a NUL (PostgreSQL keeps none); \
                                          absent, null and empty all keep the note the \
                                          delivery had" } } }
        }
    })
}
