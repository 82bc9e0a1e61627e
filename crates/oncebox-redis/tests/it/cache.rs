//! The duplicate cache for a gateway on several nodes: filled only after the inbox committed,
//! read by any node, never answering a conflict or a live lease.

use std::time::Duration;

use oncebox_core::{ProcessError, Processed, Response};
use oncebox_sqlite::Inbox;
use oncebox_testkit::run;

use crate::harness::{Namespace, event, shared};
use crate::lease::leased;

#[test]
fn duplicate_cache_answers_only_what_the_inbox_committed() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let (node_a, node_b) = (ns.leases().await, ns.leases().await);
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(oncebox_sqlite::Options::new(dir.path().join("inbox.db"))).unwrap();
        let e = event("evt-1", 1);

        assert_eq!(node_a.recall(&e).await.unwrap(), None, "nothing cached yet");
        let first = Response::completed("accepted");
        let reply = first.clone();
        let out = inbox.process(e.clone(), move |_| Ok(reply)).await.unwrap();
        assert!(matches!(out, Processed::Applied(_)));
        // After the commit, and only then, node A caches the answer.
        assert!(node_a.remember(&e, &first).await.unwrap());
        assert_eq!(node_b.recall(&e).await.unwrap(), Some(first.clone()));

        // The first answer wins; another payload is the inbox's to judge (and record).
        assert!(
            !node_b
                .remember(&e, &Response::completed("other"))
                .await
                .unwrap()
        );
        assert_eq!(node_a.recall(&e).await.unwrap(), Some(first.clone()));
        let reused = event("evt-1", 2);
        assert_eq!(node_b.recall(&reused).await.unwrap(), None);
        let out = inbox
            .process(reused, |_| Ok(Response::completed("never")))
            .await;
        assert!(matches!(out, Err(ProcessError::Conflict { .. })), "{out:?}");

        // A key under a live lease is not overwritten by the cache, and not answered from it.
        let leased_event = event("evt-2", 1);
        let lease = leased(node_a.begin(&leased_event, Duration::from_secs(30)).await);
        assert!(!node_b.remember(&leased_event, &first).await.unwrap());
        assert_eq!(node_b.recall(&leased_event).await.unwrap(), None);
        node_a
            .complete(&lease, &Response::completed("holder"))
            .await
            .unwrap();
        assert_eq!(
            node_b.recall(&leased_event).await.unwrap(),
            Some(Response::completed("holder"))
        );
    });
}
