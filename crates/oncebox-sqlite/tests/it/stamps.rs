//! The gateway's ingest dates a record as `process` does (the conformance suite's
//! `a_clock_stepped_back_then_set_right_makes_no_record_old`): under a wall clock stepped back
//! a year, then set right, the record ages by the real time that passed, not by the step.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::store::EventStore;
use oncebox_core::{Clock, ManualClock, Processed, Retention};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::{EPOCH, run};

use crate::harness::{ingest, shop};

const DAY: Duration = Duration::from_secs(24 * 3600);

#[test]
fn ingest_under_a_clock_stepped_back_dates_no_record_old() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(EPOCH);
        let options = Options::new(dir.path().join("o.db")).clock(Arc::new(clock.clone()));
        let inbox = Inbox::open(options).unwrap();
        let retention = Retention::new(DAY * 7);
        assert_eq!(inbox.purge(clock.now(), &retention).await.unwrap(), 0);
        let right = clock.now();
        clock.set(right.minus(DAY * 365));
        let event = || ingest(shop("back", r#"{"n":1}"#));
        let out = inbox.ingest(event()).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        clock.advance(Duration::from_secs(60));
        clock.set(right.plus(Duration::from_secs(60)));
        clock.advance(DAY * 3);
        assert_eq!(inbox.purge(clock.now(), &retention).await.unwrap(), 0);
        let again = inbox.ingest(event()).await;
        assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
    });
}
