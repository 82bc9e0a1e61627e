//! Errors the framework answers by itself — a path segment or query that does not parse, a
//! method a route does not take, a path no route has — rewritten as problem documents, so that
//! every error a client gets is `application/problem+json` (DESIGN §4).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::problem::Problem;

/// Longest framework error body kept as the problem's detail; theirs are one line.
const MAX_DETAIL: usize = 1024;

/// Rewrites a framework error (one that [`untyped_error`] picked; the edge in `limit.rs` passes
/// every other answer on untouched: successes, the gateway's own problems, the dashboard's
/// HTML pages), keeping its status and its other headers (`Allow` on a 405).
pub(crate) async fn as_problem(response: Response) -> Response {
    let status = response.status();
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL)
        .await
        .ok()
        .filter(|b| !b.is_empty());
    let detail = match text {
        Some(b) => String::from_utf8_lossy(&b).into_owned(),
        None => status.canonical_reason().unwrap_or("error").to_owned(),
    };
    let (slug, title) = name(status);
    let (problem, body) = Problem::new(status, slug, title, detail)
        .into_response()
        .into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    // The problem's own headers (its type, `nosniff`) over the framework's.
    for name in [header::CONTENT_TYPE, header::X_CONTENT_TYPE_OPTIONS] {
        if let Some(value) = problem.headers.get(&name) {
            parts.headers.insert(name, value.clone());
        }
    }
    Response::from_parts(parts, body)
}

/// An error answer that is plain text or has no type at all: the framework's own.
pub(crate) fn untyped_error(response: &Response) -> bool {
    let status = response.status();
    (status.is_client_error() || status.is_server_error())
        && response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"))
}

/// The slug and title of a framework error, by its status.
fn name(status: StatusCode) -> (&'static str, &'static str) {
    match status {
        StatusCode::BAD_REQUEST => ("bad-request", "Bad request"),
        StatusCode::FORBIDDEN => ("forbidden", "Forbidden"),
        StatusCode::NOT_FOUND => ("not-found", "Not found"),
        StatusCode::METHOD_NOT_ALLOWED => ("method-not-allowed", "Method not allowed"),
        StatusCode::PAYLOAD_TOO_LARGE => ("body-too-large", "Body too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported-media-type", "Unsupported media type"),
        StatusCode::UNPROCESSABLE_ENTITY => ("unprocessable", "Unprocessable content"),
        s if s.is_client_error() => ("client-error", "Client error"),
        _ => ("server-error", "Server error"),
    }
}

/// A list endpoint's query, or the `invalid-query` problem its OpenAPI entry names: a cursor or
/// limit that is not a number is the client's error like an unknown filter value.
pub(crate) fn query<T>(
    q: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, Problem> {
    q.map(|axum::extract::Query(q)| q)
        .map_err(|e| Problem::invalid_request("invalid-query", e.body_text()))
}

/// A query parameter given empty (`?source=&limit=`, as forms and URL templates send them) is
/// the same as one not given; any other value must parse.
pub(crate) fn blank<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text: Option<String> = serde::Deserialize::deserialize(d)?;
    match text.as_deref() {
        None | Some("") => Ok(None),
        Some(t) => t.parse().map(Some).map_err(serde::de::Error::custom),
    }
}
