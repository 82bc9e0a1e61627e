//! A purge beside an operator's redeliver on another node: the redeliver makes the finished
//! delivery owed again while the purge is deciding. The purge must see it and keep the record
//! and the delivery; deciding on what it read before, it deleted both, and the operator's
//! "redelivered" was never sent.

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{AttemptRecord, DeliveryFilter, DeliveryStore};
use oncebox_core::store::EventStore;
use oncebox_core::{Clock, Key, ManualClock, Processed, Retention};
use oncebox_postgres::{Inbox, sqlx};
use oncebox_testkit::{EPOCH, run};

use crate::claims::routed;
use crate::harness::{options, schema, url};
use crate::hold::blocked_by;

const DAY: Duration = Duration::from_secs(24 * 3600);

#[test]
fn a_redeliver_committed_while_a_purge_decides_keeps_the_record_and_its_delivery() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock)).await.expect("open");
        let out = inbox.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let claimed = inbox
            .claim(clock.now(), 10, Duration::from_secs(30), &[])
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        let attempt = AttemptRecord {
            started_at: clock.now(),
            duration: Duration::from_millis(5),
            status: Some(200),
            error: None,
        };
        DeliveryStore::record(
            &inbox,
            &claimed[0],
            attempt,
            Verdict::Delivered,
            clock.now(),
        )
        .await
        .expect("record");
        clock.advance(DAY + Duration::from_secs(1));

        // The operator's redeliver, in flight: the delivery owed again, not yet committed.
        let mut redeliver = inbox.pool().begin().await.expect("begin");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *redeliver)
            .await
            .expect("pid");
        sqlx::query(
            "UPDATE oncebox_outbox SET state = 'pending', next_attempt_at = $1
             WHERE source = 'shop' AND event_id = 'evt-1'",
        )
        .bind(clock.now().millis())
        .execute(&mut *redeliver)
        .await
        .expect("redeliver");
        let purging = {
            let (inbox, now) = (inbox.clone(), clock.now());
            tokio::spawn(async move { inbox.purge(now, &Retention::new(DAY)).await })
        };
        // The fault: PostgreSQL says the purge waits on the redeliver's row.
        let mut look = inbox.pool().acquire().await.expect("connection");
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if blocked_by(&mut look, pid).await > 0 || purging.is_finished() {
                    return blocked_by(&mut look, pid).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the purge reached the delivery");
        assert_eq!(waited, 1, "the purge waited on the redeliver's row");
        redeliver.commit().await.expect("commit");
        let purged = purging.await.expect("task").expect("purge");
        assert_eq!(purged, 0, "a record whose delivery is owed again is kept");
        let key = Key::parse("shop", "evt-1").expect("key");
        assert!(inbox.event(&key).await.expect("event").is_some());
        let filter = DeliveryFilter {
            key: Some(key),
            limit: 10,
            ..DeliveryFilter::default()
        };
        let ds = inbox.deliveries(filter).await.expect("deliveries").items;
        let states: Vec<DeliveryState> = ds.iter().map(|d| d.state).collect();
        assert_eq!(states, [DeliveryState::Pending]);
    });
}

/// A database an earlier version purged: a finished delivery whose record is gone is cleared
/// when this version opens it; one still owed, and a library message keyed its own way, stay.
#[test]
fn finished_deliveries_left_by_earlier_purges_are_cleared_on_open() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        let inbox = Inbox::open(options(&schema, &clock)).await.expect("open");
        for (key, id, state) in [
            ("shop:gone", "gone", "delivered"),
            ("shop:owed", "owed", "retrying"),
            ("thanks:order-1", "gone", "dead"),
        ] {
            sqlx::query(
                "INSERT INTO oncebox_outbox (destination, idempotency_key, payload, content_type,
                   source, event_id, state, created_at, next_attempt_at)
                 VALUES ('hooks', $1, '\\x00', 'application/json', 'shop', $2, $3, 1, 1)",
            )
            .bind(key)
            .bind(id)
            .bind(state)
            .execute(inbox.pool())
            .await
            .expect("delivery");
        }
        // As the version before the clearing left it (the four migrations after it change
        // nothing twice).
        sqlx::query("UPDATE oncebox_schema SET version = version - 5")
            .execute(inbox.pool())
            .await
            .expect("older");
        drop(inbox);
        let inbox = Inbox::open(options(&schema, &clock))
            .await
            .expect("migrated");
        let keys: Vec<String> = sqlx::query_scalar(
            "SELECT idempotency_key FROM oncebox_outbox ORDER BY idempotency_key",
        )
        .fetch_all(inbox.pool())
        .await
        .expect("keys");
        assert_eq!(keys, ["shop:owed", "thanks:order-1"]);
    });
}

