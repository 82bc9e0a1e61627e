//! The PostgreSQL ledger example's scenario as a test: seed 003's steps on two nodes sharing one
//! schema, every step checked against exact values.

#[path = "../../examples/ledger_postgres.rs"]
mod ledger;

use oncebox_core::{ProcessError, Processed, Response};

use crate::harness::{schema, url};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ledger_scenario_matches_the_seed_on_two_nodes() {
    let Some(url) = url() else { return };
    let schema = schema();
    let s = ledger::run(&url, &schema).await;
    ledger::drop_schema(&url, &schema)
        .await
        .expect("drop the schema");
    let s = s.expect("ledger scenario");
    assert!(s.seed_holds(), "{s}");

    // 1–2: applied once on one node; the duplicate on the other replays the first response.
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

    // 5: 20 racing deliveries through two nodes, one effect; every duplicate replays the one
    // first response.
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
        handler_failure(&s.missing_account).contains("violates foreign key constraint"),
        "{:?}",
        s.missing_account
    );
    assert_eq!(s.inbox_rows_after_missing_account, 4);
    // The stored first response is replayed, not recomputed from today's balance of 2000.
    assert_eq!(s.late_duplicate, Processed::Duplicate(balance(1500)));
}
