//! A lease write whose answer is lost after Redis ran its script (the connection cut on the
//! way back): the holder is told the outcome is unknown (`CommitUnknown`), not that nothing
//! was kept; the key is free, and a repeated `release` reads `Fenced`.

use std::time::Duration;

use oncebox_core::{Begun, LeaseError, Unavailable};
use oncebox_redis::Leases;
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::run;

use crate::harness::{Namespace, event, shared};
use crate::lease::leased;

const TTL: Duration = Duration::from_secs(30);

#[test]
fn a_release_whose_answer_is_lost_is_commit_unknown_and_frees_the_key() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let direct = ns.leases().await;
        let server = redis::Client::open(url.as_str()).unwrap();
        let info = server.get_connection_info();
        let upstream = tokio::net::lookup_host(info.addr().to_string())
            .await
            .unwrap()
            .next()
            .unwrap();
        // Only the answer to the call naming this key's event is dropped.
        let proxy = Proxy::start_with_marker(upstream, Some(b"charge-lost".to_vec())).await;
        let via = url.replacen(&info.addr().to_string(), &proxy.addr().to_string(), 1);
        let leases = Leases::connect(&via, ns.options()).await.unwrap();
        let e = event("charge-lost", 5);
        let lease = leased(leases.begin(&e, TTL).await);
        proxy.set(Mode::DropReply);
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
        assert!(matches!(
            leases.release(&lease).await,
            Err(LeaseError::Fenced)
        ));
    });
}
