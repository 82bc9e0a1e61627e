//! Relay wake-ups: one `LISTEN` connection per `Inbox` (shared by its clones) turns each
//! `NOTIFY` on its schema's channel ([`crate::outbox_channel`]) into a stored permit, so a relay claims as soon as new work
//! commits instead of at its next poll, and polling remains the fallback when the listening
//! connection is down.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, oneshot, watch};

/// The first wait before listening again after the connection broke; it doubles up to
/// `RECONNECT_MAX` while attempts keep failing, so a database that is away is not hammered.
const RECONNECT_MIN: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// Where the listening connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first `LISTEN` is under way; only ever before the first registration's outcome.
    Connecting,
    Listening,
    /// Not listening; waits are plain sleeps until the task listens again.
    Down,
}

#[derive(Debug, Clone, Copy)]
struct State {
    phase: Phase,
    /// `LISTEN`s registered so far (a new one after each lost connection).
    registered: u64,
    /// Notifications received so far.
    received: u64,
}

/// The wake-up handle of an `Inbox`; clones share one listening connection.
#[derive(Clone)]
pub(crate) struct Wake(Arc<Shared>);

struct Shared {
    connect: PgConnectOptions,
    /// The schema's channel.
    channel: Arc<str>,
    /// How long one attempt to connect and `LISTEN` may take.
    timeout: Duration,
    /// How long the connection may stay silent before it is checked, and how long the check
    /// may take (`silent.rs`).
    lost_after: Duration,
    /// One permit per notification not yet waited for (`Notify` keeps at most one): a
    /// notification arriving while no relay waits ends the next wait at once instead of being
    /// lost.
    work: Arc<Notify>,
    /// The listening task, started by the first wait.
    running: OnceLock<Running>,
}

struct Running {
    state: watch::Receiver<State>,
    /// Dropped with the last clone of the `Inbox`: the task then ends and its connection
    /// closes.
    _stop: oneshot::Sender<()>,
}

impl Wake {
    /// Listens on a connection of its own, outside `pool`: it is held for as long as the
    /// `Inbox` lives and must not take a slot from claims and ingest.
    pub(crate) fn new(pool: &PgPool, channel: &Arc<str>, lost_after: Duration) -> Wake {
        Wake(Arc::new(Shared {
            connect: (*pool.connect_options()).clone(),
            channel: Arc::clone(channel),
            timeout: pool.options().get_acquire_timeout(),
            lost_after,
            work: Arc::new(Notify::new()),
            running: OnceLock::new(),
        }))
    }

    fn running(&self) -> &Running {
        let shared = &self.0;
        shared.running.get_or_init(|| {
            let (state, receiver) = watch::channel(State {
                phase: Phase::Connecting,
                registered: 0,
                received: 0,
            });
            let (stop, stopped) = oneshot::channel();
            tokio::spawn(listen(
                shared.connect.clone(),
                Arc::clone(&shared.channel),
                (shared.timeout, shared.lost_after),
                Arc::clone(&shared.work),
                state,
                stopped,
            ));
            Running {
                state: receiver,
                _stop: stop,
            }
        })
    }

    /// Waits for a notification, at most `at_most`. The first call starts the listener and
    /// returns only once its `LISTEN` is registered (or the attempt failed), so the relay's
    /// first claim, which follows it, sees everything committed before and is told of
    /// everything committed after. A zero wait takes a stored permit without waiting: the
    /// caller is about to claim anyway.
    pub(crate) async fn wait(&self, at_most: Duration) {
        let mut state = self.running().state.clone();
        // Later calls find the phase decided and pass at once. A closed channel means the task
        // is gone; the wait below is then a plain sleep.
        let _ = state.wait_for(|s| s.phase != Phase::Connecting).await;
        // While the listener is down this is the polling fallback: nothing wakes it early but
        // `at_most` still ends it, so a relay never spins.
        let _ = tokio::time::timeout(at_most, self.0.work.notified()).await;
    }
}

/// Connects and registers `LISTEN`, on a pool of one of its own: only used to (re)connect, so
/// no idle or lifetime limits apply to a connection that is always in use. A new pool for
/// each: a listener dropped on a silent connection sends `UNLISTEN` and waits for its answer,
/// holding its pool's one connection as long (sqlx), and a shared pool would give no other.
async fn register(
    connect: &PgConnectOptions,
    timeout: Duration,
    channel: &str,
) -> Result<PgListener, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeout)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(connect.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    // A lost connection is reported, not silently replaced: the task reconnects itself, after
    // a pause, and wakes relays for what was missed meanwhile.
    listener.eager_reconnect(false);
    listener.listen(channel).await?;
    Ok(listener)
}