/// The gateway's batched ingest dates a record as `process` does (the conformance suite's
/// `a_clock_stepped_back_then_set_right_makes_no_record_old`): under a wall clock stepped back
/// a year, then set right, the record ages by the real time that passed, and a sender's retry
/// three days later is still a duplicate.
#[test]
fn ingest_under_a_clock_stepped_back_dates_no_record_old() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock)).await.expect("open");
        let retention = Retention::new(DAY * 7);
        assert_eq!(inbox.purge(clock.now(), &retention).await.unwrap(), 0);
        let right = clock.now();
        clock.set(right.minus(DAY * 365));
        let out = inbox.ingest(routed("evt-back", &[])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        clock.advance(Duration::from_secs(60));
        clock.set(right.plus(Duration::from_secs(60)));
        clock.advance(DAY * 3);
        assert_eq!(inbox.purge(clock.now(), &retention).await.unwrap(), 0);
        let again = inbox.ingest(routed("evt-back", &[])).await;
        assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
    });
}

/// A finished delivery an earlier build's purge left behind after this version migrated (that
/// build still running beside it during an upgrade) does not swallow the delivery of its key
/// accepted anew, on the batched path and the ordering guard's.
#[test]
fn a_finished_delivery_an_earlier_purge_left_does_not_swallow_the_keys_new_one() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock)).await.expect("open");
        for (id, ordered) in [("e1", false), ("e2", true)] {
            let ingest = || {
                let mut ingest = routed(id, &["hooks"]);
                ingest.order = ordered.then(|| oncebox_core::store::Order {
                    entity: format!("order-{id}"),
                    version: 1,
                });
                ingest
            };
            let first = inbox.ingest(ingest()).await;
            assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");
            // As an earlier build's purge left it: the record gone, its delivery kept.
            for sql in [
                "UPDATE oncebox_outbox SET state = 'delivered', attempts = 1 WHERE event_id = $1",
                "DELETE FROM oncebox_inbox WHERE event_id = $1",
                "DELETE FROM oncebox_versions WHERE entity_id = 'order-' || $1",
            ] {
                sqlx::query(sql)
                    .bind(id)
                    .execute(inbox.pool())
                    .await
                    .expect("as left");
            }
            let again = inbox.ingest(ingest()).await;
            assert!(
                matches!(again, Ok(Processed::Applied(_))),
                "{id}: {again:?}"
            );
            let rows: Vec<(String, i32)> =
                sqlx::query_as("SELECT state, attempts FROM oncebox_outbox WHERE event_id = $1")
                    .bind(id)
                    .fetch_all(inbox.pool())
                    .await
                    .expect("rows");
            assert_eq!(
                rows,
                [("pending".to_owned(), 0)],
                "{id} (ordered: {ordered})"
            );
        }
    });
}

/// A conflict recorded while a purge deletes its record (uncommitted when the purge's
/// statement took its snapshot, committed after): the purge's delete of the record's conflicts
/// did not see it, and left, it was never purged. A later purge clears it once it is older than
/// the shortest retention; a conflict whose record is there stays, however old.
#[test]
fn a_conflict_committed_behind_its_records_purge_is_cleared_by_a_later_purge() {
    if url().is_none() {
        return;
    }
    run(async {
        let clock = ManualClock::new(EPOCH);
        let inbox = Inbox::open(options(&schema(), &clock)).await.expect("open");
        let out = inbox.ingest(routed("evt-1", &[])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        clock.advance(DAY + Duration::from_secs(1));
        let conflict = |id: &'static str, at: i64| {
            sqlx::query(
                "INSERT INTO oncebox_conflicts (source, event_id, stored_fingerprint,
                   offered_fingerprint, payload, at)
                 VALUES ('shop', $1, '\\x00', '\\x01', NULL, $2)",
            )
            .bind(id)
            .bind(at)
        };
        let count = |id: &'static str| {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM oncebox_conflicts WHERE source = 'shop' AND event_id = $1",
            )
            .bind(id)
            .fetch_one(inbox.pool())
        };
        let mut racing = inbox.pool().begin().await.expect("begin");
        conflict("evt-1", clock.now().millis())
            .execute(&mut *racing)
            .await
            .expect("conflict");
        let purged = inbox.purge(clock.now(), &Retention::new(DAY)).await;
        assert_eq!(purged.expect("purge"), 1);
        racing.commit().await.expect("commit");
        assert_eq!(count("evt-1").await.expect("count"), 1, "left behind");
        clock.advance(Duration::from_secs(3600));
        inbox
            .purge(clock.now(), &Retention::new(DAY))
            .await
            .expect("purge");
        assert_eq!(
            count("evt-1").await.expect("count"),
            1,
            "younger than the retention"
        );
        clock.advance(DAY);
        let out = inbox.ingest(routed("evt-2", &[])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        conflict("evt-2", EPOCH.millis())
            .execute(inbox.pool())
            .await
            .expect("conflict");
        let purged = inbox.purge(clock.now(), &Retention::new(DAY)).await;
        assert_eq!(purged.expect("purge"), 0, "evt-2 is young");
        assert_eq!(count("evt-1").await.expect("count"), 0, "cleared");
        assert_eq!(
            count("evt-2").await.expect("count"),
            1,
            "its record is there"
        );
    });
}
