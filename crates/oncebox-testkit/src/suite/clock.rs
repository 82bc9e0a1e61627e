//! Conformance tests of retention in time: a forward jump of the wall clock purges no record
//! early, nor does one back and then set right, a jump back leaves no lease stuck, and purges
//! racing ingest keep the window.
//! `ManualClock::set` jumps the wall clock alone; `advance` is real time.

use std::time::Duration;

use oncebox_core::{Begun, Clock, LeaseError, ProcessError, Response, Retention};

use super::fresh;
use crate::{Backend, Script, event};

const TTL: Duration = Duration::from_secs(30);

pub async fn forward_clock_jump_purges_no_record_early<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    b.process(event("shop", "old", 1), Script::credit(1))
        .await
        .unwrap();
    // Nothing is due yet (the store anchored the boot when it opened).
    assert_eq!(b.purge(clock.now(), &retention).await, 0);
    clock.advance(retain / 2);
    b.process(event("shop", "mid", 1), Script::credit(1))
        .await
        .unwrap();
    // The wall clock jumps ten retentions ahead; no real time passes.
    clock.set(clock.now().plus(retain * 10));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        0,
        "a jump ages nothing"
    );
    assert!(
        b.process(event("shop", "old", 1), Script::credit(1))
            .await
            .unwrap()
            .is_duplicate(),
        "a retry inside the real retention is still a duplicate"
    );
    // Real time passes until `old` (only) is past its retention.
    clock.advance(retain / 2 + Duration::from_millis(1));
    assert_eq!(b.purge(clock.now(), &retention).await, 1);
    assert_eq!(b.observe().await.inbox_rows, 1, "`mid` stays");
}

/// A purge given a `now` ahead of the store's clock (milliseconds taken for microseconds, a
/// date in the future) purges as of the store's clock: nothing young goes, and records
/// finished later still age and go in their time.
pub async fn a_purge_time_ahead_of_the_clock_purges_nothing_early<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    b.process(event("shop", "young", 1), Script::credit(1))
        .await
        .unwrap();
    let ahead = oncebox_core::Timestamp(clock.now().millis().saturating_mul(1000));
    assert_eq!(b.purge(ahead, &retention).await, 0, "nothing young goes");
    assert_eq!(
        b.purge(oncebox_core::Timestamp(i64::MAX), &retention).await,
        0
    );
    b.process(event("shop", "later", 1), Script::credit(1))
        .await
        .unwrap();
    clock.advance(retain + Duration::from_millis(1));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        2,
        "both aged in their time, the later one too"
    );
}

/// The same jump, but the process restarts after it (a deploy, a crash, a cron `oncebox
/// purge`): the new process's first purge has no earlier purge of its own to measure the jump
/// against, only the store's record of the purges made on this boot of the machine.
pub async fn forward_clock_jump_then_restart_purges_no_record_early<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    b.process(event("shop", "old", 1), Script::credit(1))
        .await
        .unwrap();
    assert_eq!(b.purge(clock.now(), &retention).await, 0);
    clock.advance(retain / 2);
    clock.set(clock.now().plus(retain * 10));
    let b = b.reopen().await;
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        0,
        "a jump ages nothing, across a restart too"
    );
    assert!(
        b.process(event("shop", "old", 1), Script::credit(1))
            .await
            .unwrap()
            .is_duplicate(),
        "a retry inside the real retention is still a duplicate"
    );
    // Real time passes in a later process until `old` is past its retention.
    let b = b.reopen().await;
    clock.advance(retain / 2 + Duration::from_millis(1));
    assert_eq!(b.purge(clock.now(), &retention).await, 1);
}

/// A clock behind when the boot was anchored (the store's first open on that boot) holds
/// every later purge on that boot back by as much, in this process too. Deleting the boot's
/// anchor, as the purge-lag warning advises, releases them: the next purge anchors at the
/// clock, in the same process.
pub async fn a_deleted_boot_anchor_lets_purges_follow_the_clock_again<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    let right = clock.now();
    b.process(event("shop", "old", 1), Script::credit(1))
        .await
        .unwrap();
    // The store opens again on a clock four weeks behind, its boot's anchor gone: the open
    // anchors the boot there.
    clock.set(right.minus(retain * 4));
    b.forget_purge_anchors().await;
    let b = b.reopen().await;
    assert_eq!(b.purge(clock.now(), &retention).await, 0);
    // The clock is set right; real time passes until `old` is past its retention.
    clock.advance(retain + Duration::from_millis(1));
    clock.set(right.plus(retain + Duration::from_millis(1)));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        0,
        "held behind by the boot's anchor"
    );
    b.forget_purge_anchors().await;
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        1,
        "the anchor deleted, the purge follows the clock"
    );
}

