//! A lease write whose answer is lost after Redis ran its script (the connection cut on the
//! way back): the holder is told the outcome is unknown (`CommitUnknown`), not that nothing
//! was kept; the key is free, and a repeated `release` reads `Fenced`. A `begin` whose answer
//! is lost is repeated, and answered with the lease it took.

use std::time::Duration;

use oncebox_core::{Begun, LeaseError, Unavailable};
use oncebox_redis::Leases;
use oncebox_testkit::proxy::{Mode, Stats};
use oncebox_testkit::run;

use crate::harness::{Namespace, event, proxied, shared};
use crate::lease::leased;

const TTL: Duration = Duration::from_secs(30);

#[test]
fn a_release_whose_answer_is_lost_is_commit_unknown_and_frees_the_key() {
    release_answer_lost(Mode::DropReply);
}

/// The same when a proxy in between (Envoy, say) loses its upstream connection after it
/// forwarded the call and answers an error of its own in the reply's place: that says nothing
/// of whether the script ran, unlike an error Redis itself refuses a call with.
#[test]
fn a_release_answered_by_a_proxys_own_error_is_commit_unknown() {
    release_answer_lost(Mode::AnswerInstead(b"-upstream failure\r\n".to_vec()));
}

fn release_answer_lost(mode: Mode) {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let direct = ns.leases().await;
        // Only the answer to the call naming this key's event is dropped.
        let (proxy, via) = proxied(&url, Some(b"charge-lost")).await;
        let leases = Leases::connect(&via, ns.options()).await.unwrap();
        // The release script is loaded first, through a key without the marker: a Redis that
        // does not have it cached answers the marked `EVALSHA` with `NOSCRIPT`, and dropping
        // that answer would lose a call that never ran.
        let warm = leased(leases.begin(&event("charge-warm", 5), TTL).await);
        leases.release(&warm).await.unwrap();
        let e = event("charge-lost", 5);
        let lease = leased(leases.begin(&e, TTL).await);
        proxy.set(mode);
        let released = leases.release(&lease).await;
        assert_eq!(
            Stats::get(&proxy.stats.dropped_replies),
            1,
            "the answer was lost"
        );
        assert!(
            matches!(
                released,
                Err(LeaseError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{released:?}"
        );
        // The script ran: the key is free for anyone.
        assert!(matches!(direct.begin(&e, TTL).await, Ok(Begun::Leased(_))));
        proxy.set(Mode::Pass);
        // Repeated as a holder would while it is told Redis is unavailable: the connection
        // the proxy closed may fail a call before it is replaced.
        let mut again = leases.release(&lease).await;
        for _ in 0..10 {
            if !matches!(again, Err(LeaseError::Unavailable(_))) {
                break;
            }
            again = leases.release(&lease).await;
        }
        assert!(matches!(again, Err(LeaseError::Fenced)), "{again:?}");
    });
}

/// A `begin` whose reply is lost after Redis took the lease: repeated by the tier with the
/// same attempt id, it is answered with that lease (same token), which its holder completes;
/// any other caller finds the key busy. Before, the caller heard `CommitUnknown`, and its own
/// retry was answered busy for the whole lease that nobody knew it held.
#[test]
fn a_begin_whose_reply_is_lost_is_answered_with_the_lease_it_took() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let direct = ns.leases().await;
        let (proxy, via) = proxied(&url, Some(b"charge-begun")).await;
        let leases = Leases::connect(&via, ns.options()).await.unwrap();
        // The begin script is loaded first, through a key without the marker (a `NOSCRIPT`
        // answer dropped would lose a call that never ran).
        let warm = leased(leases.begin(&event("charge-warm", 5), TTL).await);
        leases.release(&warm).await.unwrap();
        let e = event("charge-begun", 5);
        proxy.set(Mode::DropFirstReply);
        let begun = leases.begin(&e, TTL).await;
        assert_eq!(
            Stats::get(&proxy.stats.dropped_replies),
            1,
            "the answer was lost"
        );
        let lease = leased(begun);
        assert!(!lease.taken_over, "{lease:?}");
        // Taken once: the key is busy for everyone else, and the lease is its holder's.
        let other = direct.begin(&e, TTL).await;
        assert!(
            matches!(other, Err(oncebox_core::ProcessError::InProgress { .. })),
            "{other:?}"
        );
        let done = oncebox_core::Response::completed("charged");
        leases.complete(&lease, &done).await.unwrap();
        assert!(matches!(
            direct.begin(&e, TTL).await,
            Ok(Begun::Duplicate(_))
        ));
    });
}
