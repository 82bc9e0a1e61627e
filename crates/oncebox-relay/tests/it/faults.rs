//! The outcome-unknown cases: the receiver applied the request and the reply was lost, and a
//! relay that lost its lease after the receiver's 2xx (re-sent on an idempotent route, parked
//! uncertain on a plain one).

use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::{AttemptRecord, DeliveryStore, STATUS_RECHECK};
use oncebox_core::{Clock, LeaseError};
use oncebox_testkit::run;

use crate::{World, receiver, route};

#[test]
fn reply_dropped_on_an_idempotent_route_is_retried_with_the_same_key_and_applied_once() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        w.accept("evt_d", &["hooks"]).await;
        let lossy = w.relay(vec![route("hooks", proxy, true)]);
        let out = lossy.run_once().await.unwrap();
        assert_eq!(out.retrying, 1, "{out:?}");
        assert_eq!(
            *dropped.lock().unwrap(),
            1,
            "the reply was really dropped after the receiver answered"
        );
        assert_eq!(rx.hits_of("shop:evt_d"), 1, "the receiver applied it");
        // The network heals: the next attempt reaches the receiver directly.
        w.clock.advance(Duration::from_secs(3600));
        let healed = w.relay(vec![route("hooks", addr, true)]);
        assert_eq!(healed.run_once().await.unwrap().delivered, 1);
        // Hits are counted per key: both carried it, which a receiver honouring it applies once.
        assert_eq!(rx.hits_of("shop:evt_d"), 2, "retried with the same key");
        assert_eq!(w.delivery("evt_d").await.state, DeliveryState::Delivered);
    });
}

#[test]
fn reply_dropped_on_a_plain_route_is_uncertain_and_reconciled_through_the_status_url() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        w.accept("evt_u", &["hooks"]).await;
        let mut plain = route("hooks", proxy, false);
        plain.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        let out = relay.run_once().await.unwrap();
        assert_eq!(*dropped.lock().unwrap(), 1);
        // Not asked at once: a receiver that timed out may still be at work on it.
        assert_eq!((out.uncertain, out.reconciled), (1, 0), "{out:?}");
        w.clock.advance(STATUS_RECHECK.0);
        // Then the status URL says the receiver applied the key.
        assert_eq!(relay.run_once().await.unwrap().reconciled, 1);
        let d = w.delivery("evt_u").await;
        assert_eq!(d.state, DeliveryState::Delivered);
        assert_eq!(d.note.as_deref(), Some("status_url: applied"));
        assert_eq!(rx.hits_of("shop:evt_u"), 1, "never sent twice");
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    });
}

/// Uncertain rows an edit by hand left unreadable (a key that no longer parses) are skipped by
/// the listing, but still took their places in the page reconciliation read: 16 of them, due
/// and never rescheduled, hid every later uncertain delivery of the route for good. Now a pass
/// reads on past them, and the next goes on where it stopped: 200 of them, more than a pass
/// reads, hold the later one back a pass or two, not for good.
#[test]
fn unreadable_uncertain_rows_do_not_hide_a_later_one_from_reconciliation() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        for i in 0..200 {
            w.accept(&format!("evt_bad{i}"), &["hooks"]).await;
        }
        let edited = rusqlite::Connection::open(w.path())
            .unwrap()
            .execute(
                "UPDATE oncebox_outbox SET state = 'uncertain', next_attempt_at = 0,
                   source = 'not a source'",
                [],
            )
            .unwrap();
        assert_eq!(edited, 200);
        let (proxy, dropped) = receiver::dropping_proxy(addr).await;
        w.accept("evt_u", &["hooks"]).await;
        let mut plain = route("hooks", proxy, false);
        plain.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = w.relay(vec![plain]);
        assert_eq!(relay.run_once().await.unwrap().uncertain, 1);
        assert_eq!(*dropped.lock().unwrap(), 1);
        w.clock.advance(STATUS_RECHECK.0);
        let mut passes = 1;
        while relay.run_once().await.unwrap().reconciled == 0 {
            passes += 1;
            assert!(passes <= 3, "still not asked after {passes} passes");
        }
        assert_eq!(w.delivery("evt_u").await.state, DeliveryState::Delivered);
        assert_eq!(rx.hits_of("shop:evt_u"), 1);
    });
}

