//! The delivery conformance suite on PostgreSQL: the gateway's and the relay's stores on one
//! real database, each test in a schema of its own.

use oncebox_core::ManualClock;
use oncebox_postgres::Inbox;
use oncebox_testkit::relay::DeliveryBackend;

use crate::harness;

/// The PostgreSQL backend under the suite: a store in a fresh schema of the test database.
pub struct Postgres;

impl DeliveryBackend for Postgres {
    type Store = Inbox;

    async fn fresh_store(clock: ManualClock) -> Inbox {
        let options = harness::options(&harness::schema(), &clock);
        Inbox::open(options).await.expect("open")
    }

    async fn fresh_pair(clock: ManualClock) -> (Inbox, Inbox) {
        let schema = harness::schema();
        let one = Inbox::open(harness::options(&schema, &clock)).await;
        let two = Inbox::open(harness::options(&schema, &clock)).await;
        (one.expect("open"), two.expect("open"))
    }

    fn available() -> bool {
        harness::url().is_some()
    }
}

oncebox_testkit::delivery_conformance!(Postgres);
