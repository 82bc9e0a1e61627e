//! The gateway's ingest as the `Apply` broker consumers call.

use std::sync::Arc;

use oncebox_core::consume::{Apply, Position};
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Clock, Event, PayloadError, ProcessError, Processed, SystemClock, Unavailable};
use oncebox_gateway::accepted_body;
use oncebox_gateway::policy::GatewayConfig;

use crate::store::Store;

/// The gateway's ingest as an `Apply`: the event, its first answer and its routes' deliveries
/// commit together.
pub(super) struct Ingesting {
    pub(super) store: Store,
    pub(super) config: Arc<GatewayConfig>,
}

impl Apply for Ingesting {
    async fn apply(&self, event: Event, _: Option<Position>) -> Result<Processed, ProcessError> {
        let source = event.key.source.clone();
        // The source's ordering guard holds for its broker messages as for its webhooks: an
        // event older than the newest applied one of its entity is stored stale, not routed.
        let guard = self.config.source(&source).and_then(|p| p.order.as_ref());
        let parsed = (guard.is_some() || self.config.routes_read_body(&source))
            .then(|| oncebox_core::json::parse(&event.payload));
        let doc = match parsed {
            Some(Ok(doc)) => Some(doc),
            // Not JSON (a consumer fingerprinting raw bytes takes any payload): the guard
            // cannot place it in its entity's order. Refused, as the gateway refuses such a
            // webhook (`invalid-json`), rather than applied and routed unguarded.
            Some(Err(e)) if guard.is_some() => {
                return Err(ProcessError::Invalid(PayloadError::Json(e).into()));
            }
            _ => None,
        };
        let order = match (guard, &doc) {
            (Some(guard), Some(doc)) => guard
                .read(doc)
                .map_err(|e| ProcessError::Invalid(e.into()))?,
            _ => None,
        };
        let now = SystemClock.now();
        let ingest = Ingest {
            routes: self.config.routes_for(&source, doc.as_ref()),
            accepted: accepted_body(&event.key, now, false),
            stale: if order.is_some() {
                accepted_body(&event.key, now, true)
            } else {
                Vec::new()
            },
            event,
            order,
        };
        self.store.ingest(ingest).await
    }

    /// The gateway's ingest is handed no position, and keeps no watermark.
    async fn watermark(&self, _: &str, _: i64) -> Result<Option<i64>, Unavailable> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncebox_core::{FingerprintMode, Invalid, Key, Source};
    use oncebox_gateway::policy::{OrderGuard, SourcePolicy};

    /// A source's ordering guard holds for a broker message it cannot read: one that is no JSON
    /// is refused as invalid and stores nothing, not applied and routed unguarded.
    #[test]
    fn a_message_the_ordering_guard_cannot_read_is_refused() {
        oncebox_testkit::run(async {
            let dir = tempfile::tempdir().unwrap();
            let database = format!("sqlite://{}", dir.path().join("oncebox.db").display());
            let store = Store::open_with(&database, &crate::config::Storage::default())
                .await
                .unwrap();
            let shop = Source::new("shop").unwrap();
            let mut policy = SourcePolicy::open();
            policy.order = Some(OrderGuard::new(
                "/order".parse().unwrap(),
                "/v".parse().unwrap(),
            ));
            let mut config = GatewayConfig::default();
            config.sources.insert(shop, policy);
            let ingesting = Ingesting {
                store: store.clone(),
                config: Arc::new(config),
            };
            let key = Key::parse("shop", "m-1").unwrap();
            let raw = FingerprintMode::Raw;
            let event = Event::new(key.clone(), b"not json".to_vec(), &raw).unwrap();
            let refused = ingesting.apply(event, None).await;
            assert!(
                matches!(
                    refused,
                    Err(ProcessError::Invalid(Invalid::Payload(PayloadError::Json(
                        _
                    ))))
                ),
                "{refused:?}"
            );
            assert!(store.event(&key).await.unwrap().is_none(), "nothing stored");
            let json = br#"{"order":"o1","v":1}"#.to_vec();
            let event = Event::new(key.clone(), json, &raw).unwrap();
            assert!(ingesting.apply(event, None).await.unwrap().is_applied());
        });
    }
}
