//! The two-phase suite every store runs (`oncebox_testkit::lease_conformance!`), on the shared
//! Redis: each test in a namespace of its own.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Begun, Event, Key, Lease, LeaseError, ProcessError, Response};
use oncebox_redis::{Leases, Resolution};
use oncebox_testkit::leasing::Leasing;

use crate::harness::{Namespace, raw, shared, wait_until};

#[derive(Debug)]
pub struct RedisLeases {
    ns: Arc<Namespace>,
    url: String,
    leases: Leases,
}

impl Leasing for RedisLeases {
    const TELLS_TAKEOVER: bool = false;

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

    /// Redis ends leases by itself: every lease's remaining TTL is cut to a millisecond, and
    /// the test goes on once Redis has dropped them (observed, not slept on).
    async fn lapse(&self, _ttl: Duration) {
        let mut conn = raw(&self.url).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:k:*", self.ns.name))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        let mut leased = Vec::new();
        for key in keys {
            let state: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("state")
                .query_async(&mut conn)
                .await
                .expect("HGET");
            if state.as_deref() == Some("processing") {
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&key)
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .expect("PEXPIRE");
                leased.push(key);
            }
        }
        if leased.is_empty() {
            return;
        }
        wait_until("leases lapsed", Duration::from_secs(10), || {
            let (mut conn, leased) = (conn.clone(), leased.clone());
            async move {
                let live: i64 = redis::cmd("EXISTS")
                    .arg(&leased)
                    .query_async(&mut conn)
                    .await
                    .expect("EXISTS");
                live == 0
            }
        })
        .await;
    }

    fn available() -> bool {
        shared().is_some()
    }
}

oncebox_testkit::lease_conformance!(RedisLeases);
