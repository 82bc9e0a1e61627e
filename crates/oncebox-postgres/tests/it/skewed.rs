//! Nodes whose clocks are off the server's, on one database: lease ends are written and judged
//! on the server's clock (`skew.rs`), so a node ahead takes over no lease another node still
//! holds, and a node behind writes no lease that ends early for the others. Each node's
//! machine clock is a manual clock standing that far off the real one, measured against the
//! real server.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore, Resolve};
use oncebox_core::store::EventStore;
use oncebox_core::{
    Begun, Clock, Key, ManualClock, ProcessError, Processed, Retention, SystemClock,
};
use oncebox_postgres::Inbox;
use oncebox_testkit::proxy::{Mode, Proxy, Stats};
use oncebox_testkit::run;

use crate::claims::routed;
use crate::harness;

const LEASE: Duration = Duration::from_secs(60);
/// Further off than a lease: judged by its own clock, a node this far ahead finds every lease
/// just taken already ended, and one this far behind writes leases ended already.
const OFF: Duration = Duration::from_secs(61);

/// A node of the database in `schema` whose clock (its store's and its machine's) stands
/// `ahead` of the real one, `behind` it when negative.
async fn node(schema: &str, ahead_ms: i64) -> (Inbox, ManualClock) {
    let real = SystemClock.now();
    let clock = ManualClock::new(oncebox_core::Timestamp(real.millis() + ahead_ms));
    let mut options = harness::options(schema, &clock);
    if ahead_ms != 0 {
        options = options.machine_clock(Arc::new(clock.clone()));
    }
    (Inbox::open(options).await.expect("open"), clock)
}

fn off_ms() -> i64 {
    i64::try_from(OFF.as_millis()).unwrap()
}

