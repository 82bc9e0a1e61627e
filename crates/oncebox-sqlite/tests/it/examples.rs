//! The examples' scenarios as tests: seed 003's ledger, seed 004's thank-you emails and the
//! guarded status transitions of seeds 000 and 002, each on its own SQLite file, every step
//! checked against exact values.

#[path = "../../examples/ledger.rs"]
mod ledger;
#[path = "../../examples/payment_status.rs"]
mod payment_status;
#[path = "../../examples/thank_you.rs"]
mod thank_you;

use oncebox_core::{ProcessError, Processed, Response};

/// Owned copies of string pairs, as the scenarios report them.
fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

fn balance(n: i64) -> Response {
    Response::completed(format!(r#"{{"balance":{n}}}"#))
}

/// The message of a handler failure, or a panic naming what came instead.
fn handler_failure(outcome: &Result<Processed, ProcessError>) -> String {
    match outcome {
        Err(ProcessError::Handler(e)) => e.to_string(),
        other => panic!("expected a handler failure, got {other:?}"),
    }
}

#[test]
fn ledger_scenario_matches_the_seed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = ledger::run(dir.path()).expect("ledger scenario");
    assert!(s.seed_holds(), "{s}");

    // 1–2: applied once; the duplicate replays the first response.
    assert_eq!(s.first, Processed::Applied(balance(500)));
    assert_eq!(s.repeat, Processed::Duplicate(balance(500)));

    // 3: the same key with another amount is a conflict and changes nothing.
    assert!(
        matches!(s.conflict, Err(ProcessError::Conflict { .. })),
        "{:?}",
        s.conflict
    );
    assert_eq!(s.balance_after_conflict, 500);

    // 4: a failure after the credit rolls back the credit and the key; the retry applies.
    assert_eq!(
        handler_failure(&s.failed),
        "simulated failure after the credit"
    );
    assert_eq!(s.balance_after_failure, 500);
    assert!(!s.evt2_recorded_after_failure);
    assert_eq!(s.retry, Processed::Applied(balance(1000)));

    // 5: 20 racing deliveries, one effect; every duplicate replays the one first response.
    assert_eq!(s.applied, vec![balance(1500)]);
    assert_eq!(s.duplicates, vec![balance(1500); ledger::DELIVERIES - 1]);

    // 6: the seed's final state.
    assert_eq!(s.balance, 1500);
    assert_eq!(s.inbox_rows, 3);
    assert_eq!(s.credit_rows, 3, "one credit row per key");

    // 7: exercises. The source is part of the key.
    assert_eq!(s.other_source, Processed::Applied(balance(2000)));
    assert_eq!(s.balance_with_other_source, 2000);
    // A missing account fails on the foreign key and leaves no inbox row.
    assert!(
        handler_failure(&s.missing_account).contains("FOREIGN KEY"),
        "{:?}",
        s.missing_account
    );
    assert_eq!(s.inbox_rows_after_missing_account, 4);
    // The stored first response is replayed, not recomputed from today's balance of 2000.
    assert_eq!(s.late_duplicate, Processed::Duplicate(balance(1500)));
}

/// Amounts the ledger must refuse: out of its range, beyond i64, not integers, not numbers.
/// Each is refused by the handler before any SQL, so nothing is credited and the key is not
/// recorded; the sender's corrected retry under the same key then applies once.
#[test]
fn bad_amounts_are_refused_with_no_partial_effect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inbox = ledger::open(dir.path()).expect("ledger");
    let bad = [
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
        "1000000001",
        "-5",
        "0",
        "-0",
        "1e309",
        "-1e309",
        "1.5",
        "0.1",
        "1e-3",
        r#""100""#,
        "null",
        "[100]",
    ];
    let mut refused = Vec::new();
    for (n, amount) in bad.iter().enumerate() {
        let payload = format!(r#"{{"account_id":1,"amount":{amount}}}"#);
        let key = oncebox_core::Key::parse("provider-a", &format!("bad-{n}")).expect("key");
        let event = oncebox_core::Event::json(key, payload).expect("valid JSON");
        let outcome = ledger::deliver(&inbox, event, false);
        refused.push(format!("{amount}: {}", handler_failure(&outcome)));
    }
    assert!(
        refused
            .iter()
            .all(|r| r.ends_with("amount must be an integer from 1 to 10^9")),
        "{refused:#?}"
    );
    assert_eq!(
        ledger::state(&inbox).expect("state"),
        (0, 0, 0),
        "balance, credit rows, inbox records after {} refusals",
        bad.len()
    );

    // The key was not burned: the corrected delivery applies, and once.
    let fixed = ledger::credit("provider-a", "bad-0", 1, 500).expect("event");
    assert_eq!(
        ledger::deliver(&inbox, fixed.clone(), false).expect("applied"),
        Processed::Applied(balance(500))
    );
    assert_eq!(
        ledger::deliver(&inbox, fixed, false).expect("duplicate"),
        Processed::Duplicate(balance(500))
    );
    assert_eq!(ledger::state(&inbox).expect("state"), (500, 1, 1));
}

#[test]
fn thank_you_scenario_sends_one_email_per_order() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = thank_you::run(dir.path())
            .await
            .expect("thank-you scenario");
        let body = |order: &str, status: &str, thank_you: &str| {
            Response::completed(format!(
                r#"{{"order_id":"{order}","status":"{status}","thank_you":"{thank_you}"}}"#
            ))
        };

        assert_eq!(
            s.created,
            Processed::Applied(body("o-1", "created", "none"))
        );
        assert_eq!(s.paid, Processed::Applied(body("o-1", "paid", "queued")));
        assert_eq!(s.emails_after_paid, 1);
        // Another event id for the same payment: applied, but the action key holds the email.
        assert_eq!(
            s.re_exported,
            Processed::Applied(body("o-1", "paid", "already-queued"))
        );
        assert_eq!(s.emails_after_re_export, 1);
        assert_eq!(
            s.redelivered,
            Processed::Duplicate(body("o-1", "paid", "queued"))
        );
        // An older "created" is stale and does not move the paid order back.
        assert_eq!(s.late_created, Processed::Stale);
        assert_eq!(s.status_after_late, "paid");
        // The customer's next purchase is a new order with its own email.
        assert_eq!(
            s.next_created,
            Processed::Applied(body("o-2", "created", "none"))
        );
        assert_eq!(
            s.next_paid,
            Processed::Applied(body("o-2", "paid", "queued"))
        );

        assert_eq!(s.emails, pairs(&[("o-1", "c-1"), ("o-2", "c-1")]));
        assert_eq!(
            s.outbox,
            pairs(&[("email", "thank-you:o-1"), ("email", "thank-you:o-2")])
        );
    });
}

