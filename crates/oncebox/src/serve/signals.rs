//! Stop signals: the first SIGINT, SIGTERM or SIGHUP asks for a graceful stop; the next one
//! stops the process at once.
//!
//! A graceful stop waits for attempts in progress, up to a route's timeout and the relay's
//! lease: an operator who cannot wait that long signals again. Stopped so, the process is as
//! after a crash: an attempt's claim stays in flight until its lease ends and another relay
//! takes it (with the same key); a request to the gateway whose commit had not returned gets
//! no answer, never a 2xx, since the answer is written only after the commit.

use std::future::Future;

use tokio::sync::watch;

/// Whether a stop was asked for, watched from the moment the handlers are registered: a signal
/// that comes while the store opens (a migration lock another node holds, a file another
/// process keeps busy) or while the port is bound ends the start there, instead of being
/// noticed only once the gateway is listening, and a second one stops at once whenever it
/// comes.
#[derive(Clone)]
pub(crate) struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Registers the handlers and starts watching them.
    pub(crate) fn listen() -> Stop {
        let signal = shutdown_signal();
        let (asked, watched) = watch::channel(false);
        tokio::spawn(async move {
            signal.await;
            let _ = asked.send(true);
        });
        Stop(watched)
    }

    /// Resolves once a stop was asked for.
    pub(crate) async fn requested(self) {
        wait_for(self.0).await;
    }

    /// Runs `start` unless a stop is asked for first (`None` then: `start` is dropped, and a
    /// PostgreSQL session it opened ends, taking its transaction and locks with it).
    pub(crate) async fn before<T>(&self, start: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            () = self.clone().requested() => None,
            done = start => Some(done),
        }
    }
}

/// Resolves once `stopped` holds `true`, or its sender went away (the process is ending).
pub(crate) async fn wait_for(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// Resolves on the first stop signal. The handlers are registered here, at once, not when the
/// future is first polled: a signal that comes while the store opens, or while the relay
/// already delivers, ends the process gracefully instead of by the default action. SIGHUP is
/// one of them: a closed terminal or a supervisor's hang-up would otherwise kill the process
/// mid-commit, with no graceful stop at all.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        [
            SignalKind::interrupt(),
            SignalKind::terminate(),
            SignalKind::hangup(),
        ]
        .map(|kind| (kind, signal(kind).ok()))
    };
    async move {
        #[cfg(unix)]
        {
            let mut signals = signals;
            let first = next(&mut signals).await;
            tracing::info!(
                signal = first,
                "shutdown requested; signal again to stop now"
            );
            // Spawned, not awaited: the caller's graceful stop goes on meanwhile.
            tokio::spawn(async move {
                let second = next(&mut signals).await;
                tracing::warn!(
                    signal = second,
                    "second stop signal: stopping now; attempts in progress are taken again \
                     when their leases end"
                );
                // 128 + the signal's number, as a shell reports a process a signal ended.
                std::process::exit(128 + second);
            });
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutdown requested");
        }
    }
}

/// The number of the next signal among `signals`; never, for those whose handler could not be
/// registered.
#[cfg(unix)]
async fn next(
    signals: &mut [(
        tokio::signal::unix::SignalKind,
        Option<tokio::signal::unix::Signal>,
    ); 3],
) -> i32 {
    let [(a, sa), (b, sb), (c, sc)] = signals;
    tokio::select! {
        () = received(sa.as_mut()) => a.as_raw_value(),
        () = received(sb.as_mut()) => b.as_raw_value(),
        () = received(sc.as_mut()) => c.as_raw_value(),
    }
}

/// The next delivery of a signal, or never when its handler could not be registered.
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => drop(s.recv().await),
        None => std::future::pending::<()>().await,
    }
}