#[test]
fn a_node_ahead_of_the_server_takes_over_no_lease_another_still_holds() {
    run(async {
        if harness::url().is_none() {
            return;
        }
        let schema = harness::schema();
        let (right, right_clock) = node(&schema, 0).await;
        let (ahead, ahead_clock) = node(&schema, off_ms()).await;
        let out = right.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let held = right
            .claim(right_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert_eq!(held.len(), 1);
        // By its own clock the lease ended a second ago; by the server's it has a minute left.
        let taken = ahead
            .claim(ahead_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert!(taken.is_empty(), "taken over early: {taken:?}");
        let resolved =
            DeliveryStore::resolve(&ahead, held[0].id, Resolve::Dead, "", ahead_clock.now())
                .await
                .unwrap();
        assert!(
            !resolved,
            "an operator settled a delivery whose relay still holds it"
        );
        // A two-phase lease likewise.
        let key = Key::parse("shop", "pay-1").unwrap();
        let pay = || oncebox_core::Event::json(key.clone(), r#"{"n":1}"#).unwrap();
        let begun = right.begin(pay(), LEASE).await.unwrap();
        assert!(matches!(begun, Begun::Leased(_)), "{begun:?}");
        let contended = ahead.begin(pay(), LEASE).await;
        assert!(
            matches!(contended, Err(ProcessError::InProgress { .. })),
            "{contended:?}"
        );
        // Not parked as abandoned by the handler form either.
        let handled = ahead
            .process(pay(), |_| {
                Box::pin(async { Ok(oncebox_core::Response::completed("x")) })
            })
            .await;
        assert!(
            matches!(handled, Err(ProcessError::InProgress { .. })),
            "{handled:?}"
        );
        // Its own lease is its own to complete half a lease later, past its end by this
        // node's clock had it been written there.
        let other = Key::parse("shop", "pay-2").unwrap();
        let begun = ahead
            .begin(oncebox_core::Event::json(other, "{}").unwrap(), LEASE)
            .await
            .unwrap();
        let Begun::Leased(mine) = begun else {
            panic!("a new key is leased: {begun:?}");
        };
        ahead_clock.advance(LEASE / 2);
        ahead
            .complete(&mine, oncebox_core::Response::completed("paid"))
            .await
            .unwrap();
        // Once the lease has ended on the server's clock too, the node ahead takes it over.
        ahead_clock.advance(LEASE / 2 + Duration::from_secs(5));
        let taken = ahead
            .claim(ahead_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert_eq!(taken.len(), 1, "an ended lease is still taken over");
        assert!(taken[0].taken_over);
        // Its attempt is recorded half a lease later: its lease ends on the server's clock.
        ahead_clock.advance(LEASE / 2);
        let attempt = AttemptRecord {
            started_at: ahead_clock.now(),
            duration: Duration::from_millis(5),
            status: Some(200),
            error: None,
        };
        let now = ahead_clock.now();
        DeliveryStore::record(&ahead, &taken[0], attempt, Verdict::Delivered, now)
            .await
            .expect("recorded within its lease");
    });
}

#[test]
fn a_node_behind_the_server_writes_no_lease_that_ends_early_for_the_others() {
    run(async {
        if harness::url().is_none() {
            return;
        }
        let schema = harness::schema();
        let (right, right_clock) = node(&schema, 0).await;
        let (behind, behind_clock) = node(&schema, -off_ms()).await;
        let out = behind.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let held = behind
            .claim(behind_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert_eq!(held.len(), 1);
        // Its holder is told the end on its own clock, which it judges its turn by.
        assert_eq!(held[0].lease_expires_at, behind_clock.now().plus(LEASE));
        // On its own clock, the lease it wrote ended a second before the server's now.
        let taken = right
            .claim(right_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert!(taken.is_empty(), "taken over early: {taken:?}");
        let key = Key::parse("shop", "pay-1").unwrap();
        let pay = || oncebox_core::Event::json(key.clone(), r#"{"n":1}"#).unwrap();
        let begun = behind.begin(pay(), LEASE).await.unwrap();
        let Begun::Leased(lease) = begun else {
            panic!("a new key is leased: {begun:?}");
        };
        let contended = right.begin(pay(), LEASE).await;
        assert!(
            matches!(contended, Err(ProcessError::InProgress { .. })),
            "{contended:?}"
        );
        // Its holder completes within its lease, as judged on the server's clock.
        behind_clock.advance(Duration::from_secs(30));
        behind
            .complete(&lease, oncebox_core::Response::completed("paid"))
            .await
            .unwrap();
        // And not past it: 65 s on, the lease ended 5 s ago on the server's clock, though on
        // this node's, 61 s behind, it would seem to have most of a minute left.
        let late = Key::parse("shop", "pay-3").unwrap();
        let begun = behind
            .begin(oncebox_core::Event::json(late, "{}").unwrap(), LEASE)
            .await
            .unwrap();
        let Begun::Leased(lease) = begun else {
            panic!("a new key is leased: {begun:?}");
        };
        behind_clock.advance(LEASE + Duration::from_secs(5));
        let fenced = behind
            .complete(&lease, oncebox_core::Response::completed("paid"))
            .await;
        assert_eq!(fenced, Err(oncebox_core::LeaseError::Fenced));
    });
}

/// A node whose path to the server is slow one way (the server's replies held 2.2 s, as under
/// load on a failing link): a reading's midpoint put its clock 1.1 s ahead of the server's,
/// past the tolerance, and its leases were written that much early, so another node took its
/// delivery over while it still held it. A reading whose round trip is that long is left out:
/// its leases stay judged as they were (here, rightly, on the same clock as the server's).
#[test]
fn a_reading_over_a_path_slow_one_way_moves_no_lease() {
    run(async {
        let Some(url) = harness::url() else {
            return;
        };
        let schema = harness::schema();
        let (direct, clock) = node(&schema, 0).await;
        let server = tokio::net::lookup_host(crate::proxy::server(&url))
            .await
            .expect("the server's address")
            .next()
            .expect("an address");
        let proxy = Proxy::start(server).await;
        let via = crate::proxy::via(&url, &proxy.addr().to_string());
        let options = oncebox_postgres::Options::new(oncebox_testkit::proxy::plaintext(&via))
            .schema(&schema)
            .clock(Arc::new(clock.clone()))
            .deadline(Duration::from_secs(30))
            .lost_after(Duration::from_secs(60))
            .max_connections(2);
        let slow = Inbox::open(options).await.expect("open through the proxy");
        let out = slow.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        // Each purge measures the clocks again, here over the slow path.
        proxy.set(Mode::DelayReplies(Duration::from_millis(2_200)));
        slow.purge(clock.now(), &Retention::default())
            .await
            .expect("purged");
        assert!(Stats::get(&proxy.stats.held) > 0, "the replies were held");
        proxy.set(Mode::Pass);
        let held = slow.claim(clock.now(), 10, LEASE, &[]).await.unwrap();
        assert_eq!(held.len(), 1);
        // Half a second before the lease's end, no other node takes it over.
        let taken = direct
            .claim(
                clock.now().plus(LEASE - Duration::from_millis(500)),
                10,
                LEASE,
                &[],
            )
            .await
            .unwrap();
        assert!(taken.is_empty(), "taken over early: {taken:?}");
    });
}

/// A node measured a minute off, then set right by NTP (its wall clock stepped, its monotonic
/// clock not): leases go by the server's clock still. Moved by the offset measured before the
/// step, its leases were a minute off the other way until it measured again: one set right from
/// ahead wrote leases already ended, which another node took over while it sent; one set right
/// from behind took over another node's live lease.
#[test]
fn a_node_set_right_after_measuring_itself_off_moves_no_lease_by_the_old_offset() {
    run(async {
        if harness::url().is_none() {
            return;
        }
        let schema = harness::schema();
        let (right, right_clock) = node(&schema, 0).await;
        let (was_ahead, ahead_clock) = node(&schema, off_ms()).await;
        let (was_behind, behind_clock) = node(&schema, -off_ms()).await;
        for clock in [&ahead_clock, &behind_clock] {
            clock.set(SystemClock.now());
        }
        // Set right from ahead: the lease it writes still has its minute.
        let out = was_ahead.ingest(routed("evt-1", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let held = was_ahead
            .claim(ahead_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert_eq!(held.len(), 1);
        let taken = right
            .claim(right_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert!(taken.is_empty(), "its lease was written ended: {taken:?}");
        // Its holder's outcome is recorded, not fenced.
        let attempt = AttemptRecord {
            started_at: ahead_clock.now(),
            duration: Duration::from_millis(5),
            status: Some(200),
            error: None,
        };
        DeliveryStore::record(
            &was_ahead,
            &held[0],
            attempt,
            Verdict::Delivered,
            ahead_clock.now(),
        )
        .await
        .expect("recorded by its holder");
        // Set right from behind: another node's live lease is not taken over, nor settled.
        let out = right.ingest(routed("evt-2", &["hooks"])).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let live = right
            .claim(right_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert_eq!(live.len(), 1);
        let taken = was_behind
            .claim(behind_clock.now(), 10, LEASE, &[])
            .await
            .unwrap();
        assert!(taken.is_empty(), "a live lease taken over: {taken:?}");
        let resolved = DeliveryStore::resolve(
            &was_behind,
            live[0].id,
            Resolve::Dead,
            "",
            behind_clock.now(),
        )
        .await
        .unwrap();
        assert!(
            !resolved,
            "a delivery settled while its relay still holds it"
        );
    });
}
