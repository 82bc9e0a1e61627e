//! The cap on request bodies one client has arriving at once, through a real listener: a client
//! trickling bodies on many connections cannot hold every permit of the concurrency limit.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use axum::http::StatusCode;
use oncebox_gateway::policy::Limits;
use oncebox_testkit::run;

use crate::wire::{BOUND, Raw, Reply, head, in_flight, in_flight_on, served};

/// The trickling client; the test's other requests come from 127.0.0.1.
const SLOW: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn event(id: &str) -> String {
    format!(r#"{{"id":"{id}","amount":1}}"#)
}

#[test]
fn one_client_trickling_bodies_cannot_hold_every_permit() {
    run(async {
        let limits = Limits {
            concurrency: 4,
            bodies_per_peer: 2,
            body_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(3),
            ..Limits::default()
        };
        let s = served(limits).await;
        // Two bodies of the slow client being waited for (`in_flight` returns once the server
        // has polled each and found nothing there): each holds a permit.
        let (a, b) = (event("slow-a"), event("slow-b"));
        let mut held_a = in_flight_on(Raw::connect_from(s.addr, SLOW).await, &a, 5).await;
        let mut held_b = in_flight_on(Raw::connect_from(s.addr, SLOW).await, &b, 5).await;

        // A third of its bodies would wait too: refused at once, its connection closed.
        let c = event("slow-c");
        let mut third = Raw::connect_from(s.addr, SLOW).await;
        third
            .send(format!("{}{}", head("open", c.len(), ""), &c[..5]).as_bytes())
            .await;
        let refused = third.reply().await.answer();
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{refused:?}"
        );
        assert_eq!(refused.slug(), "unavailable");
        assert_eq!(refused.headers["retry-after"], "3");
        assert_eq!(refused.headers["connection"], "close");
        assert!(matches!(third.reply().await, Reply::Closed(_)));
        // So is a form for the dashboard: every body is counted the same way.
        let mut form = Raw::connect_from(s.addr, SLOW).await;
        form.send(
            b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
              Content-Length: 40\r\n\r\ntoken=",
        )
        .await;
        let refused = form.reply().await.answer();
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{refused:?}"
        );

        // The same client's request that arrives whole is never waited for, so never counted.
        let whole = event("slow-whole");
        let mut raw = Raw::connect_from(s.addr, SLOW).await;
        raw.send(format!("{}{whole}", head("open", whole.len(), "")).as_bytes())
            .await;
        let a_whole = raw.reply().await.answer();
        assert_eq!(a_whole.status, StatusCode::ACCEPTED, "{a_whole:?}");

        // The other two permits are left for everyone else, slow bodies or not.
        let (d, e) = (event("other-d"), event("other-e"));
        let mut other_d = in_flight(s.addr, &d, 5).await;
        let mut other_e = in_flight(s.addr, &e, 5).await;
        for (raw, body) in [(&mut other_d, &d), (&mut other_e, &e), (&mut held_a, &a)] {
            raw.send(&body.as_bytes()[5..]).await;
            let answer = raw.reply().await.answer();
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
        }

        // One of the slow client's bodies has arrived: its place serves its next one.
        let f = event("slow-f");
        let mut next = in_flight_on(Raw::connect_from(s.addr, SLOW).await, &f, 5).await;
        for (raw, body) in [(&mut held_b, &b), (&mut next, &f)] {
            raw.send(&body.as_bytes()[5..]).await;
            let answer = raw.reply().await.answer();
            assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
        }
        // Stored: the whole one, the two others' and three of the slow client's; not the
        // refused one.
        assert_eq!(s.gw.rows(), 6);
    });
}

/// A body that will not arrive gives its place back: cut off at the body timeout (its place is
/// free by the time the 408 is read), or hung up on by its client (noticed when the server
/// reads the connection's end, so waited for here, within the tests' bound).
#[test]
fn a_slow_body_cut_off_or_hung_up_gives_its_place_back() {
    run(async {
        let limits = Limits {
            bodies_per_peer: 1,
            body_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let s = served(limits).await;
        let a = event("slow-a");
        let mut held = in_flight_on(Raw::connect_from(s.addr, SLOW).await, &a, 5).await;
        let timed_out = held.reply().await.answer();
        assert_eq!(
            timed_out.status,
            StatusCode::REQUEST_TIMEOUT,
            "{timed_out:?}"
        );

        let b = event("slow-b");
        let held = in_flight_on(Raw::connect_from(s.addr, SLOW).await, &b, 5).await;
        drop(held);
        let c = event("slow-c");
        let started = std::time::Instant::now();
        let mut next = loop {
            let mut raw = Raw::connect_from(s.addr, SLOW).await;
            raw.send(head("open", c.len(), "Expect: 100-continue\r\n").as_bytes())
                .await;
            let reply = raw.reply().await.answer();
            if reply.status == StatusCode::CONTINUE {
                break raw;
            }
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
            assert!(
                started.elapsed() < BOUND,
                "the hung-up body's place never came back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        next.send(c.as_bytes()).await;
        let accepted = next.reply().await.answer();
        assert_eq!(accepted.status, StatusCode::ACCEPTED, "{accepted:?}");
        assert_eq!(s.gw.rows(), 1);
    });
}
