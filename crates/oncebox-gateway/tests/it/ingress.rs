//! Every row of DESIGN §4 through the real router: new, duplicate, stale, conflict, in
//! progress, invalid, unavailable — and the fingerprint rules behind them (the event id's rules
//! are in keys.rs, the ordering guard's in ordering.rs).

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use oncebox_core::{Event, Key};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_testkit::run;

use crate::support::{TestGateway, config, post};

#[test]
fn new_event_is_202_with_the_documented_body() {
    run(async {
        let gw = TestGateway::new();
        let a = gw
            .send(post("open", &[], r#"{"id":"evt_1","amount":5}"#))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
        assert!(!a.replayed());
        let body = a.json();
        assert_eq!(body["status"], "accepted");
        assert_eq!(body["source"], "open");
        assert_eq!(body["event_id"], "evt_1");
        assert_eq!(body["received_at"], "2026-01-01T00:00:00.000Z");
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn duplicate_replays_status_and_body_with_the_replayed_header() {
    run(async {
        let gw = TestGateway::new();
        let first = gw
            .send(post("open", &[], r#"{"id":"evt_1","amount":5}"#))
            .await;
        gw.clock.advance(Duration::from_secs(60));
        // Same JSON value, other spelling: still the same event.
        let again = gw
            .send(post("open", &[], "{ \"amount\": 5.0, \"id\": \"evt_1\" }"))
            .await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body, "the first answer, byte for byte");
        assert!(again.replayed());
        assert_eq!(gw.rows(), 1);
    });
}

#[test]
fn same_id_with_another_payload_is_422_key_reused() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post("open", &[], r#"{"id":"evt_1","amount":5}"#))
            .await;
        let a = gw
            .send(post("open", &[], r#"{"id":"evt_1","amount":6}"#))
            .await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "key-reused")
        );
        let (conflicts, stored, offered): (i64, Vec<u8>, Vec<u8>) = gw
            .inbox
            .read_blocking(|c| {
                c.query_row(
                    "SELECT count(*), max(stored_fingerprint), max(offered_fingerprint) \
                     FROM oncebox_conflicts",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
            })
            .unwrap();
        assert_eq!((gw.rows(), conflicts), (1, 1));
        // The sender learns its own payload's fingerprint, not the stored one's.
        let (stored, offered) = (hex::encode(stored), hex::encode(offered));
        let body = String::from_utf8_lossy(&a.body);
        assert!(body.contains(&offered), "{body}");
        assert!(!body.contains(&stored), "{body}");
    });
}

#[test]
fn fields_fingerprint_ignores_other_fields() {
    run(async {
        let gw = TestGateway::new();
        gw.send(post("fields", &[], r#"{"id":"f1","amount":5,"note":"a"}"#))
            .await;
        let same = gw
            .send(post("fields", &[], r#"{"id":"f1","amount":5,"note":"b"}"#))
            .await;
        assert!(same.replayed(), "{same:?}");
        let other = gw
            .send(post("fields", &[], r#"{"id":"f1","amount":7}"#))
            .await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
        let absent = gw.send(post("fields", &[], r#"{"id":"f1"}"#)).await;
        assert_eq!(
            absent.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "absent differs from present"
        );
    });
}

#[test]
fn key_leased_by_another_worker_is_409_in_progress_with_retry_after() {
    run(async {
        let gw = TestGateway::new();
        let body = r#"{"id":"evt_l"}"#;
        let event = Event::json(Key::parse("open", "evt_l").unwrap(), body).unwrap();
        gw.inbox
            .begin(event, Duration::from_secs(30))
            .await
            .unwrap();
        let a = gw.send(post("open", &[], body)).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::CONFLICT, "in-progress")
        );
        assert_eq!(a.headers["retry-after"], "30");
    });
}

/// Source, headers, body, expected status and problem slug.
type Case = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Body,
    StatusCode,
    &'static str,
);

#[test]
fn invalid_events_are_400_or_413_and_write_nothing() {
    run(async {
        let gw = TestGateway::new();
        let cases: Vec<Case> = vec![
            (
                "open",
                vec![],
                r#"{"amount":1}"#.into(),
                StatusCode::BAD_REQUEST,
                "event-id-missing",
            ),
            (
                "open",
                vec![],
                r#"{"id":""}"#.into(),
                StatusCode::BAD_REQUEST,
                "event-id-invalid",
            ),
            (
                "open",
                vec![],
                r#"{"id":"a\u0000b"}"#.into(),
                StatusCode::BAD_REQUEST,
                "event-id-invalid",
            ),
            (
                "open",
                vec![],
                format!(r#"{{"id":"{}"}}"#, "x".repeat(256)).into(),
                StatusCode::BAD_REQUEST,
                "event-id-invalid",
            ),
            (
                "open",
                vec![],
                r#"{"id":true}"#.into(),
                StatusCode::BAD_REQUEST,
                "event-id-invalid",
            ),
            (
                "open",
                vec![],
                r#"{"id":"a","id":"b"}"#.into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
            (
                "open",
                vec![],
                r#"{"id":"a""#.into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
            (
                "open",
                vec![],
                vec![b'{', 0xff, b'}'].into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
            (
                "open",
                vec![],
                "[".repeat(100_000).into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
            (
                "open",
                vec![],
                r#"{"id":"x","s":"\ud800"}"#.into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
            (
                "open",
                vec![("idempotency-key", "   ")],
                "{}".into(),
                StatusCode::BAD_REQUEST,
                "event-id-invalid",
            ),
            (
                "tiny",
                vec![],
                r#"{"id":"0123456789abcdef"}"#.into(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
            ),
            (
                "derived",
                vec![],
                r#"{"order_id":"o1"}"#.into(),
                StatusCode::BAD_REQUEST,
                "event-id-missing",
            ),
            (
                "derived",
                vec![],
                r#"{"order_id":"o1","type":"paid""#.into(),
                StatusCode::BAD_REQUEST,
                "invalid-json",
            ),
        ];
        for (source, headers, body, status, slug) in cases {
            let a = gw.send(post(source, &headers, body)).await;
            assert_eq!(
                (a.status, a.slug()),
                (status, slug.to_owned()),
                "{source} {headers:?}"
            );
        }
        assert_eq!(gw.rows(), 0);
    });
}

#[test]
fn locked_database_is_503_for_new_events_and_committed_ones_still_replay() {
    run(async {
        let gw = TestGateway::with(config(), |p| {
            oncebox_sqlite::Options::new(p).busy_timeout(Duration::from_millis(50))
        });
        gw.send(post("open", &[], r#"{"id":"evt_1"}"#)).await;
        let lock = Connection::open(&gw.path).unwrap();
        lock.execute_batch("BEGIN IMMEDIATE").unwrap();
        let a = gw.send(post("open", &[], r#"{"id":"evt_2"}"#)).await;
        assert_eq!(
            (a.status, a.slug().as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        );
        assert_eq!(a.headers["retry-after"], "2");
        assert!(!a.replayed());
        // The committed key is answered from its committed record even while writes are locked.
        assert!(
            gw.send(post("open", &[], r#"{"id":"evt_1"}"#))
                .await
                .replayed()
        );
        let readyz = gw
            .send(
                axum::http::Request::get("/readyz")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
        lock.execute_batch("ROLLBACK").unwrap();
        assert!(
            gw.send(post("open", &[], r#"{"id":"evt_1"}"#))
                .await
                .replayed()
        );
        let b = gw.send(post("open", &[], r#"{"id":"evt_2"}"#)).await;
        assert_eq!(
            b.status,
            StatusCode::ACCEPTED,
            "{}",
            String::from_utf8_lossy(&b.body)
        );
    });
}

#[test]
fn a_flood_of_one_committed_key_never_reaches_the_writer() {
    run(async {
        let gw = TestGateway::new();
        let body = r#"{"id":"hot","amount":5}"#;
        let first = gw.send(post("open", &[], body)).await;
        assert_eq!(first.status, StatusCode::ACCEPTED);
        let stats = gw.inbox.stats();
        let (commits, committed) = (stats.commits(), stats.committed_requests());
        let router = gw.router();
        let flood: Vec<_> = (0..500)
            .map(|_| {
                let router = router.clone();
                tokio::spawn(async move {
                    use tower::ServiceExt;
                    let res = router.oneshot(post("open", &[], body)).await.unwrap();
                    crate::support::Answer::from(res).await
                })
            })
            .collect();
        for t in flood {
            let a = t.await.unwrap();
            assert!(a.status == StatusCode::ACCEPTED && a.replayed(), "{a:?}");
        }
        // Every retry was answered from memory: no transaction, no write, no read.
        assert_eq!(stats.commits(), commits);
        assert_eq!(stats.committed_requests(), committed);
        assert_eq!(stats.answered_from_memory(), 500);
        assert_eq!(gw.rows(), 1);
    });
}