/// The store opens on a clock ten days behind (no battery-backed clock, or one restored from
/// the last shutdown) with no anchor for the boot, takes events, and then the clock is set
/// right before any purge. The open anchored the boot, so those events are dated as late as
/// real time allows and age by the real time that passes: a sender's retry days later is
/// still a duplicate. Anchored only at the first purge, the boot took the right time there,
/// and that purge deleted the events minutes after they were accepted.
pub async fn a_clock_behind_at_open_then_set_right_makes_no_record_old<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    let right = clock.now();
    clock.set(right.minus(Duration::from_secs(10 * 24 * 3600)));
    b.forget_purge_anchors().await;
    let b = b.reopen().await;
    b.process(event("shop", "early", 1), Script::credit(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(60));
    clock.set(right.plus(Duration::from_secs(60)));
    assert_eq!(b.purge(clock.now(), &retention).await, 0, "a minute old");
    clock.advance(Duration::from_secs(3 * 24 * 3600));
    assert_eq!(b.purge(clock.now(), &retention).await, 0, "three days old");
    let retry = b
        .process(event("shop", "early", 1), Script::credit(1))
        .await;
    assert!(retry.unwrap().is_duplicate(), "the retry is remembered");
    // It goes once it is older than the retention in real time, not a millisecond before.
    clock.advance(retain - Duration::from_secs(3 * 24 * 3600 + 60));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        0,
        "the retention old"
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(b.purge(clock.now(), &retention).await, 1);
}

/// Two thousand records received while the wall clock stood a year ahead (set back since; on
/// PostgreSQL, a node whose clock runs ahead): a whole chunk of them reads as younger than the
/// retention, and the purge stopped there, so a record past its retention with a later id was
/// never reached until the clock caught up. They say nothing of the records after them.
pub async fn records_dated_ahead_of_the_clock_hold_no_purge_back<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    let start = clock.now();
    clock.set(start.plus(Duration::from_secs(365 * 24 * 3600)));
    // Two of either store's chunks (1 000 records each, `purge.rs`, `PURGE_CHUNK`): a whole
    // chunk of them, whatever the first chunk's start.
    // Fifty at a time: all at once, on PostgreSQL, a loaded machine left some waiting for
    // a pooled connection past the deadline.
    let ids: Vec<String> = (0..2000).map(|i| format!("ahead-{i}")).collect();
    for group in ids.chunks(50) {
        let ahead = group
            .iter()
            .map(|id| b.process(event("shop", id, 1), Script::credit(1)));
        for done in futures::future::join_all(ahead).await {
            done.unwrap();
        }
    }
    clock.set(start);
    b.process(event("shop", "late", 1), Script::credit(1))
        .await
        .unwrap();
    clock.advance(retain + Duration::from_millis(1));
    assert_eq!(
        b.purge(clock.now(), &retention).await,
        1,
        "the record past its retention, after a chunk dated ahead"
    );
    assert_eq!(b.observe().await.inbox_rows, 2000);
}

/// The wall clock steps back a year (a reset clock, a bad time source) while events arrive,
/// and is set right a minute later. The events of that minute are dated no earlier than the
/// boot's purge anchor says real time was: they age by the real time that passes, not by the
/// year, and a sender's retry days later is still a duplicate. Dated by the clock, the next
/// purge deleted them, and the retry was applied again.
pub async fn a_clock_stepped_back_then_set_right_makes_no_record_old<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let retain = Duration::from_secs(7 * 24 * 3600);
    let retention = Retention::new(retain);
    // The store's open anchored this boot at the right time.
    assert_eq!(b.purge(clock.now(), &retention).await, 0);
    let right = clock.now();
    clock.set(right.minus(Duration::from_secs(365 * 24 * 3600)));
    b.process(event("shop", "back", 1), Script::credit(1))
        .await
        .unwrap();
    let Ok(Begun::Leased(lease)) = b.begin(event("mail", "back", 1), TTL).await else {
        panic!("expected a lease");
    };
    b.complete(&lease, Response::completed("sent"))
        .await
        .unwrap();
    let Ok(Begun::Leased(parked)) = b.begin(event("mail", "parked", 1), TTL).await else {
        panic!("expected a lease");
    };
    b.uncertain(&parked).await.unwrap();
    assert!(
        b.resolve(&parked.key, Some(Response::completed("sent")))
            .await
    );
    clock.advance(Duration::from_secs(60));
    clock.set(right.plus(Duration::from_secs(60)));
    clock.advance(Duration::from_secs(3 * 24 * 3600));
    assert_eq!(b.purge(clock.now(), &retention).await, 0, "three days old");
    for (source, id) in [("shop", "back"), ("mail", "back"), ("mail", "parked")] {
        let retry = b.process(event(source, id, 1), Script::credit(1)).await;
        assert!(retry.unwrap().is_duplicate(), "{source}:{id} is remembered");
    }
    // Past the retention in real time, they go.
    clock.advance(retain);
    assert_eq!(b.purge(clock.now(), &retention).await, 3);
}

