//! A conflict whose quarantined copy the broker cannot route: it is requeued until the
//! quarantine routes again, and meanwhile not asked of the store again, which keeps an audit
//! row of the offered payload each time it is asked.

use oncebox_amqp::Consumer;
use oncebox_testkit::{run, service_url};

use crate::support::{World, start};

#[test]
fn a_conflict_whose_quarantine_is_unroutable_is_not_offered_to_the_store_again() {
    let Some(url) = service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    run(async move {
        let w = World::new(&url).await;
        let mut consumer = start(&url, Consumer::new(w.db.checked(), w.options()));
        w.publish(Some("evt_c"), r#"{"v":1}"#).await;
        consumer.wait(|c| c.applied >= 1, w.state()).await;

        let sink = w.unroute_quarantine().await;
        w.publish(Some("evt_c"), r#"{"v":2}"#).await;
        // Each copy returned unroutable, the message requeued (20 ms apart).
        let held = consumer.wait(|c| c.requeued >= 5, w.state()).await;
        assert_eq!(held.quarantined, 0, "{held:?}");
        assert_eq!(w.db.conflicts().await, 1, "one audit row, not one per try");

        w.route_quarantine_again(&sink).await;
        let done = consumer.wait(|c| c.quarantined >= 1, w.state()).await;
        consumer.stop().await;
        eprintln!(
            "amqp conflict with the quarantine unroutable: requeued {}, then quarantined",
            done.requeued
        );
        assert_eq!(w.db.conflicts().await, 1);
        let copies = w.quarantined().await;
        assert_eq!(copies.len(), 1, "{copies:?}");
        assert_eq!(copies[0].0, "key-reused");
        assert_eq!(copies[0].1, br#"{"v":2}"#);
        assert_eq!(w.db.effects("evt_c"), 1);
        w.cleanup().await;
    });
}
