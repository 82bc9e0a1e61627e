//! The delivery conformance suite on SQLite: the gateway's and the relay's stores on one real
//! file; and rows an edit by hand left unlike what oncebox writes.

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

/// Nor does it hold a scheduled delivery (pending, or waiting out a backoff) by the jump, seen
/// by a relay that claimed before it or by one started after it.
#[test]
fn a_backward_clock_jump_delays_no_scheduled_delivery_by_the_jump() {
    oncebox_testkit::run(
        oncebox_testkit::relay::a_backward_clock_jump_delays_no_scheduled_delivery_by_the_jump::<
            Sqlite,
        >(),
    );
    oncebox_testkit::run(
        oncebox_testkit::relay::a_relay_started_after_a_backward_jump_finds_the_schedules_due_as_before::<
            Sqlite,
        >(),
    );
}

#[test]
fn a_forward_clock_jump_takes_over_no_live_lease() {
    oncebox_testkit::run(
        oncebox_testkit::relay::a_forward_clock_jump_takes_over_no_live_lease::<Sqlite>(),
    );
    oncebox_testkit::run(
        oncebox_testkit::relay::a_forward_clock_jump_refuses_no_live_holders_outcome::<Sqlite>(),
    );
    oncebox_testkit::run(
        oncebox_testkit::relay::a_forward_clock_jump_ages_no_retry_budget::<Sqlite>(),
    );
}

#[test]
fn a_lease_is_re_anchored_only_when_taken_over_a_lease_ahead() {
    oncebox_testkit::run(
        oncebox_testkit::relay::a_lease_is_re_anchored_only_when_taken_over_a_lease_ahead::<Sqlite>(
        ),
    );
}

/// Rows an edit by hand left unlike what oncebox writes (SQLite keeps any type in any column):
/// a text payload is still its bytes and is sent; a value of another type, or a key that no
/// longer validates, parks its row dead with the reason. Before, one such row failed every
/// claim of every relay; and an uncertain row without `updated_at` (written before that column)
/// failed every status check of it.
#[test]
fn rows_an_edit_left_unreadable_are_parked_not_allowed_to_fail_every_claim() {
    use oncebox_core::relay_store::{DeliveryStore, StatusAnswer};
    use oncebox_core::{Clock, Timestamp};

    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("oncebox.db");
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let inbox = Inbox::open(Options::new(&path).clock(Arc::new(clock.clone()))).unwrap();
        let now = clock.now().millis();
        let raw = rusqlite::Connection::open(&path).unwrap();
        let row = |id: &str, payload: &str, created_at: &str, source: &str| {
            raw.execute(
                &format!(
                    "INSERT INTO oncebox_outbox (destination, idempotency_key, payload,
                       content_type, source, event_id, created_at, next_attempt_at)
                     VALUES ('hooks', '{id}', {payload}, 'application/json', '{source}', '{id}',
                       {created_at}, {now})"
                ),
                [],
            )
            .unwrap();
        };
        row("real", "x'7b7d'", "1.5", "shop");
        row("text", "'{\"a\":1}'", &now.to_string(), "shop");
        row("key", "x'7b7d'", &now.to_string(), "Not A Source");
        row("fine", "x'7b7d'", &now.to_string(), "shop");
        let lease = std::time::Duration::from_secs(60);
        let claimed = inbox.claim(clock.now(), 10, lease, &[]).await.unwrap();
        let sent: Vec<(&str, &[u8])> = claimed
            .iter()
            .map(|c| (c.key.event_id.as_str(), c.payload.as_slice()))
            .collect();
        assert_eq!(sent, [("text", &b"{\"a\":1}"[..]), ("fine", b"{}")]);
        let parked: Vec<(String, String, String)> = raw
            .prepare("SELECT event_id, state, last_error FROM oncebox_outbox ORDER BY id")
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2).unwrap_or_default()))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            (parked[0].0.as_str(), parked[0].1.as_str()),
            ("real", "dead")
        );
        assert!(
            parked[0].2.starts_with("stored row no longer reads"),
            "{parked:?}"
        );
        assert_eq!(
            (parked[2].0.as_str(), parked[2].1.as_str()),
            ("key", "dead")
        );
        assert!(
            parked[2].2.starts_with("stored key no longer validates"),
            "{parked:?}"
        );

        raw.execute(
            "UPDATE oncebox_outbox SET state = 'uncertain', updated_at = NULL
             WHERE event_id = 'fine'",
            [],
        )
        .unwrap();
        // Made uncertain by hand: no attempt was recorded.
        let id = claimed[1].id;
        let asked = inbox
            .reconcile(id, 0, StatusAnswer::NoAnswer, clock.now())
            .await;
        assert_eq!(asked, Ok(true), "asked again later");
    });
}

/// A finished delivery an earlier build's purge left behind (it took the record and not its
/// deliveries; such a build may still run beside this one during an upgrade) does not swallow
/// the delivery of its key accepted anew, on the unordered path and the ordering guard's.
#[test]
fn a_finished_delivery_an_earlier_purge_left_does_not_swallow_the_keys_new_one() {
    use oncebox_core::store::{EventStore, Ingest, Order};
    use oncebox_core::{Processed, Timestamp};

    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("oncebox.db");
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let open = || Inbox::open(Options::new(&path).clock(Arc::new(clock.clone()))).unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        for (id, ordered) in [("e1", false), ("e2", true)] {
            let inbox = open();
            let ingest = || {
                let mut ingest = crate::harness::ingest(crate::harness::shop(id, r#"{"n":1}"#));
                ingest.routes = vec!["hooks".to_owned()];
                ingest.order = ordered.then(|| Order {
                    entity: format!("order-{id}"),
                    version: 1,
                });
                ingest
            };
            let first: Ingest = ingest();
            assert!(matches!(
                inbox.ingest(first).await,
                Ok(Processed::Applied(_))
            ));
            // As an earlier build's purge left it: the record gone, its delivery kept.
            raw.execute_batch(&format!(
                "UPDATE oncebox_outbox SET state = 'delivered', attempts = 1 WHERE event_id = '{id}';
                 DELETE FROM oncebox_inbox WHERE event_id = '{id}';
                 DELETE FROM oncebox_versions;"
            ))
            .unwrap();
            // Another process: this one's memory of recent answers still holds the key.
            drop(inbox);
            let again = open().ingest(ingest()).await;
            assert!(
                matches!(again, Ok(Processed::Applied(_))),
                "{id}: {again:?}"
            );
            let rows: Vec<(String, i64)> = raw
                .prepare("SELECT state, attempts FROM oncebox_outbox WHERE event_id = ?1")
                .unwrap()
                .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert_eq!(
                rows,
                [("pending".to_owned(), 0)],
                "{id} (ordered: {ordered})"
            );
        }
    });
}
