//! The tasks `oncebox serve` runs beside the gateway (the relay, the retention purge, the
//! metrics upkeep), watched while it serves. Each runs until the stop, so one that ends before
//! it, by a panic or otherwise, stops the gateway as a signal would, and the process then exits
//! with an error for its supervisor to restart it.
//!
//! Why: unwatched, a relay that panicked was noticed only at the next stop. Until then the
//! gateway went on accepting events that nothing delivered, `/readyz` said ready, and the
//! delivery gauges stayed at their last values, so an alert on the oldest pending delivery never
//! fired. A dead purge let the database grow past every retention. Restarting is what brings
//! delivery back: the restarted relay takes over the dead one's claims after their lease, as
//! after any crash. Readiness alone would be the wrong signal: it would take traffic from an
//! intake that still works and restart nothing.

use std::future::Future;

use tokio::task::{JoinError, JoinHandle};

/// The tasks beside the gateway.
pub(crate) struct Background {
    /// `None` without routes, or once it ended.
    pub(crate) relay: Option<JoinHandle<()>>,
    pub(crate) purge: JoinHandle<()>,
    pub(crate) upkeep: JoinHandle<()>,
}

impl Background {
    /// Waits for `stop`, or for one of the tasks to end before it: then what ended and how.
    pub(crate) async fn watch(&mut self, stop: impl Future<Output = ()>) -> Option<String> {
        let Background {
            relay,
            purge,
            upkeep,
        } = self;
        let relay_ended = async {
            match relay.as_mut() {
                Some(handle) => handle.await,
                None => std::future::pending().await,
            }
        };
        let (task, ended) = tokio::select! {
            () = stop => return None,
            ended = relay_ended => ("the relay", ended),
            ended = purge => ("the retention purge", ended),
            ended = upkeep => ("the metrics upkeep", ended),
        };
        if task == "the relay" {
            // Awaited to its end: polled again, its handle would panic.
            *relay = None;
        }
        Some(ended_how(task, ended))
    }

    /// After the gateway stopped: the relay finishes the attempt in hand and records it before
    /// the store closes; the others are stopped. `Err` says how the relay ended if not well.
    pub(crate) async fn finish(self) -> Result<(), String> {
        self.purge.abort();
        self.upkeep.abort();
        match self.relay {
            Some(relay) => relay.await.map_err(|e| format!("the relay {}", how(e))),
            None => Ok(()),
        }
    }
}

/// What ended of a task meant to run until the stop, and how.
pub(crate) fn ended_how(task: &str, ended: Result<(), JoinError>) -> String {
    match ended {
        Ok(()) => format!("{task} stopped on its own"),
        Err(e) => format!("{task} {}", how(e)),
    }
}

/// How a task ended that did not return.
fn how(e: JoinError) -> String {
    if !e.is_panic() {
        return "was cancelled".to_owned();
    }
    let panic = e.into_panic();
    format!(
        "panicked: {}",
        oncebox_core::consume::panic_message(panic.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forever() -> JoinHandle<()> {
        tokio::spawn(std::future::pending())
    }

    #[tokio::test]
    async fn a_task_that_ends_before_the_stop_is_reported_with_its_panic() {
        let mut bg = Background {
            relay: Some(tokio::spawn(async {
                let route = "hooks";
                panic!("no lane for route {route}");
            })),
            purge: forever(),
            upkeep: forever(),
        };
        let died = bg.watch(std::future::pending()).await;
        assert_eq!(
            died.as_deref(),
            Some("the relay panicked: no lane for route hooks")
        );
        assert!(bg.relay.is_none(), "its handle is not polled again");
        assert_eq!(bg.finish().await, Ok(()));

        let mut bg = Background {
            relay: None,
            purge: forever(),
            upkeep: tokio::spawn(async {}),
        };
        let died = bg.watch(std::future::pending()).await;
        assert_eq!(
            died.as_deref(),
            Some("the metrics upkeep stopped on its own")
        );
    }

    #[tokio::test]
    async fn at_the_stop_the_relay_is_waited_for_and_the_others_stopped() {
        let (done, finished) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let purge = forever();
        let mut bg = Background {
            relay: Some(tokio::spawn(async move {
                let _ = stopped.await;
                let _ = done.send("recorded");
            })),
            purge,
            upkeep: forever(),
        };
        assert_eq!(bg.watch(async {}).await, None, "the stop came first");
        let _ = stop.send(());
        assert_eq!(bg.finish().await, Ok(()));
        assert_eq!(finished.await, Ok("recorded"), "the relay ran to its end");
    }

    /// Through the gateway's own server loop, as `run` serves: a relay that panics while it
    /// serves stops the server (no signal comes) and the serve ends in an error, after telling
    /// the relay's side to stop.
    #[tokio::test]
    async fn a_relay_that_panics_stops_the_gateway_with_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (fail, failing) = tokio::sync::oneshot::channel::<()>();
        let bg = Background {
            relay: Some(tokio::spawn(async move {
                let _ = failing.await;
                panic!("a relay bug");
            })),
            purge: forever(),
            upkeep: forever(),
        };
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let limits = oncebox_gateway::policy::Limits::default();
        let serving = tokio::spawn(super::super::watched(
            listener,
            app,
            limits,
            std::future::pending(),
            bg,
            stop,
        ));
        // Serving first: the failure comes while it does.
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/healthz");
        let answer = client.get(&url).send().await.expect("served");
        assert!(answer.status().is_success());
        let _ = fail.send(());
        // Bounded so that a gateway left serving fails the test instead of hanging it.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), serving)
            .await
            .expect("the gateway stopped without a signal")
            .expect("joined");
        let e = ended.expect_err("an error");
        assert_eq!(e.to_string(), "the relay panicked: a relay bug");
        assert!(*stopped.borrow_and_update(), "the stop was sent");
        assert!(client.get(&url).send().await.is_err(), "no longer served");
    }
}
