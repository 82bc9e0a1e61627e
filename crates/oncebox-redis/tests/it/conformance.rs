//! The two-phase suite every store runs (`oncebox_testkit::lease_conformance!`), on the shared
//! Redis: each test in a namespace of its own.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Begun, Event, Key, Lease, LeaseError, ProcessError, Response};
use oncebox_redis::{Leases, Resolution};
use oncebox_testkit::leasing::Leasing;

use crate::harness::{Namespace, raw, shared};

#[derive(Debug)]
pub struct RedisLeases {
    ns: Arc<Namespace>,
    url: String,
    leases: Leases,
}

impl Leasing for RedisLeases {
    async fn fresh() -> Self {
        let url = shared().expect("ONCEBOX_REDIS_URL");
        let ns = Arc::new(Namespace::new(&url));
        let leases = ns.leases().await;
        RedisLeases { ns, url, leases }
    }

    async fn restart(self) -> Self {
        let RedisLeases { ns, url, leases } = self;
        drop(leases);
        let leases = ns.leases().await;
        RedisLeases { ns, url, leases }
    }

    async fn another(&self) -> Self {
        let leases = self.ns.leases().await;
        RedisLeases {
            ns: self.ns.clone(),
            url: self.url.clone(),
            leases,
        }
    }

    async fn begin(&self, event: &Event, ttl: Duration) -> Result<Begun, ProcessError> {
        self.leases.begin(event, ttl).await
    }

    async fn complete(&self, lease: &Lease, response: &Response) -> Result<(), LeaseError> {
        self.leases.complete(lease, response).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.leases.release(lease).await
    }

    async fn uncertain(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.leases.uncertain(lease).await
    }

    async fn resolve(&self, key: &Key, completed: Option<Response>) -> bool {
        let resolution = completed.map_or(Resolution::Released, Resolution::Completed);
        self.leases.resolve(key, resolution).await.expect("resolve")
    }

    /// Every live lease ends now: its `until` is moved into the past on Redis's clock (its
    /// record stays, as after any lease's end, so that a takeover can tell).
    async fn lapse(&self, _ttl: Duration) {
        let mut conn = raw(&self.url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:k:*", self.ns.name))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        for key in keys {
            let state: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("state")
                .query_async(&mut conn)
                .await
                .expect("HGET");
            if state.as_deref() == Some("processing") {
                let _: i64 = redis::cmd("HSET")
                    .arg(&key)
                    .arg("until")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .expect("HSET");
            }
        }
    }

    fn available() -> bool {
        shared().is_some()
    }
}

oncebox_testkit::lease_conformance!(RedisLeases);