/// Routes are reconciled side by side: one whose status URL hangs until its timeout holds back
/// no other route's questions. One after another (in name order), the later route waited the
/// whole timeout.
#[test]
fn a_status_url_that_hangs_holds_back_no_other_routes_reconciliation() {
    run(async {
        let w = World::new();
        let (_rx, addr) = receiver::start().await;
        let (silent, asked) = receiver::silent().await;
        w.accept("evt_a", &["a-stuck"]).await;
        w.accept("evt_b", &["b-hooks"]).await;
        let parked = rusqlite::Connection::open(w.path())
            .unwrap()
            .execute(
                "UPDATE oncebox_outbox SET state = 'uncertain', next_attempt_at = 0",
                [],
            )
            .unwrap();
        assert_eq!(parked, 2);
        let mut stuck = route("a-stuck", addr, false);
        stuck.status_url = Some(format!("http://{silent}/status/{{key}}"));
        stuck.timeout = Duration::from_secs(60);
        let mut hooks = route("b-hooks", addr, false);
        hooks.status_url = Some(format!("http://{addr}/status/{{key}}"));
        let relay = std::sync::Arc::new(w.relay(vec![stuck, hooks]));
        let pass = tokio::spawn({
            let relay = relay.clone();
            async move { relay.reconcile().await }
        });
        // The receiver never got evt_b: not applied, so it is due again, no longer uncertain;
        // meanwhile a-stuck's question reached its silent status URL.
        let asked = || asked.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..2_000 {
            if w.delivery("evt_b").await.state != DeliveryState::Uncertain && asked() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_ne!(w.delivery("evt_b").await.state, DeliveryState::Uncertain);
        assert_eq!(asked(), 1, "a-stuck was asked");
        assert!(!pass.is_finished(), "its question still hangs");
        assert_eq!(w.delivery("evt_a").await.state, DeliveryState::Uncertain);
        pass.abort();
    });
}

#[test]
fn uncertain_without_a_status_url_waits_for_an_operator() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        let (proxy, _) = receiver::dropping_proxy(addr).await;
        w.accept("evt_o", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", proxy, false)]);
        relay.run_once().await.unwrap();
        w.clock.advance(Duration::from_secs(24 * 3600));
        assert_eq!(
            relay.run_once().await.unwrap().claimed,
            0,
            "parked, not retried"
        );
        let d = w.delivery("evt_o").await;
        assert_eq!(d.state, DeliveryState::Uncertain);
        assert!(
            DeliveryStore::resolve(
                &w.inbox,
                d.id,
                oncebox_core::relay_store::Resolve::Delivered,
                "checked by hand",
                w.clock.now()
            )
            .await
            .unwrap()
        );
        assert_eq!(w.delivery("evt_o").await.state, DeliveryState::Delivered);
        assert_eq!(rx.hits_of("shop:evt_o"), 1);
    });
}

#[test]
fn relay_that_lost_its_lease_after_the_receivers_2xx_cannot_record_and_the_key_is_resent() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_k", &["hooks"]).await;
        // Relay A claims and sends; the receiver answers 2xx; A stalls (or dies) before
        // recording, past its lease.
        let claimed = w
            .inbox
            .claim(
                w.clock.now(),
                10,
                Duration::from_secs(60),
                &["hooks".to_owned()],
            )
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let a = &claimed[0];
        let sent = reqwest::Client::new()
            .post(format!("http://{addr}/hook"))
            .header("idempotency-key", a.idempotency_key.as_str())
            .body(a.payload.clone())
            .send()
            .await
            .unwrap();
        assert!(sent.status().is_success());
        w.clock.advance(Duration::from_secs(61));
        // Relay B takes the expired claim over. A's attempt counts, as one sent without an
        // answer: B records it and sends again with the same key after the backoff, as the
        // second attempt (a relay dying on every try runs into the route's caps).
        let b = w.relay(vec![route("hooks", addr, true)]);
        let out = b.run_once().await.unwrap();
        assert_eq!((out.claimed, out.retrying), (1, 1), "{out:?}");
        assert_eq!(rx.hits_of("shop:evt_k"), 1, "not yet sent again");
        let lost = w.delivery("evt_k").await;
        assert_eq!((lost.state, lost.attempts), (DeliveryState::Retrying, 1));
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(b.run_once().await.unwrap().delivered, 1);
        // Hits are counted per key: both carried it, which a receiver honouring it applies once.
        assert_eq!(rx.hits_of("shop:evt_k"), 2);
        let resent = rx.requests().pop().unwrap();
        assert_eq!(resent.headers["oncebox-attempt"], "2", "{resent:?}");
        // A wakes up: its outcome is refused and nothing is overwritten.
        let late = AttemptRecord {
            started_at: w.clock.now(),
            duration: Duration::ZERO,
            status: Some(200),
            error: None,
        };
        let refused = DeliveryStore::record(
            &w.inbox,
            a,
            late,
            Verdict::Dead("late".into()),
            w.clock.now(),
        )
        .await;
        assert_eq!(refused, Err(LeaseError::Fenced));
        assert_eq!(w.delivery("evt_k").await.state, DeliveryState::Delivered);
    });
}

