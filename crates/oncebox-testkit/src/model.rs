//! Model-based test: random sequences of deliveries, duplicates, conflicts, handler failures,
//! crashes before and after the commit, and restarts run against a backend and against an
//! in-memory model; every answer and the final state must agree.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use oncebox_core::{ManualClock, ProcessError, Processed, Response};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::{Backend, CrashAt, Crashed, EPOCH, End, Script, event};

#[derive(Debug, Clone)]
enum Op {
    Deliver(Delivery),
    /// The delivery's process is killed before or after its commit, then restarted.
    Crash(Delivery, CrashAt),
    Restart,
}

#[derive(Debug, Clone, Copy)]
struct Delivery {
    source: u8,
    id: u8,
    amount: i64,
    end: u8,
}

fn op() -> impl Strategy<Value = Op> {
    let delivery =
        (0u8..2, 0u8..5, 1i64..3, 0u8..8).prop_map(|(source, id, amount, end)| Delivery {
            source,
            id,
            amount,
            end,
        });
    let at = prop_oneof![Just(CrashAt::BeforeCommit), Just(CrashAt::AfterCommit)];
    prop_oneof![
        12 => delivery.clone().prop_map(Op::Deliver),
        2 => (delivery, at).prop_map(|(d, at)| Op::Crash(d, at)),
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

/// The answer the store keeps for a new key whose handler ends as `end`, if it keeps one.
fn kept(end: &End) -> Option<Response> {
    match end {
        End::Complete(body) => Some(Response::completed(body.as_str())),
        End::Reject(body) => Some(Response::rejected(body.as_str())),
        End::Fail | End::Panic => None,
    }
}

/// The model's record of a key: the payload amount it was first committed with and its answer.
type Model = BTreeMap<(u8, u8), (i64, Response)>;

/// Crashes that really killed a delivery, before and after its commit, over all sequences:
/// a run in which none did would not have tested recovery at all. (Before the commit the kill
/// can be missed: a key already recorded never reaches its handler. After it, every applied
/// delivery counts; what is tested there is the recovery of the committed state.)
#[derive(Default)]
struct Deaths {
    before_commit: AtomicUsize,
    after_commit: AtomicUsize,
}

/// Checks the answer to delivery `d` against the model and records a new key.
fn answer(
    model: &mut Model,
    d: Delivery,
    got: Result<Processed, ProcessError>,
) -> Result<(), TestCaseError> {
    let Delivery {
        source, id, amount, ..
    } = d;
    let end = end_of(d.end);
    match (model.get(&(source, id)), got) {
        (Some((first, stored)), Ok(Processed::Duplicate(r))) if *first == amount => {
            prop_assert_eq!(&r, stored);
        }
        (Some((first, _)), Err(ProcessError::Conflict { .. })) if *first != amount => {}
        (None, Ok(Processed::Applied(r))) => {
            let Some(want) = kept(&end) else {
                return Err(TestCaseError::fail(format!("{end:?} applied")));
            };
            prop_assert_eq!(&r, &want);
            model.insert((source, id), (amount, r));
        }
        (None, Err(ProcessError::Handler(_))) if kept(&end).is_none() => {}
        (expected, got) => {
            return Err(TestCaseError::fail(format!(
                "src{source}/evt-{id} amount {amount} {end:?}: model {expected:?}, got {got:?}"
            )));
        }
    }
    Ok(())
}

/// Records a delivery whose process died at `at`: after the commit the key holds the answer
/// the handler gave; before it, nothing of the delivery remains.
fn death(model: &mut Model, d: Delivery, at: CrashAt) -> Result<(), TestCaseError> {
    let (key, end) = ((d.source, d.id), end_of(d.end));
    if let Some(recorded) = model.get(&key) {
        return Err(TestCaseError::fail(format!(
            "src{}/evt-{} ran its handler again though {recorded:?} was recorded",
            d.source, d.id
        )));
    }
    match (at, kept(&end)) {
        (CrashAt::BeforeCommit, _) => {}
        (CrashAt::AfterCommit, Some(response)) => {
            model.insert(key, (d.amount, response));
        }
        (CrashAt::AfterCommit, None) => {
            return Err(TestCaseError::fail(format!(
                "src{}/evt-{} committed though its handler ended {end:?}",
                d.source, d.id
            )));
        }
    }
    Ok(())
}

async fn check<B: Backend>(ops: Vec<Op>, deaths: &Deaths) -> Result<(), TestCaseError> {
    let mut b = B::fresh(ManualClock::new(EPOCH)).await;
    let mut model = Model::new();
    for op in ops {
        let (d, at) = match op {
            Op::Restart => {
                b = b.reopen().await;
                continue;
            }
            Op::Deliver(d) => (d, None),
            Op::Crash(d, at) => (d, Some(at)),
        };
        let e = event(
            &format!("src{}", d.source),
            &format!("evt-{}", d.id),
            d.amount,
        );
        let script = Script::credit(d.amount).end(end_of(d.end));
        let Some(at) = at else {
            answer(&mut model, d, b.process(e, script).await)?;
            continue;
        };
        let (restarted, crashed) = b.crash(e, script, at).await;
        b = restarted;
        match crashed {
            Crashed::Answered(got) => answer(&mut model, d, got)?,
            Crashed::Died => {
                death(&mut model, d, at)?;
                let n = match at {
                    CrashAt::BeforeCommit => &deaths.before_commit,
                    CrashAt::AfterCommit => &deaths.after_commit,
                };
                n.fetch_add(1, Ordering::Relaxed);
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

/// Runs 48 random sequences of up to 40 operations, drawn from the printed seed
/// (`ONCEBOX_SEED` replays them); proptest shrinks a failing one to a minimal sequence.
pub async fn model_based_sequences_match_the_model<B: Backend>() {
    let handle = tokio::runtime::Handle::current();
    let deaths = Arc::new(Deaths::default());
    let counted = Arc::clone(&deaths);
    let outcome = tokio::task::spawn_blocking(move || {
        let config = Config {
            cases: 48,
            ..crate::seed::Seed::from_env("model-based test").proptest()
        };
        let mut runner = TestRunner::new(config);
        runner
            .run(&proptest::collection::vec(op(), 1..40), |ops| {
                handle.block_on(check::<B>(ops, &counted))
            })
            .map_err(|e| e.to_string())
    })
    .await
    .expect("model test task");
    if let Err(e) = outcome {
        panic!("model-based test failed: {e}");
    }
    let before = deaths.before_commit.load(Ordering::Relaxed);
    let after = deaths.after_commit.load(Ordering::Relaxed);
    assert!(
        before > 0 && after > 0,
        "crashes killed {before} deliveries before their commit and {after} after: \
         recovery from both was not exercised"
    );
    eprintln!("model-based test: {before} deliveries killed before their commit, {after} after");
}
