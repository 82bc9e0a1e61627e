//! The long-running delivery loop: claims go on as sends end, route by route. A round that
//! waited for every claim of its batch held each route back behind the slowest receiver of
//! any route (up to its timeout); here a route with room is claimed for as soon as any send
//! ends, and a route whose claims fill its concurrency is not claimed for until one ends.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use oncebox_core::relay_store::{Claimed, DeliveryStore};
use tokio::sync::watch;

use super::{GAUGES_EVERY, Outcome, Relay};

impl<S: DeliveryStore> Relay<S> {
    pub(super) async fn deliver_until(&self, stopped: watch::Receiver<bool>) {
        let mut gauges_due = self.clock.now();
        // Claims not yet decided, per route.
        let mut held: HashMap<String, usize> = HashMap::new();
        let mut sending = FuturesUnordered::new();
        // A store that is told about new work starts listening before the first claim.
        self.store.wait_for_work(Duration::ZERO).await;
        loop {
            let claimed = if *stopped.borrow() {
                Vec::new()
            } else {
                self.claim_with_room(&held).await
            };
            // More may be due at once: look again without waiting.
            let pause = if claimed.is_empty() {
                self.options.idle_poll
            } else {
                Duration::ZERO
            };
            for c in claimed {
                *held.entry(c.route.clone()).or_default() += 1;
                let mut stop = stopped.clone();
                sending.push(async move {
                    let step = self.deliver(&c, &mut stop).await;
                    (c.route, step)
                });
            }
            let now = self.clock.now();
            if now >= gauges_due {
                gauges_due = now.plus(GAUGES_EVERY);
                if let Err(e) = self.publish_gauges().await {
                    tracing::debug!(error = %e, "gauges not published");
                }
            }
            if *stopped.borrow() {
                // Attempts in progress finish and are recorded; claims waiting for their
                // route are given back.
                while sending.next().await.is_some() {}
                return;
            }
            let mut stop = stopped.clone();
            let stopping = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            tokio::select! {
                biased;
                () = stopping => {}
                Some((route, step)) = sending.next(), if !sending.is_empty() => {
                    if let Some(n) = held.get_mut(&route) {
                        *n = n.saturating_sub(1);
                    }
                    if let Err(e) = Outcome::default().add(step) {
                        tracing::warn!(error = %e, "relay round failed");
                    }
                }
                () = self.store.wait_for_work(pause) => {}
            }
        }
    }

    /// Claims what is due on the open routes that have room (fewer claims held than their
    /// concurrency): at most their room together, and what the batch has room for. One route
    /// may still take the others' share of a claim; those wait for its permits, and while it
    /// holds its concurrency it is left out of the next claims.
    async fn claim_with_room(&self, held: &HashMap<String, usize>) -> Vec<Claimed> {
        let total: usize = held.values().sum();
        let mut room = 0usize;
        let routes: Vec<String> = self
            .open_routes()
            .into_iter()
            .filter(|name| {
                let concurrency = self
                    .routes
                    .get(name)
                    .map_or(1, |l| l.route.concurrency.max(1));
                let free = concurrency.saturating_sub(held.get(name).copied().unwrap_or(0));
                room = room.saturating_add(free);
                free > 0
            })
            .collect();
        let room = room.min(self.options.batch.saturating_sub(total));
        if room == 0 || routes.is_empty() {
            return Vec::new();
        }
        let lease = self.options.lease;
        match self
            .store
            .claim(self.clock.now(), room, lease, &routes)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %e, "relay round failed");
                Vec::new()
            }
        }
    }
}
