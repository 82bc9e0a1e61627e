//! A broker that stops answering (as under a resource alarm, when RabbitMQ stops reading a
//! publishing connection), staged with a TCP proxy that holds every byte: a quarantine whose
//! confirm never comes is requeued after `confirm_timeout`, shutdown does not wait for the
//! broker either, and neither does a consumer opening its channels.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::Connection;
use oncebox_amqp::{ConsumeError, Consumer};
use oncebox_core::consume::{Counts, from_fn};
use oncebox_core::{Event, ProcessError};
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::{run, service_url};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::support::{World, connect};

/// A proxy in front of the broker of `url`, and the URL that goes through it.
pub(crate) async fn proxied(url: &str) -> (Proxy, String) {
    let broker = authority(url);
    let upstream: SocketAddr = broker.to_socket_addrs().unwrap().next().unwrap();
    let proxy = Proxy::start(upstream).await;
    let via = url.replacen(broker, &proxy.addr().to_string(), 1);
    (proxy, via)
}

/// `host:port` of an `amqp://user:pass@host:port/vhost` URL.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// A consumer through `via` whose handler says on `inside` that it holds a message, waits for
/// `release` and then fails for good: with one attempt allowed, each is quarantined at once,
/// within the confirm `deadline`.
struct Gated {
    inside: mpsc::UnboundedReceiver<()>,
    release: Arc<Notify>,
    counts: tokio::sync::watch::Receiver<Counts>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Result<(), ConsumeError>, Connection)>,
}

impl Gated {
    /// Publishes `n` keyed messages (`{prefix}_{i}`), waits until the handler holds every one,
    /// switches the proxy to `mode` and lets them all fail; returns when they were let go.
    async fn fail_all(
        &mut self,
        w: &World,
        proxy: &Proxy,
        (prefix, n): (&str, u64),
        mode: Mode,
    ) -> Instant {
        for i in 0..n {
            w.publish(Some(&format!("{prefix}_{i}")), r#"{"amount":1}"#)
                .await;
        }
        for _ in 0..n {
            self.inside.recv().await.unwrap();
        }
        proxy.set(mode);
        let released = Instant::now();
        self.release.notify_waiters();
        released
    }
}

async fn gated(w: &World, via: &str, deadline: Duration) -> Gated {
    let (entered, inside) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let apply = from_fn(move |_: Event, _| {
        let (entered, gate) = (entered.clone(), gate.clone());
        async move {
            // Waiting before it says so: a release sent once it said so reaches it.
            let notified = gate.notified();
            let _ = entered.send(());
            notified.await;
            Err(ProcessError::Handler("fails for good".into()))
        }
    });
    let mut options = w.options();
    options.retry.max_attempts = 1;
    options.confirm_timeout = deadline;
    let consumer = Arc::new(Consumer::new(apply, options));
    let counts = consumer.counts();
    let conn = connect(via).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let ended = consumer
            .run(&conn, async {
                let _ = stopped.await;
            })
            .await;
        (ended, conn)
    });
    Gated {
        inside,
        release,
        counts,
        stop,
        task,
    }
}

#[test]
fn quarantine_without_a_confirm_is_requeued_and_shutdown_does_not_wait_for_the_broker() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;

        let mut g = gated(&w, &via, Duration::from_millis(300)).await;
        // From the release the broker hears nothing from the consumer, and it nothing from the
        // broker.
        g.fail_all(&w, &proxy, ("evt_blocked", 1), Mode::BlackHole)
            .await;
        let Gated {
            mut counts,
            stop,
            task,
            ..
        } = g;
        let requeued = tokio::time::timeout(
            Duration::from_secs(20),
            counts.wait_for(|c| c.requeued >= 1),
        )
        .await
        .expect("the quarantine gave up after its deadline")
        .map(|c| *c)
        .unwrap();

        let began = Instant::now();
        stop.send(()).unwrap();
        let (ended, conn) = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("shutdown finished while the broker was silent")
            .unwrap();
        let shutdown = began.elapsed();
        let held = Stats::get(&proxy.stats.held);
        eprintln!(
            "amqp silent broker: quarantine requeued after its 300 ms deadline ({requeued:?}); shutdown took {shutdown:?}, {held} chunks held by the proxy"
        );
        assert!(held >= 1, "the proxy held the consumer's traffic");
        assert_eq!((requeued.quarantined, requeued.acked), (0, 0));
        ended.unwrap();

        // The connection dies: the broker takes the unacknowledged message back.
        proxy.set(Mode::Reset);
        drop(conn);
        w.wait_ready(&w.queue, 1).await;
        w.cleanup().await;
    });
}