/// The same payment reported under three event ids, one of them delivered twice, and a refund
/// between: one transition per fact, every report answered, the refund never undone. Another
/// payment's refund arrives before its success: recorded, and the success changes nothing.
#[test]
fn guarded_transitions_apply_each_fact_once() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = payment_status::run(dir.path())
            .await
            .expect("payment scenario");
        let moved = |p: &str, to: &str| {
            Response::completed(format!(
                r#"{{"payment":"{p}","changed":true,"status":"{to}"}}"#
            ))
        };
        let unchanged =
            |p: &str| Response::completed(format!(r#"{{"payment":"{p}","changed":false}}"#));
        let expected = [
            ("evt-a", Processed::Applied(moved("p-1", "paid"))),
            // Another event id for the same success: applied, the guard changes nothing.
            ("evt-b", Processed::Applied(unchanged("p-1"))),
            // The same event again: the inbox replays its first answer.
            ("evt-a", Processed::Duplicate(moved("p-1", "paid"))),
            ("evt-r", Processed::Applied(moved("p-1", "refunded"))),
            // A late success cannot move the refunded payment back to paid.
            ("evt-c", Processed::Applied(unchanged("p-1"))),
            // Out of order: the refund first, then the success, which changes nothing.
            ("evt-r2", Processed::Applied(moved("p-2", "refunded"))),
            ("evt-s2", Processed::Applied(unchanged("p-2"))),
        ];
        assert_eq!(s.answers, expected);
        assert_eq!(
            s.statuses,
            pairs(&[("p-1", "refunded"), ("p-2", "refunded")])
        );
        // p-1 received and returned; p-2's money never showed as received.
        assert_eq!(
            s.ledger,
            vec![("p-1".to_owned(), 500), ("p-1".to_owned(), -500)]
        );
    });
}

/// A report about a payment the service has not created yet: no row moves, and answered it
/// would be recorded and replayed for ever, its fact lost. It fails, nothing is kept, and the
/// provider's next delivery applies it once the payment exists.
#[test]
fn a_report_before_its_payment_exists_fails_and_applies_when_sent_again() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let inbox = payment_status::open(dir.path()).await.expect("open");
        let early = payment_status::deliver(&inbox, "evt-p3", "payment.succeeded", "p-3").await;
        assert!(matches!(early, Err(ProcessError::Handler(_))), "{early:?}");
        inbox
            .write(|c| c.execute("INSERT INTO payments VALUES ('p-3', 'created')", []))
            .await
            .expect("create p-3");
        let again = payment_status::deliver(&inbox, "evt-p3", "payment.succeeded", "p-3").await;
        let moved = r#"{"payment":"p-3","changed":true,"status":"paid"}"#;
        assert_eq!(
            again.expect("applied"),
            Processed::Applied(Response::completed(moved))
        );
    });
}

/// Every Rust block of the library guide is quoted, byte for byte, from one of the examples
/// these tests run, so the guide cannot drift from code that runs.
#[test]
fn the_guides_rust_blocks_are_quoted_from_the_examples() {
    let guide = include_str!("../../../../docs/library.md");
    let examples = [
        include_str!("../../examples/ledger.rs"),
        include_str!("../../examples/thank_you.rs"),
        include_str!("../../examples/payment_status.rs"),
        include_str!("../../examples/common/ledger.rs"),
        include_str!("../../../oncebox-postgres/examples/ledger_postgres.rs"),
    ];
    let blocks: Vec<&str> = guide
        .split("```rust\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or_default())
        .collect();
    assert!(
        blocks.len() >= 3,
        "the guide's Rust blocks: {}",
        blocks.len()
    );
    for block in blocks {
        assert!(
            examples.iter().any(|e| e.contains(block)),
            "a block of docs/library.md no example holds:\n{block}"
        );
    }
}