/// The listening task: registers, turns notifications into permits, and after a lost
/// connection listens again with a growing pause. A connection silent for `lost_after` is
/// asked for an answer, within as long again, and taken for lost without one: a path gone
/// silent under it (no reset, no FIN) left relays on their poll alone, for good. It ends when
/// `stop` fires or its sender is dropped.
async fn listen(
    connect: PgConnectOptions,
    channel: Arc<str>,
    (timeout, lost_after): (Duration, Duration),
    work: Arc<Notify>,
    state: watch::Sender<State>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut pause = RECONNECT_MIN;
    loop {
        let attempt = tokio::select! {
            _ = &mut stop => return,
            attempt = tokio::time::timeout(timeout, register(&connect, timeout, &channel)) => attempt,
        };
        match attempt {
            Ok(Ok(mut listener)) => {
                pause = RECONNECT_MIN;
                if state.borrow().phase == Phase::Down {
                    // Notifications sent while nobody listened (since a lost connection, or a
                    // first attempt that failed) are gone; a claim finds what they announced,
                    // so wake a relay now (before the state says we listen again, so whoever
                    // sees that finds the permit stored).
                    work.notify_one();
                    // The warning that polling began has its end said too.
                    tracing::info!("listening for relay wake-ups again");
                }
                state.send_modify(|s| {
                    s.phase = Phase::Listening;
                    s.registered += 1;
                });
                let lost = loop {
                    let next = tokio::select! {
                        _ = &mut stop => return,
                        next = tokio::time::timeout(lost_after, listener.try_recv()) => next,
                    };
                    let Ok(next) = next else {
                        let asked = sqlx::query("SELECT 1").execute(&mut listener);
                        match crate::silent::answered(lost_after, asked).await {
                            Ok(_) => continue,
                            Err(e) => break e.to_string(),
                        }
                    };
                    match next {
                        Ok(Some(_)) => {
                            work.notify_one();
                            state.send_modify(|s| s.received += 1);
                        }
                        // A lost connection, or an error on it: start over on a new one
                        // rather than read a broken one again.
                        Ok(None) => break "connection lost".to_owned(),
                        Err(e) => break e.to_string(),
                    }
                };
                tracing::warn!(error = %lost, "relay wake-ups lost; polling until listening again");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot LISTEN for relay wake-ups; polling"),
            Err(_) => tracing::warn!("LISTEN for relay wake-ups timed out; polling"),
        }
        state.send_modify(|s| s.phase = Phase::Down);
        tokio::select! {
            _ = &mut stop => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

#[cfg(test)]
mod tests {
    //! On a database of their own: `NOTIFY` channels are per database, and other tests' ingest
    //! there would wake these listeners and prove nothing.

    use std::time::Duration;

    use sqlx::postgres::PgPoolOptions;
    use sqlx::{Connection, PgConnection, PgPool};

    use std::sync::Arc;

    use super::{Phase, State, Wake};
    use crate::OUTBOX_CHANNEL;

    /// Long enough that a wait ending before `PROMPT` was ended by a notification.
    const LONG: Duration = Duration::from_secs(3600);
    const PROMPT: Duration = Duration::from_secs(20);

    /// A fresh database, its URL and a connection to the server's default one (to drop it).
    async fn own_database() -> Option<(String, String, PgConnection)> {
        let url = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL")?;
        let mut admin = PgConnection::connect(&url).await.expect("connect");
        let name = format!("oncebox_t_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        let (base, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
        let (server, _) = base.rsplit_once('/').expect("URL with a database");
        let own = format!(
            "{server}/{name}{}{query}",
            if query.is_empty() { "" } else { "?" }
        );
        Some((own, name, admin))
    }

    async fn drop_database(mut admin: PgConnection, name: &str) {
        sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .expect("drop database");
    }

    async fn until(wake: &Wake, done: impl FnMut(&State) -> bool) {
        let mut state = wake.running().state.clone();
        tokio::time::timeout(PROMPT, state.wait_for(done))
            .await
            .expect("in time")
            .expect("listener task alive");
    }

    async fn send(pool: &PgPool) {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(OUTBOX_CHANNEL)
            .execute(pool)
            .await
            .expect("notify");
    }

    #[tokio::test]
    async fn a_notification_while_nobody_waits_ends_the_next_wait() {
        let Some((url, name, admin)) = own_database().await else {
            return;
        };
        let pool = PgPoolOptions::new().connect_lazy(&url).expect("pool");
        let wake = Wake::new(&pool, &Arc::from(OUTBOX_CHANNEL), PROMPT);
        wake.wait(Duration::ZERO).await;
        assert_eq!(wake.running().state.borrow().phase, Phase::Listening);
        let quiet = tokio::time::timeout(Duration::from_millis(200), wake.wait(LONG)).await;
        assert!(
            quiet.is_err(),
            "nothing was sent: the wait must not end early"
        );
        send(&pool).await;
        // Received by the listener while no wait is in progress.
        until(&wake, |s| s.received >= 1).await;
        let woken = tokio::time::timeout(PROMPT, wake.wait(LONG)).await;
        assert!(woken.is_ok(), "the stored permit ends the wait at once");
        drop(wake);
        pool.close().await;
        drop_database(admin, &name).await;
    }

    #[tokio::test]
    async fn listener_listens_again_after_its_connection_is_killed() {
        let Some((url, name, admin)) = own_database().await else {
            return;
        };
        let pool = PgPoolOptions::new().connect_lazy(&url).expect("pool");
        let wake = Wake::new(&pool, &Arc::from(OUTBOX_CHANNEL), PROMPT);
        wake.wait(Duration::ZERO).await;
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND query LIKE 'LISTEN%'",
        )
        .fetch_all(&pool)
        .await
        .expect("terminate");
        assert_eq!(killed, [true], "one listening connection");
        until(&wake, |s| s.registered >= 2 && s.phase == Phase::Listening).await;
        // Listening again wakes a relay for what may have been missed while it was not.
        let woken = tokio::time::timeout(PROMPT, wake.wait(LONG)).await;
        assert!(woken.is_ok(), "listening again wakes a waiting relay");
        send(&pool).await;
        let woken = tokio::time::timeout(PROMPT, wake.wait(LONG)).await;
        assert!(woken.is_ok(), "notifications reach the new connection");
        drop(wake);
        pool.close().await;
        drop_database(admin, &name).await;
    }

    /// A listening connection whose path goes silent (no reset, no FIN) gets no notification
    /// and no error: without a check, relays ran on their poll alone for good.
    #[tokio::test]
    async fn listener_listens_again_after_its_connection_goes_silent() {
        use oncebox_testkit::proxy::{Mode, Proxy, Stats};

        let Some((url, name, admin)) = own_database().await else {
            return;
        };
        let options: sqlx::postgres::PgConnectOptions = url.parse().expect("URL");
        let server = tokio::net::lookup_host((options.get_host(), options.get_port()))
            .await
            .expect("the server's address")
            .next()
            .expect("an address");
        // Stranded at its check, which asks `SELECT 1`.
        let proxy = Proxy::start_with_marker(server, Some(b"SELECT 1".to_vec())).await;
        let via = options
            .host("127.0.0.1")
            .port(proxy.addr().port())
            .ssl_mode(sqlx::postgres::PgSslMode::Disable);
        let direct = PgPoolOptions::new().connect_lazy(&url).expect("pool");
        let pool = PgPoolOptions::new().connect_lazy_with(via);
        let quiet = Duration::from_secs(1);
        let wake = Wake::new(&pool, &Arc::from(OUTBOX_CHANNEL), quiet);
        wake.wait(Duration::ZERO).await;
        assert_eq!(wake.running().state.borrow().registered, 1);
        proxy.set(Mode::Strand);
        until(&wake, |s| s.registered >= 2 && s.phase == Phase::Listening).await;
        proxy.set(Mode::Pass);
        // The new connection's own check may have gone the same way before `Pass`.
        assert!(
            Stats::get(&proxy.stats.stranded) >= 1,
            "the check went into the void"
        );
        let woken = tokio::time::timeout(PROMPT, wake.wait(LONG)).await;
        assert!(woken.is_ok(), "listening again wakes a waiting relay");
        send(&direct).await;
        let woken = tokio::time::timeout(PROMPT, wake.wait(LONG)).await;
        assert!(woken.is_ok(), "notifications reach the new connection");
        drop(wake);
        pool.close().await;
        direct.close().await;
        drop_database(admin, &name).await;
    }
}