/// 64 quarantines at once (the prefetch) while the broker is silent: each copy waits for the
/// one before it (one copy in flight on the channel), and that wait is bounded by the same
/// deadline. Taken in turn, each after its own 300 ms deadline, the last would be requeued
/// after 19.2 s at the least; the bound of 10 s is generous for the one or two deadlines they
/// take together, and tells the two apart on any machine that runs the test at all.
#[test]
fn quarantines_queued_behind_a_silent_broker_are_requeued_after_one_deadline_not_one_each() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        const POISON: u64 = 64;
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;
        let mut g = gated(&w, &via, Duration::from_millis(300)).await;
        let began = g
            .fail_all(&w, &proxy, ("evt_poison", POISON), Mode::BlackHole)
            .await;
        let Gated {
            mut counts,
            stop,
            task,
            ..
        } = g;
        let requeued = tokio::time::timeout(
            Duration::from_secs(30),
            counts.wait_for(|c| c.requeued >= POISON),
        )
        .await
        .expect("every quarantine gave up")
        .map(|c| *c)
        .unwrap();
        let took = began.elapsed();
        eprintln!("amqp silent broker: {POISON} quarantines requeued after {took:?}");
        assert!(Stats::get(&proxy.stats.held) >= 1, "the proxy held traffic");
        assert_eq!((requeued.quarantined, requeued.acked), (0, 0));
        assert!(
            took < Duration::from_secs(10),
            "{POISON} quarantines took {took:?}: one deadline after another"
        );
        stop.send(()).unwrap();
        let (ended, conn) = task.await.unwrap();
        ended.unwrap();
        proxy.set(Mode::Reset);
        drop(conn);
        w.cleanup().await;
    });
}

/// Behind a slow broker that answers (every chunk held 100 ms each way: each copy's confirm
/// takes about 300 ms, well within the 2 s deadline), 24 copies queued together wait their
/// turn, more than two deadlines for the last ones, and all are quarantined: none is requeued
/// for having waited.
#[test]
fn quarantines_queued_behind_a_slow_broker_keep_their_turn() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        const POISON: u64 = 24;
        const DEADLINE: Duration = Duration::from_secs(2);
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;
        let mut g = gated(&w, &via, DEADLINE).await;
        let slow = Mode::Delay(Duration::from_millis(100));
        let began = g.fail_all(&w, &proxy, ("evt_slow", POISON), slow).await;
        let Gated {
            mut counts,
            stop,
            task,
            ..
        } = g;
        let done = tokio::time::timeout(
            Duration::from_secs(60),
            counts.wait_for(|c| c.quarantined + c.requeued >= POISON),
        )
        .await
        .expect("every quarantine ended")
        .map(|c| *c)
        .unwrap();
        let took = began.elapsed();
        eprintln!("amqp slow broker: {POISON} quarantines in {took:?}: {done:?}");
        // The fault: the copies together took more than two deadlines, so the last waited past
        // one (a copy gives up no sooner than a deadline after it began to wait).
        assert!(took > 2 * DEADLINE, "the broker was not slow: {took:?}");
        assert_eq!((done.quarantined, done.requeued), (POISON, 0));
        proxy.set(Mode::Pass);
        stop.send(()).unwrap();
        let (ended, conn) = task.await.unwrap();
        ended.unwrap();
        drop(conn);
        w.cleanup().await;
    });
}

/// A stop while copies wait their turn behind a slow broker: they give up their turn at once,
/// nothing sent, and are requeued, instead of holding the stop for a confirm each (24 copies
/// at about 300 ms each: some 7 s).
#[test]
fn a_stop_does_not_wait_for_the_copies_in_line() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        const POISON: u64 = 24;
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;
        let mut g = gated(&w, &via, Duration::from_secs(2)).await;
        let slow = Mode::Delay(Duration::from_millis(100));
        g.fail_all(&w, &proxy, ("evt_line", POISON), slow).await;
        let Gated {
            mut counts,
            stop,
            task,
            ..
        } = g;
        // The line moves: one copy is through.
        let moving = counts.wait_for(|c| c.quarantined >= 1);
        tokio::time::timeout(Duration::from_secs(30), moving)
            .await
            .expect("a copy got through")
            .unwrap();
        let began = Instant::now();
        stop.send(()).unwrap();
        let (ended, conn) = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the stop ended the run")
            .unwrap();
        let took = began.elapsed();
        let done = *counts.borrow();
        eprintln!("amqp stop behind a slow broker: ended after {took:?}: {done:?}");
        ended.unwrap();
        assert!(
            done.requeued >= POISON / 2,
            "the copies in line were not given up: {done:?} after {took:?}"
        );
        proxy.set(Mode::Pass);
        drop(conn);
        w.cleanup().await;
    });
}

#[test]
fn a_broker_silent_at_start_fails_the_run_after_the_deadline() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let (proxy, via) = proxied(&url).await;
        let apply = from_fn(|_: Event, _| async { Err(ProcessError::Handler("unused".into())) });
        let mut options = w.options();
        options.confirm_timeout = Duration::from_millis(300);
        let consumer = Consumer::new(apply, options);

        // Connected, then the broker goes silent: the channel's open is never answered.
        let conn = connect(&via).await;
        proxy.set(Mode::BlackHole);
        let began = Instant::now();
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            consumer.run(&conn, std::future::pending()),
        )
        .await
        .expect("run gave up on the silent broker");
        eprintln!(
            "amqp broker silent at start: run ended after {:?} with {ended:?}",
            began.elapsed()
        );
        assert!(
            matches!(
                ended,
                Err(ConsumeError::Timeout {
                    call: "channel.open",
                    ..
                })
            ),
            "{ended:?}"
        );
        assert_eq!(*consumer.counts().borrow(), Default::default());

        proxy.set(Mode::Reset);
        drop(conn);
        w.cleanup().await;
    });
}
