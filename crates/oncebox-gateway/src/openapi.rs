//! `GET /openapi.json`: the OpenAPI 3.1 description of every endpoint the router serves.

use axum::Json;
use serde_json::{Value, json};

mod schemas;

/// A dashboard page: HTML for a session signed in with the admin token at `/login` (a browser
/// sends no bearer header on a navigation), else a redirect to `/login`.
fn page(summary: &str) -> Value {
    let html =
        |description: &str| json!({ "description": description, "content": { "text/html": {} } });
    json!({ "get": { "summary": summary, "tags": ["dashboard"], "security": [{ "session": [] }],
        "responses": { "200": html("HTML page"),
                       "303": { "description": "not signed in: to /login" },
                       "400": html("a filter or key that does not parse, named on the page"),
                       "403": html(CLOSED),
                       "404": html("no such event or queue"),
                       "503": { "description": "too many requests in flight (problem+json, with Retry-After), or the store cannot answer now (a page saying so)",
                                "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } }, "text/html": {} } } } } })
}

/// [`page`] with the query parameters it reads: (name, schema, whether required, description).
fn page_with(summary: &str, query: &[(&str, Value, bool, &str)]) -> Value {
    let mut op = page(summary);
    let params: Vec<Value> = query
        .iter()
        .map(|(name, schema, required, description)| {
            json!({ "name": name, "in": "query", "required": required, "schema": schema,
                    "description": description })
        })
        .collect();
    op["get"]["parameters"] = json!(params);
    op
}

/// The dashboard's filters and cursors, as its pages read them.
fn page_query() -> [(&'static str, Value, bool, &'static str); 5] {
    let ranges: Vec<&str> = crate::dashboard::RANGES.iter().map(|(v, _)| *v).collect();
    // Empty is the pages' own "any" (their form's first choice, and what their next-page links
    // carry when no outcome was chosen).
    let outcomes: Vec<&str> = std::iter::once("")
        .chain(crate::dashboard::OUTCOMES.iter().copied())
        .collect();
    [
        (
            "source",
            json!({ "type": "string" }),
            false,
            "only this source's events",
        ),
        (
            "outcome",
            json!({ "enum": outcomes }),
            false,
            "only events in this state, or with refused payloads (`conflict`); empty: any",
        ),
        (
            "since",
            json!({ "enum": ranges }),
            false,
            "only events that arrived within this time",
        ),
        (
            "after",
            json!({ "type": "integer" }),
            false,
            "the cursor of the next page, as its link gives it",
        ),
        (
            "event_id",
            json!({ "type": "string" }),
            false,
            "with `source`: only this key's conflicts",
        ),
    ]
}

/// Why a dashboard page is closed.
const CLOSED: &str = "closed: no admin token, and the listener is beyond loopback, the request \
                      names another host, or a proxy forwarded it";

/// The dashboard's queues: the delivery states it lists (the admin API lists every state).
const QUEUES: [&str; 2] = ["uncertain", "dead"];

fn problem(description: &str) -> Value {
    json!({ "description": description, "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } } })
}

/// Every path and method of the router; the test suite checks that each one is routed.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/sources/{source}/events"),
    ("get", "/v1/events"),
    ("get", "/v1/sources/{source}/events/{event_id}"),
    ("get", "/v1/stats"),
    ("get", "/v1/activity"),
    ("get", "/v1/deliveries"),
    ("post", "/v1/deliveries/{id}/retry"),
    ("post", "/v1/deliveries/{id}/resolve"),
    ("post", "/v1/sources/{source}/events/{event_id}/redeliver"),
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/openapi.json"),
    ("get", "/"),
    ("get", "/events"),
    ("get", "/events/{source}/{event_id}"),
    ("get", "/event"),
    ("get", "/deliveries/{state}"),
    ("get", "/conflicts"),
    ("get", "/config"),
    ("get", "/login"),
    ("post", "/login"),
    ("post", "/logout"),
    ("get", "/assets/dashboard.js"),
    ("get", "/assets/dashboard.css"),
];

pub(crate) async fn document() -> Json<Value> {
    Json(spec())
}

/// The description itself. Every operation also gets its path's parameters, every POST the
/// `408` and `413` of its body, and, but for `/healthz`, the `503` of the concurrency limit,
/// which the edge (`limit.rs`) answers on every other route.
pub fn spec() -> Value {
    let mut doc = described();
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                complete(path, method, op);
            }
        }
    }
    doc
}

/// The names of a path template's parameters: `{source}` and `{event_id}` in
/// `/v1/sources/{source}/events/{event_id}`.
pub fn template_names(path: &str) -> Vec<&str> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .collect()
}

/// The schema of a path parameter, by its name.
fn path_schema(name: &str) -> Value {
    match name {
        "id" => json!({ "type": "integer", "format": "int64" }),
        "state" => json!({ "enum": QUEUES }),
        "source" => schemas::source(),
        "event_id" => schemas::event_id(),
        _ => json!({ "type": "string" }),
    }
}

const DELIVERY_STATES: [&str; 6] = oncebox_core::delivery::DeliveryState::NAMES;

/// Adds to one operation what every operation on `path` answers or takes.
fn complete(path: &str, method: &str, op: &mut Value) {
    let Some(op) = op.as_object_mut() else {
        return;
    };
    let params = op.entry("parameters").or_insert_with(|| json!([]));
    if let Some(params) = params.as_array_mut() {
        for name in template_names(path) {
            let declared = params
                .iter()
                .any(|p| p["in"] == "path" && p["name"] == name);
            if !declared {
                let mut param = json!({ "name": name, "in": "path", "required": true, "schema": path_schema(name) });
                if let Some(description) = schemas::path_description(name) {
                    param["description"] = json!(description);
                }
                params.push(param);
            }
        }
        if params.is_empty() {
            op.remove("parameters");
        }
    }
    // The admin API's operations: those whose security names the bearer scheme.
    let admin = op
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|schemes| schemes.iter().any(|s| s.get("bearer").is_some()));
    if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
        if admin {
            responses.entry("403").or_insert_with(|| {
                problem(
                    "admin-disabled: no admin_token is configured and the listener is not \
                     loopback-only; host-not-loopback: without a token, a request addressed to \
                     a name other than localhost, 127.0.0.1 or [::1]; proxied: without a token, \
                     a request a proxy forwarded (Forwarded, X-Forwarded-For, X-Forwarded-Host, \
                     X-Real-IP or Via); cross-origin: without a token, a browser's request that \
                     changes something from another origin",
                )
            });
            if let Some(refused) = responses.remove("401") {
                responses.insert("401".into(), challenge(refused, "Bearer realm=\"oncebox\""));
            }
        }
        // Every body is read whole within the body timeout and a size limit (`body.rs`): on the
        // admin API and the dashboard, of every method (a GET may carry one too).
        if method == "post" || !matches!(path, "/healthz" | "/readyz" | "/openapi.json") {
            responses.entry("408").or_insert_with(|| {
                problem("body-timeout: the body did not arrive within the body timeout")
            });
            responses.entry("413").or_insert_with(|| {
                problem("body-too-large: past 64 KiB (an event: its source's limit)")
            });
        }
        // `/healthz` is admitted past the limit and has nothing that could be unavailable.
        if path != "/healthz" {
            let busy = responses.remove("503").unwrap_or_else(|| {
                problem("unavailable: too many requests in flight, or the store cannot answer now")
            });
            // Every 503 carries it, a dashboard page's too.
            responses.insert("503".into(), retry_after(busy));
        }
    }
}