/// The same stall on a route that does not honour the key: relay B cannot know whether A's
/// request went out, and sending again could apply it twice. B sends nothing and parks the
/// delivery uncertain, its reason recorded as an attempt, for the status URL or an operator.
#[test]
fn a_plain_routes_delivery_taken_over_from_a_stalled_relay_is_uncertain_not_sent_again() {
    run(async {
        let w = World::new();
        let (rx, addr) = receiver::start().await;
        w.accept("evt_p", &["hooks"]).await;
        let claimed = w
            .inbox
            .claim(
                w.clock.now(),
                10,
                Duration::from_secs(60),
                &["hooks".to_owned()],
            )
            .await
            .unwrap();
        let a = &claimed[0];
        let sent = reqwest::Client::new()
            .post(format!("http://{addr}/hook"))
            .header("idempotency-key", a.idempotency_key.as_str())
            .body(a.payload.clone())
            .send()
            .await
            .unwrap();
        assert!(sent.status().is_success());
        w.clock.advance(Duration::from_secs(61));
        let b = w.relay(vec![route("hooks", addr, false)]);
        let out = b.run_once().await.unwrap();
        assert_eq!(
            (out.claimed, out.uncertain, out.delivered),
            (1, 1, 0),
            "{out:?}"
        );
        assert_eq!(rx.hits_of("shop:evt_p"), 1, "not sent again");
        let d = w.delivery("evt_p").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Uncertain, 1));
        let error = d.last_error.unwrap_or_default();
        assert!(error.contains("stopped mid-attempt"), "{error}");
        // Parked, it is not claimed again however long the relay runs.
        w.clock.advance(Duration::from_secs(3600));
        assert_eq!(b.run_once().await.unwrap().claimed, 0);
        assert_eq!(rx.hits_of("shop:evt_p"), 1);
    });
}

/// Servers close a keep-alive connection idle for a few seconds (gunicorn 2 s, Node and uvicorn
/// 5 s). A delivery written on such a connection as the server closes it gets no answer: on a
/// plain route that is a false *uncertain*, for an event the receiver never saw. The relay
/// gives idle connections up first.
#[test]
fn a_connection_idle_past_the_receivers_keep_alive_is_not_reused() {
    run(async {
        let w = World::new();
        let keep_alive = Duration::from_secs(2);
        let (addr, dropped) = receiver::short_keep_alive(keep_alive).await;
        w.accept("evt_k1", &["hooks"]).await;
        let relay = w.relay(vec![route("hooks", addr, false)]);
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        // The fault is real: a client keeping its connection past the receiver's keep-alive
        // loses its next request.
        let other = reqwest::Client::new();
        let url = format!("http://{addr}/hook");
        assert!(other.post(&url).send().await.is_ok());
        // Time passing is the scenario itself: both connections sit idle past the keep-alive.
        tokio::time::sleep(keep_alive + Duration::from_millis(500)).await;
        let lost = other.post(&url).send().await.unwrap_err();
        assert!(!lost.is_connect(), "written, then unanswered: {lost:?}");
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The relay's own next delivery goes on a new connection and is answered.
        w.accept("evt_k2", &["hooks"]).await;
        let out = relay.run_once().await.unwrap();
        assert_eq!((out.delivered, out.uncertain), (1, 0), "{out:?}");
        assert_eq!(w.delivery("evt_k2").await.state, DeliveryState::Delivered);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
    });
}
