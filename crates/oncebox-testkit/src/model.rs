//! Model-based test: random sequences of deliveries, duplicates, conflicts, handler failures and
//! restarts run against a backend and against an in-memory model; every answer and the final
//! state must agree.

use std::collections::BTreeMap;

use oncebox_core::{ManualClock, ProcessError, Processed, Response};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

use crate::{Backend, EPOCH, End, Script, event};

#[derive(Debug, Clone)]
enum Op {
    Deliver {
        source: u8,
        id: u8,
        amount: i64,
        end: u8,
    },
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0u8..2, 0u8..5, 1i64..3, 0u8..8)
            .prop_map(|(source, id, amount, end)| Op::Deliver { source, id, amount, end }),
        1 => Just(Op::Restart),
    ]
}

fn end_of(code: u8) -> End {
    match code {
        0 => End::Fail,
        1 => End::Panic,
        2 => End::Reject("no".into()),
        _ => End::Complete("ok".into()),
    }
}

/// The model's record of a key: the payload amount it was first committed with and its answer.
type Model = BTreeMap<(u8, u8), (i64, Response)>;

async fn check<B: Backend>(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut b = B::fresh(ManualClock::new(EPOCH)).await;
    let mut model = Model::new();
    for op in ops {
        let Op::Deliver {
            source,
            id,
            amount,
            end,
        } = op
        else {
            b = b.reopen().await;
            continue;
        };
        let e = event(&format!("src{source}"), &format!("evt-{id}"), amount);
        let end = end_of(end);
        let got = b.process(e, Script::credit(amount).end(end.clone())).await;
        match (model.get(&(source, id)), got) {
            (Some((first, stored)), Ok(Processed::Duplicate(r))) if *first == amount => {
                prop_assert_eq!(&r, stored)
            }
            (Some((first, _)), Err(ProcessError::Conflict { .. })) if *first != amount => {}
            (None, Ok(Processed::Applied(r))) => {
                let want = match &end {
                    End::Complete(body) => Response::completed(body.as_str()),
                    End::Reject(body) => Response::rejected(body.as_str()),
                    other => return Err(TestCaseError::fail(format!("{other:?} applied"))),
                };
                prop_assert_eq!(&r, &want);
                model.insert((source, id), (amount, r));
            }
            (None, Err(ProcessError::Handler(_))) if matches!(end, End::Fail | End::Panic) => {}
            (expected, got) => {
                return Err(TestCaseError::fail(format!(
                    "src{source}/evt-{id} amount {amount} {end:?}: model {expected:?}, got {got:?}"
                )));
            }
        }
    }
    let seen = b.observe().await;
    let completed: Vec<_> = model
        .iter()
        .filter(|(_, (_, r))| r.kind == oncebox_core::ResponseKind::Completed)
        .collect();
    prop_assert_eq!(seen.inbox_rows, model.len() as i64);
    prop_assert_eq!(
        seen.balance,
        completed.iter().map(|(_, (a, _))| *a).sum::<i64>()
    );
    prop_assert_eq!(seen.effects.values().sum::<i64>(), completed.len() as i64);
    prop_assert_eq!(seen.doubles(), 0);
    Ok(())
}

/// Runs 48 random sequences of up to 40 operations; proptest prints and persists the seed of a
/// failing case, and shrinks it to a minimal sequence.
pub async fn model_based_sequences_match_the_model<B: Backend>() {
    let handle = tokio::runtime::Handle::current();
    let outcome = tokio::task::spawn_blocking(move || {
        let seed = std::env::var("ONCEBOX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::UNIX_EPOCH
                    .elapsed()
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("model-based test seed: {seed} (replay with ONCEBOX_SEED={seed})");
        let config = Config {
            cases: 48,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(seed),
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        runner
            .run(&proptest::collection::vec(op(), 1..40), |ops| {
                handle.block_on(check::<B>(ops))
            })
            .map_err(|e| e.to_string())
    })
    .await
    .expect("model test task");
    if let Err(e) = outcome {
        panic!("model-based test failed: {e}");
    }
}
