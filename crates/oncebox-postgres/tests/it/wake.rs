//! Relay wake-ups through `LISTEN`/`NOTIFY`: a relay waiting for work wakes when another node
//! commits a delivery, or an operator makes one due again, long before its poll would end.
//! Each test runs on a database of its own, where nothing else notifies.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore};
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, Key, ManualClock, Processed};
use oncebox_postgres::{Inbox, Options};
use oncebox_testkit::{EPOCH, run};

use crate::claims::routed;
use crate::database::OwnDatabase;

/// A poll far longer than any test: a wait that ends within [`PROMPT`] was ended by a
/// notification.
const LONG: Duration = Duration::from_secs(3600);
const PROMPT: Duration = Duration::from_secs(20);
const LEASE: Duration = Duration::from_secs(30);

async fn node(db: &OwnDatabase, clock: &ManualClock) -> Inbox {
    let options = Options::new(db.url.clone())
        .clock(Arc::new(clock.clone()))
        .max_connections(4);
    Inbox::open(options).await.expect("open")
}

/// Whether a relay's long wait ended within [`PROMPT`], that is, was woken.
async fn woken(relay: &Inbox) -> bool {
    tokio::time::timeout(PROMPT, relay.wait_for_work(LONG))
        .await
        .is_ok()
}

/// A relay's wait, begun before the caller acts, as a relay waits in the field. Should the
/// notification come before the task first runs, it is kept as a permit that ends the wait
/// (`listen.rs`): either way, the wait ends only if the action notified, since every earlier
/// notification was waited for already.
fn waiter(relay: &Inbox) -> tokio::task::JoinHandle<bool> {
    let relay = relay.clone();
    tokio::spawn(async move { woken(&relay).await })
}

#[test]
fn waiting_relay_wakes_when_another_node_ingests_an_event_with_a_route() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let clock = ManualClock::new(EPOCH);
        let (relay, gateway) = (node(&db, &clock).await, node(&db, &clock).await);
        // As the relay does before its first claim: LISTEN is registered when this returns.
        relay.wait_for_work(Duration::ZERO).await;
        let quiet = tokio::time::timeout(Duration::from_millis(200), relay.wait_for_work(LONG));
        assert!(
            quiet.await.is_err(),
            "nothing happened: the wait must not end"
        );
        let waiting = {
            let relay = relay.clone();
            tokio::spawn(async move { woken(&relay).await })
        };
        let out = gateway.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert!(
            waiting.await.expect("waiter"),
            "woken by the other node's commit"
        );
        let claimed = relay
            .claim(clock.now(), 10, LEASE, &[])
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "the commit is visible to the woken relay");
        drop((relay, gateway));
        db.drop().await;
    });
}

#[test]
fn retry_and_redeliver_wake_waiting_relays() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let clock = ManualClock::new(EPOCH);
        let (relay, operator) = (node(&db, &clock).await, node(&db, &clock).await);
        relay.wait_for_work(Duration::ZERO).await;
        operator
            .ingest(routed("evt-1", &["hooks"]))
            .await
            .expect("ingest");
        assert!(woken(&relay).await, "the ingest's notification");
        let now = clock.now();
        let attempt = |status| AttemptRecord {
            started_at: now,
            duration: Duration::from_millis(5),
            status: Some(status),
            error: None,
        };
        let c = relay.claim(now, 10, LEASE, &[]).await.expect("claim");
        assert_eq!(c.len(), 1);
        let dead = Verdict::Dead("receiver answered 410".into());
        DeliveryStore::record(&relay, &c[0], attempt(410), dead, now)
            .await
            .expect("record");
        // An operator on another node makes the dead delivery due again, while the relay waits.
        let waiting = waiter(&relay);
        assert!(operator.retry(c[0].id, now).await.expect("retry"));
        assert!(waiting.await.expect("waiter"), "retry wakes the relay");
        let again = relay.claim(now, 10, LEASE, &[]).await.expect("claim");
        assert_eq!((again.len(), again[0].id), (1, c[0].id));
        DeliveryStore::record(&relay, &again[0], attempt(200), Verdict::Delivered, now)
            .await
            .expect("record");
        let key = Key::parse("shop", "evt-1").expect("key");
        let waiting = waiter(&relay);
        assert_eq!(operator.redeliver(&key, now).await.expect("redeliver"), 1);
        assert!(waiting.await.expect("waiter"), "redeliver wakes the relay");
        let replay = relay.claim(now, 10, LEASE, &[]).await.expect("claim");
        assert_eq!(
            replay
                .iter()
                .map(|c| (c.id, c.attempts))
                .collect::<Vec<_>>(),
            [(c[0].id, 2)]
        );
        let listed = relay
            .deliveries(Default::default())
            .await
            .expect("deliveries");
        assert_eq!(listed.items[0].state, DeliveryState::InFlight);
        drop((relay, operator));
        db.drop().await;
    });
}

/// Deployments in two schemas of one database: a commit in one wakes only its own relays (one
/// channel per schema, `outbox_channel`), where before every relay of the database woke for
/// an empty claim.
#[test]
fn a_relay_is_woken_only_by_its_own_schema() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let clock = ManualClock::new(EPOCH);
        let open = |schema: &str| {
            let options = Options::new(db.url.clone())
                .schema(schema)
                .clock(Arc::new(clock.clone()))
                .max_connections(4);
            Inbox::open(options)
        };
        let (relay_a, gateway_a) = (
            open("deploy_a").await.unwrap(),
            open("deploy_a").await.unwrap(),
        );
        let gateway_b = open("deploy_b").await.unwrap();
        relay_a.wait_for_work(Duration::ZERO).await;
        let waiting = {
            let relay = relay_a.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(2), relay.wait_for_work(LONG))
                    .await
                    .is_ok()
            })
        };
        let out = gateway_b.ingest(routed("evt-b", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert!(!waiting.await.unwrap(), "woken by another schema's commit");
        let waiting = {
            let relay = relay_a.clone();
            tokio::spawn(async move { woken(&relay).await })
        };
        let out = gateway_a.ingest(routed("evt-a", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        assert!(
            waiting.await.unwrap(),
            "not woken by its own schema's commit"
        );
        drop((relay_a, gateway_a, gateway_b));
        db.drop().await;
    });
}
