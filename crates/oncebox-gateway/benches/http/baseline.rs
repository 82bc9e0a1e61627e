//! The HTTP benchmark's baseline: an axum route that parses the JSON body and answers 202 with a
//! small body, storing nothing. Shared by the benchmark and by `examples/baseline.rs`, which
//! serves it as a process of its own.

use axum::Router;
use axum::body::Bytes;
use axum::extract;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;

/// The ingest route of the gateway's API, answered by [`baseline`].
pub fn router() -> Router {
    Router::new().route("/v1/sources/{source}/events", post(baseline))
}

/// Parse the JSON, answer 202 with a small body, store nothing.
async fn baseline(extract::Path(source): extract::Path<String>, body: Bytes) -> Response {
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(doc) => (
            StatusCode::ACCEPTED,
            axum::Json(serde_json::json!({
                "status": "accepted", "source": source, "event_id": doc.get("id"),
            })),
        )
            .into_response(),
        Err(_) => StatusCode::BAD_REQUEST.into_response(),
    }
}
