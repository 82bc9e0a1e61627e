//! A Redis that stops answering (packets dropped, the connection left open): every call ends
//! at the tier's deadline as `Deadline`, which says nothing about the key, and a call held in
//! the network that reaches Redis late still runs there.

use std::time::Duration;

use oncebox_core::{LeaseError, ProcessError, Response, Unavailable};
use oncebox_redis::Leases;
use oncebox_testkit::proxy::Mode;
use oncebox_testkit::run;

use crate::harness::{Namespace, event, proxied, query, raw, shared, wait_until};
use crate::lease::leased;

const TTL: Duration = Duration::from_secs(30);
/// Far past the deadline: only a call that never ends meets it.
const HUNG: Duration = Duration::from_secs(30);

#[test]
fn a_redis_that_stops_answering_is_unavailable_at_the_deadline() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let (proxy, via) = proxied(&url, None).await;
        // Also the warm-up's deadline, on the shared Redis before any fault: long enough that a
        // slow moment of a loaded machine does not end it.
        let options = ns.options().deadline(Duration::from_secs(2));
        let leases = Leases::connect(&via, options).await.unwrap();
        // Both scripts loaded first: a Redis without them cached answers a held `EVALSHA`
        // with `NOSCRIPT`, and the call the network held would then never run.
        let warm = leased(leases.begin(&event("warm", 1), TTL).await);
        leases
            .complete(&warm, &Response::completed("ok"))
            .await
            .unwrap();
        let held = leased(leases.begin(&event("before", 1), TTL).await);

        proxy.set(Mode::BlackHole);
        let late = event("held", 1);
        let begun = tokio::time::timeout(HUNG, leases.begin(&late, TTL))
            .await
            .expect("the deadline never fired");
        assert!(
            matches!(begun, Err(ProcessError::Unavailable(Unavailable::Deadline))),
            "{begun:?}"
        );
        let completed =
            tokio::time::timeout(HUNG, leases.complete(&held, &Response::completed("ok")))
                .await
                .expect("the deadline never fired");
        assert_eq!(
            completed,
            Err(LeaseError::Unavailable(Unavailable::Deadline))
        );

        // The network heals: what it held reaches Redis, late, and runs. The `begin` the
        // caller was told nothing about takes its lease; the `complete` is done, and its
        // holder's repeat is answered as its own.
        proxy.set(Mode::Pass);
        let conn = raw(&url).await;
        let (leased_late, done) = (ns.record(&late.key), ns.record(&held.key));
        wait_until(
            "the held calls reach Redis",
            Duration::from_secs(10),
            || {
                let mut conn = conn.clone();
                let (leased_late, done) = (leased_late.clone(), done.clone());
                async move {
                    let late: Option<String> =
                        query(&mut conn, "HGET", &[&leased_late, "state"]).await;
                    let held: Option<String> = query(&mut conn, "HGET", &[&done, "state"]).await;
                    late.as_deref() == Some("processing") && held.as_deref() == Some("done")
                }
            },
        )
        .await;
        let direct = ns.leases().await;
        assert!(matches!(
            direct.begin(&late, TTL).await,
            Err(ProcessError::InProgress { .. })
        ));
        assert_eq!(
            leases.complete(&held, &Response::completed("ok")).await,
            Ok(())
        );
    });
}

/// "No deadline" written as `Duration::MAX`: each call's cutoff, now plus the deadline,
/// overflowed the clock and panicked in every call. It is taken as the longest wait a store
/// keeps.
#[test]
fn a_deadline_of_duration_max_is_the_longest_wait() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let options = ns.options().deadline(Duration::MAX);
        let leases = Leases::connect(&url, options).await.unwrap();
        let lease = leased(leases.begin(&event("max", 1), TTL).await);
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .expect("completed");
    });
}

/// A link slow enough that each answer takes longer than the Redis client's own defaults (1 s
/// to connect, 500 ms per answer) but well within the caller's deadline: the first connection
/// used those defaults and failed at once as `Deadline`, whatever deadline was asked for.
#[test]
fn a_slow_link_within_the_deadline_connects() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let (proxy, via) = proxied(&url, None).await;
        // Each chunk waits 700 ms each way: 1.4 s per answer.
        proxy.set(Mode::Delay(Duration::from_millis(700)));
        let options = ns.options().deadline(Duration::from_secs(20));
        let leases = Leases::connect(&via, options)
            .await
            .expect("connected within the deadline");
        let lease = leased(leases.begin(&event("slow", 1), TTL).await);
        assert!(
            oncebox_testkit::proxy::Stats::get(&proxy.stats.held) > 0,
            "the link was slow"
        );
        proxy.set(Mode::Pass);
        leases
            .complete(&lease, &Response::completed("ok"))
            .await
            .expect("completed");
    });
}
