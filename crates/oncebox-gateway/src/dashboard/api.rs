//! `GET /v1/activity`: the overview's live figures as JSON (counts per source and outcome,
//! arrivals per minute over the last hour, deliveries per state), polled by the dashboard.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::EventStore;
use serde_json::{Value, json};

use crate::problem::Problem;
use crate::{Gateway, rfc3339};

/// The chart's window and bar width.
pub(crate) const WINDOW: Duration = Duration::from_secs(3600);
pub(crate) const BUCKET: Duration = Duration::from_secs(60);

pub(crate) async fn activity<S: EventStore + DeliveryStore>(
    State(gw): State<Arc<Gateway<S>>>,
) -> Response {
    match figures(&gw).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => Problem::store_unavailable(&e, gw.config.limits.retry_after).into_response(),
    }
}

/// The figures, also rendered into the overview page on its first load.
pub(crate) async fn figures<S: EventStore + DeliveryStore>(
    gw: &Gateway<S>,
) -> Result<Value, oncebox_core::Unavailable> {
    let now = gw.clock.now();
    let activity = gw.store.activity(now.minus(WINDOW), BUCKET).await?;
    let gauges = gw.store.gauges().await?;
    Ok(json!({
        "now": rfc3339(now),
        "now_ms": now.millis(),
        "window_seconds": WINDOW.as_secs(),
        "bucket_seconds": BUCKET.as_secs(),
        "counts": activity.counts.iter()
            .map(|(source, state, n)| json!({ "source": source, "state": state, "count": n }))
            .collect::<Vec<_>>(),
        "buckets": activity.buckets.iter()
            .map(|(start, source, n)| json!({ "start_ms": start.millis(), "source": source, "count": n }))
            .collect::<Vec<_>>(),
        "deliveries": gauges.by_state.iter()
            .map(|(state, n)| json!({ "state": state, "count": n }))
            .collect::<Vec<_>>(),
    }))
}
