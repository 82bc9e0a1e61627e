//! How `oncebox consume` watches its consumers while they run, and stops them.

/// Waits for `requested`, then stops the consumers and waits for each to settle the messages
/// in hand. Each runs until the stop: one that ends before it (a panic outside a message's own
/// guard) left the process up consuming nothing, unnoticed until the next stop, which then
/// exited 0. It stops the others now, and `Err` says what ended, for the process to exit with
/// an error and its supervisor to restart it, as `serve` does.
pub(super) async fn watch_consumers(
    mut tasks: tokio::task::JoinSet<()>,
    requested: impl std::future::Future<Output = ()>,
    stop: tokio::sync::watch::Sender<bool>,
) -> Result<(), String> {
    let mut failed = tokio::select! {
        () = requested => None,
        Some(ended) = tasks.join_next() => Some(crate::serve::ended("a consumer", ended)),
    };
    let _ = stop.send(true);
    while let Some(ended) = tasks.join_next().await {
        if ended.is_err() {
            failed.get_or_insert_with(|| crate::serve::ended("a consumer", ended));
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;
    use tokio::task::JoinSet;

    use super::watch_consumers;

    /// A consumer that runs until the stop and says it saw it.
    fn until_stopped(
        tasks: &mut JoinSet<()>,
        stopped: watch::Receiver<bool>,
        saw: tokio::sync::oneshot::Sender<()>,
    ) {
        let mut stopped = stopped;
        tasks.spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
            let _ = saw.send(());
        });
    }

    #[tokio::test]
    async fn a_consumer_that_panics_stops_the_others_and_is_an_error() {
        let (stop, stopped) = watch::channel(false);
        let (saw, seen) = tokio::sync::oneshot::channel();
        let mut tasks = JoinSet::new();
        until_stopped(&mut tasks, stopped, saw);
        tasks.spawn(async { panic!("broker said something odd") });
        // No stop is ever requested: only the panic ends the wait.
        let ended = watch_consumers(tasks, std::future::pending(), stop).await;
        let why = ended.expect_err("an error for the supervisor");
        assert!(why.contains("panicked: broker said something odd"), "{why}");
        seen.await
            .expect("the other consumer was stopped and ended");
    }

    #[tokio::test]
    async fn a_requested_stop_ends_every_consumer_without_an_error() {
        let (stop, stopped) = watch::channel(false);
        let (saw, seen) = tokio::sync::oneshot::channel();
        let mut tasks = JoinSet::new();
        until_stopped(&mut tasks, stopped, saw);
        assert_eq!(watch_consumers(tasks, async {}, stop).await, Ok(()));
        seen.await.expect("the consumer was stopped and ended");
    }
}
