//! The duplicate cache for a gateway on several nodes: filled only after the inbox committed,
//! read by any node, never answering a conflict or a live lease, never outliving the record.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Clock, ManualClock, ProcessError, Processed, Response, Retention, Timestamp};
use oncebox_redis::Leases;
use oncebox_sqlite::Inbox;
use oncebox_testkit::run;

use crate::harness::{Namespace, event, query, raw, shared};
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
        // Read before `process`: no later than the commit, so the cache expires no later.
        let before = node_a.options().clock.now();
        let out = inbox.process(e.clone(), move |_| Ok(reply)).await.unwrap();
        assert!(matches!(out, Processed::Applied(_)));
        // After the commit, and only then, node A caches the answer.
        assert!(node_a.remember(&e, &first, before).await.unwrap());
        assert_eq!(node_b.recall(&e).await.unwrap(), Some(first.clone()));

        // The first answer wins; another payload is the inbox's to judge (and record).
        assert!(
            !node_b
                .remember(&e, &Response::completed("other"), before)
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
        assert!(
            !node_b
                .remember(&leased_event, &first, before)
                .await
                .unwrap()
        );
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

/// The inbox purges a record its retention after its completion. A copy cached later — after
/// a `Duplicate`, once Redis had forgotten the key — lives only what is left of that retention,
/// and caching it again later does not push its expiry back: Redis never answers `Duplicate`
/// for a key the inbox may no longer hold.
#[test]
fn a_cached_answer_expires_with_the_inbox_record_never_later() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let options = ns
            .options()
            .retention(Retention::new(Duration::from_secs(60)))
            .clock(Arc::new(clock.clone()));
        let leases = Leases::connect(&url, options).await.unwrap();
        let mut conn = raw(&url).await;
        let answer = Response::completed("accepted");

        // Completed 40 s ago: 20 s of its retention are left, not a fresh minute.
        let e = event("late-1", 1);
        let completed_at = clock.now().minus(Duration::from_secs(40));
        assert!(leases.remember(&e, &answer, completed_at).await.unwrap());
        let first: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert!(first > 0 && first <= 20_000, "PTTL {first}");

        // Another `Duplicate` 10 s later caches it again, dated later (a rewrite would then
        // keep it 55 s): kept as it is, its expiry not moved.
        clock.advance(Duration::from_secs(10));
        let later = clock.now().minus(Duration::from_secs(5));
        assert!(!leases.remember(&e, &answer, later).await.unwrap());
        let again: i64 = query(&mut conn, "PTTL", &[&ns.record(&e.key)]).await;
        assert!(again > 0 && again <= first, "PTTL {again} after {first}");

        // Completed a whole retention ago: the inbox may have purged it, nothing is cached.
        let old = event("old-1", 1);
        let purgeable = clock.now().minus(Duration::from_secs(60));
        assert!(!leases.remember(&old, &answer, purgeable).await.unwrap());
        let kept: i64 = query(&mut conn, "EXISTS", &[&ns.record(&old.key)]).await;
        assert_eq!(kept, 0);
        assert_eq!(leases.recall(&old).await.unwrap(), None);
    });
}