/// A 401 that names its challenge, as RFC 9110 §15.5.2 requires of every one.
fn challenge(mut response: Value, scheme: &str) -> Value {
    response["headers"]["WWW-Authenticate"] =
        json!({ "required": true, "schema": { "type": "string", "const": scheme } });
    response
}

/// A response that carries `Retry-After` (seconds), on every answer.
fn retry_after(mut response: Value) -> Value {
    response["headers"]["Retry-After"] = json!({ "description": "seconds to wait before trying again", "required": true,
                                                 "schema": { "type": "integer", "minimum": 1 } });
    response
}

fn described() -> Value {
    // Either the token, or a dashboard session's cookie with its CSRF token beside it (from
    // the same origin, for what changes something): the cookie alone is never enough.
    let admin = json!([{ "bearer": [] }, { "session": [], "csrf": [] }]);
    let query = page_query();
    let list = json!([schemas::source_filter(), schemas::after(), schemas::limit()]);
    let deliveries = json!([
        { "name": "state", "in": "query", "schema": { "enum": DELIVERY_STATES }, "allowEmptyValue": true,
          "description": "only deliveries in this state; empty is the same as not given" },
        schemas::route_filter(), schemas::after(), schemas::limit()]);
    // Both forms are read by axum's `Form`: another content type is refused before the handler.
    let unsupported = problem(
        "unsupported-media-type: the body is not sent as application/x-www-form-urlencoded",
    );
    let unprocessable =
        problem("unprocessable: a form that does not parse into its fields (one given twice)");
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "oncebox gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A method a path does not serve is answered 405 method-not-allowed (problem+json), with an Allow header naming the methods it does.",
        },
        "components": schemas::components(),
        "paths": {
            "/v1/sources/{source}/events": { "post": {
                "summary": "Receive one webhook event: verified, deduplicated, stored before the answer",
                "description": "The event id comes from the source's rule: by default Idempotency-Key, else webhook-id (or Svix's svix-id), else the body's /id; a source may name another header or a JSON pointer, or derive it from fields. The signature headers are those of the source's scheme (an hmac-sha256 source names its own).",
                "parameters": schemas::ingress_headers(),
                "requestBody": { "required": true, "content": { "*/*": {} } },
                "responses": {
                    "202": { "description": "Accepted (new, stale with \"stale\": true, or replayed byte for byte with Idempotent-Replayed: true)",
                             "headers": { "Idempotent-Replayed": { "schema": { "const": "true" } } },
                             "content": { "application/json": { "schema": schemas::schema("Accepted") } } },
                    "400": problem("event-id-missing, event-id-invalid, invalid-json, order-field-invalid, body-unreadable, hop-limit (oncebox-hops: the event went round through oncebox relays 16 times), hops-invalid"),
                    "401": challenge(problem("signature-invalid, timestamp-out-of-tolerance"), "Signature realm=\"oncebox\""),
                    "403": problem("cross-origin: a browser's request from another site to an unsigned source"),
                    "404": problem("unknown-source"),
                    "408": problem("body-timeout"),
                    "409": retry_after(problem("in-progress: the event is being processed, or awaits reconciliation")),
                    "413": problem("body-too-large"),
                    "415": problem("encoding-unsupported: a Content-Encoding other than identity (Accept-Encoding: identity)"),
                    "422": problem("key-reused: same event id, different payload"),
                    "431": problem("headers-too-large: past the 64 KiB of headers an event stores"),
                    "503": problem("unavailable (Retry-After): nothing is known to be stored")
                } } },
            "/v1/events": { "get": {
                "summary": "Events in arrival order", "security": admin, "parameters": list,
                "responses": { "200": schemas::body("a page of events", "EventPage"),
                               "400": problem("invalid-query"), "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/sources/{source}/events/{event_id}": { "get": {
                "summary": "One event with payload, headers and stored answer", "security": admin,
                "responses": { "200": schemas::body("the event, with its deliveries", "EventDetail"),
                               "400": problem("invalid-key"), "404": problem("event-not-found"),
                               "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/deliveries": { "get": {
                "summary": "Deliveries by state and route, oldest first", "security": admin, "parameters": deliveries,
                "responses": { "200": schemas::body("a page of deliveries", "DeliveryPage"),
                               "400": problem("invalid-query"), "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/deliveries/{id}/retry": { "post": {
                "summary": "Make a dead, uncertain or retrying delivery due now (same key), with fresh caps on attempts and age", "security": admin,
                "responses": { "200": { "description": "{\"id\": id, \"state\": \"pending\"}" }, "400": problem("bad-request: the id is not a number"), "404": problem("no-delivery"), "409": problem("not-retryable: its state, named"),
                               "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/deliveries/{id}/resolve": { "post": {
                "summary": "Settle a delivery by hand", "security": admin,
                "requestBody": { "required": true, "description": "read as JSON whatever its Content-Type",
                                 "content": { "application/json": { "schema": schemas::schema("Resolve") } } },
                "responses": { "200": { "description": "{\"id\": id, \"state\": outcome}" }, "400": problem("invalid-json: not a Resolve body; bad-request: the id is not a number"), "404": problem("no-delivery"),
                               "409": problem("not-resolvable: its state, named"), "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/sources/{source}/events/{event_id}/redeliver": { "post": {
                "summary": "Deliver an event to its routes again, with the same idempotency key and fresh caps on attempts and age", "security": admin,
                "responses": { "200": { "description": "{\"redelivered\": n, \"idempotency_key\": key}" }, "400": problem("invalid-key"), "404": problem("event-not-found; no-deliveries: the event has none (no route took it)"),
                               "409": problem("in-flight: every delivery is being sent now"),
                               "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/stats": { "get": { "summary": "Counts by state", "security": admin,
                "responses": { "200": { "description": "{\"events\": {state: n}, \"conflicts\": n, \"outbox\": n, \"kept\": {\"actions\": n, \"versions\": n, \"offsets\": n}}: kept counts rows no purge removes" }, "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/v1/activity": { "get": { "summary": "Counts per source and outcome, arrivals per minute over the last hour, deliveries per state", "security": admin,
                "responses": { "200": { "description": "{\"counts\": [{source, state, count}], \"buckets\": [{start_ms, source, count}], \"deliveries\": [{state, count}], …}" }, "401": problem("unauthorized"), "503": problem("unavailable") } } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "security": admin,
                "responses": { "200": { "description": "text exposition format" }, "401": problem("unauthorized"),
                               "404": problem("metrics-disabled: no recorder installed") } } },
            "/healthz": { "get": { "summary": "The process is up", "responses": { "200": { "description": "{\"status\": \"ok\"}" } } } },
            "/readyz": { "get": { "summary": "The store takes writes now",
                "responses": { "200": { "description": "{\"status\": \"ready\"}" }, "503": problem("unavailable") } } },
            "/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3.1" } } } },
            "/": page("Dashboard: activity per source, deliveries by state"),
            "/events": page_with("Dashboard: events, filtered by source and state", &query[..4]),
            "/events/{source}/{event_id}": page("Dashboard: one event, its answer and deliveries"),
            "/event": page_with("Dashboard: one event named by the query (?source=…&id=…), for an id of `.` or `..`, which a browser cannot keep in a path",
                &[("source", json!({ "type": "string" }), true, "the event's source"),
                  ("id", json!({ "type": "string" }), true, "the event's id")]),
            "/deliveries/{state}": page_with("Dashboard: the deliveries in one state, with retry and resolve", &query[3..4]),
            "/conflicts": page_with("Dashboard: reused keys with the two payloads side by side (one key's, named by `source` and `event_id` together)",
                &[("source", json!({ "type": "string" }), false, "with `event_id`, the two together: only this key's conflicts"),
                  query[4].clone(), query[3].clone()]),
            "/config": page("Dashboard: the sources and routes in effect, secrets masked"),
            "/login": {
                "get": { "summary": "Dashboard sign-in form", "tags": ["dashboard"],
                    "responses": { "200": { "description": "HTML form", "content": { "text/html": {} } },
                                   "303": { "description": "already signed in, or no admin token is configured: to the dashboard" },
                                   "403": { "description": CLOSED, "content": { "text/html": {} } } } },
                "post": { "summary": "Sign in with the admin token; sets the session cookie", "tags": ["dashboard"],
                    "requestBody": schemas::form(&[("token", "the admin token; absent is taken as empty")]),
                    "responses": { "303": { "description": "signed in, or no admin token is configured: to the dashboard" },
                                   "401": { "description": "wrong token: the form again", "content": { "text/html": {} } },
                                   "403": problem("forbidden: sent from another origin's page"),
                                   "415": unsupported, "422": unprocessable } } },
            "/logout": { "post": { "summary": "Sign out: ends the session", "tags": ["dashboard"],
                "requestBody": schemas::form(&[("csrf", "the session's CSRF token, as its pages embed it")]),
                "responses": { "303": { "description": "to /login" },
                               "403": problem("forbidden: no valid session and CSRF token, or sent from another origin's page"),
                               "415": unsupported, "422": unprocessable } } },
            "/assets/dashboard.js": { "get": { "summary": "The dashboard's script", "tags": ["dashboard"],
                "responses": { "200": { "description": "JavaScript", "content": { "text/javascript": {} } } } } },
            "/assets/dashboard.css": { "get": { "summary": "The dashboard's stylesheet", "tags": ["dashboard"],
                "responses": { "200": { "description": "CSS", "content": { "text/css": {} } } } } }
        }
    })
}
