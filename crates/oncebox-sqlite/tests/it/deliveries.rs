//! The delivery conformance suite on SQLite: the gateway's and the relay's stores on one real
//! file.

use std::sync::Arc;

use oncebox_core::ManualClock;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::relay::{DeliveryBackend, Holding};

/// The SQLite backend under the suite: a store on a file in a temporary directory that lives as
/// long as the store.
pub struct Sqlite;

impl DeliveryBackend for Sqlite {
    type Store = Holding<Inbox>;

    async fn fresh_store(clock: ManualClock) -> Holding<Inbox> {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = Options::new(dir.path().join("oncebox.db")).clock(Arc::new(clock));
        Holding::new(Inbox::open(options).expect("open"), dir)
    }

    async fn fresh_pair(clock: ManualClock) -> (Holding<Inbox>, Holding<Inbox>) {
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let path = dir.path().join("oncebox.db");
        let open = || {
            let options = Options::new(&path).clock(Arc::new(clock.clone()));
            Holding::new(Inbox::open(options).expect("open"), dir.clone())
        };
        (open(), open())
    }
}

oncebox_testkit::delivery_conformance!(Sqlite);

/// A backward clock jump re-anchors a dead relay's lease (one clock: every process on a SQLite
/// file runs on one machine).
#[test]
fn a_backward_clock_jump_holds_a_lease_one_lease_length_not_the_jump() {
    oncebox_testkit::run(
        oncebox_testkit::relay::a_backward_clock_jump_holds_a_lease_one_lease_length_not_the_jump::<
            Sqlite,
        >(),
    );
}

#[test]
fn a_lease_is_re_anchored_only_when_taken_over_a_lease_ahead() {
    oncebox_testkit::run(
        oncebox_testkit::relay::a_lease_is_re_anchored_only_when_taken_over_a_lease_ahead::<Sqlite>(
        ),
    );
}