pub async fn backward_clock_jump_leaves_no_lease_stuck<B: Backend>() {
    let (b, clock) = fresh::<B>().await;
    let e = event("mail", "jump-1", 0);
    let Ok(Begun::Leased(first)) = b.begin(e.clone(), TTL).await else {
        panic!("expected a lease");
    };
    // The wall clock jumps an hour back. The lease is not taken over at once (its holder may
    // still be running the outside effect): the first contender re-anchors it to one TTL from
    // the new now, instead of the hour the jump would otherwise hold it.
    clock.set(clock.now().minus(Duration::from_secs(3600)));
    match b.begin(e.clone(), TTL).await {
        Err(ProcessError::InProgress { retry_after }) => assert!(retry_after <= TTL),
        other => panic!("a lease just begun is held after the jump: {other:?}"),
    }
    clock.advance(TTL);
    let Ok(Begun::Leased(second)) = b.begin(e.clone(), TTL).await else {
        panic!("a lease begun before the jump is taken over one TTL after it was seen");
    };
    assert!(second.token > first.token);
    assert_eq!(
        b.complete(&first, Response::completed("late")).await,
        Err(LeaseError::Fenced)
    );
    // The new lease lives its TTL on the new timeline, then expires as usual.
    assert!(matches!(
        b.begin(e.clone(), TTL).await,
        Err(ProcessError::InProgress { .. })
    ));
    clock.advance(TTL);
    let Ok(Begun::Leased(third)) = b.begin(e, TTL).await else {
        panic!("expired lease taken over");
    };
    b.complete(&third, Response::completed("sent"))
        .await
        .unwrap();
}

/// Retention running beside ingest: events arrive over two hours (five a minute) while purges
/// run back to back on the same store. Purges race every commit, yet none deletes a record
/// inside the window: at the end every event of the last hour still answers as a duplicate,
/// and every older one is gone.
pub async fn purge_beside_ingest_never_deletes_inside_the_window<B: Backend>() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (b, clock) = fresh::<B>().await;
    let retention = Retention::new(Duration::from_secs(3600));
    let minute = Duration::from_secs(60);
    let stop = Arc::new(AtomicBool::new(false));
    let purger = {
        let (b, clock, retention, stop) =
            (b.clone(), clock.clone(), retention.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut passes, mut deleted) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                deleted += b.purge(clock.now(), &retention).await;
                passes += 1;
                tokio::task::yield_now().await;
            }
            (passes, deleted)
        })
    };
    for m in 0..120 {
        for i in 0..5 {
            let out = b
                .process(event("shop", &format!("m{m}-{i}"), 1), Script::credit(1))
                .await;
            assert!(
                matches!(out, Ok(oncebox_core::Processed::Applied(_))),
                "m{m}-{i}: {out:?}"
            );
        }
        clock.advance(minute);
    }
    stop.store(true, Ordering::Relaxed);
    let (passes, deleted) = purger.await.expect("purger");
    // The race really ran: purges between the commits, deleting as the window moved.
    assert!(
        passes > 1 && deleted > 0,
        "{passes} passes, {deleted} deleted"
    );
    b.purge(clock.now(), &retention).await;
    // Now is minute 120: minute 61 on is inside the hour (minute 60 is on its edge).
    let rows = b.observe().await.inbox_rows;
    assert!((59 * 5..=60 * 5).contains(&rows), "{rows} records left");
    for m in 61..120 {
        for i in 0..5 {
            let again = b
                .process(event("shop", &format!("m{m}-{i}"), 1), Script::credit(1))
                .await;
            assert!(
                again
                    .as_ref()
                    .is_ok_and(oncebox_core::Processed::is_duplicate),
                "m{m}-{i}, inside the window, was purged: {again:?}"
            );
        }
    }
    for m in 0..60 {
        let again = b
            .process(event("shop", &format!("m{m}-0"), 1), Script::credit(1))
            .await;
        assert!(
            matches!(again, Ok(oncebox_core::Processed::Applied(_))),
            "m{m}-0, past the window, was kept: {again:?}"
        );
    }
}
