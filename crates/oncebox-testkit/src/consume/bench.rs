//! The broker consumer benchmarks' shared part: the backlog with 10% duplicates, the baseline
//! that acks without dedup, the timed drain (rate and this process's CPU per message), the
//! rounds in which the two loops take turns, and the report with its exactly-once check.

use std::fmt::Debug;
use std::future::Future;
use std::time::Instant;

use oncebox_core::consume::{Apply, Counts, from_fn};
use oncebox_core::{ProcessError, Processed, Response};
use tokio::sync::{oneshot, watch};

use super::Store;

/// Round `round`'s backlog: `n` message ids, every tenth repeating an earlier one of the same
/// round (same id, same body); two rounds share no id, so each finds its keys new.
pub fn backlog(n: usize, round: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let k = if i % 10 == 9 { i / 2 } else { i };
            format!("evt_{round}_{k}")
        })
        .collect()
}

/// Which loop a round's drain runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// The consumer acking every message without dedup.
    Plain,
    /// The consumer applying every message through the inbox.
    Inbox,
}

/// Runs `rounds` rounds of `one(round, loop)` for both loops, taking turns (the plain loop
/// first in even rounds, second in odd ones), so that a machine whose speed drifts during the
/// run slows both alike; returns (plain, inbox) per round.
pub async fn rounds<F, Fut>(rounds: usize, mut one: F) -> Vec<(Drained, Drained)>
where
    F: FnMut(usize, Loop) -> Fut,
    Fut: Future<Output = Drained>,
{
    let mut out = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (plain, inbox) = if round % 2 == 0 {
            let plain = one(round, Loop::Plain).await;
            (plain, one(round, Loop::Inbox).await)
        } else {
            let inbox = one(round, Loop::Inbox).await;
            (one(round, Loop::Plain).await, inbox)
        };
        out.push((plain, inbox));
    }
    out
}

/// The median of `values` (NaN for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The body of backlog message `id`.
pub fn backlog_body(id: &str) -> String {
    format!(r#"{{"id":"{id}","amount":100,"currency":"EUR"}}"#)
}

/// The baseline's `Apply`: every event answered as applied, without any store or dedup.
pub fn ack_all() -> impl Apply {
    from_fn(|_event, _position| async {
        Ok::<_, ProcessError>(Processed::Applied(Response::completed("")))
    })
}

/// What one timed drain measured.
#[derive(Debug, Clone, Copy)]
pub struct Drained {
    /// Messages per second, from the consumer's start to the last ack.
    pub rate: f64,
    /// CPU time this process spent per message (user + system, all threads), in µs. Unlike the
    /// rate it hardly moves when other work shares the cores, so it compares two loops on a
    /// busy machine; the broker server's own CPU is not in it.
    pub cpu_us: f64,
    /// The part of `cpu_us` spent by SQLite's writer thread (zero for the plain loop).
    pub writer_us: f64,
    /// Time per message the writer thread was ready to run but waited for a CPU.
    pub writer_wait_us: f64,
}

impl Drained {
    /// A drain that did not run.
    pub const SKIPPED: Drained = Drained {
        rate: f64::NAN,
        cpu_us: f64::NAN,
        writer_us: f64::NAN,
        writer_wait_us: f64::NAN,
    };
}

/// This process's CPU time so far (user + system, every thread), in µs; `None` where `/proc`
/// is not readable.
fn cpu_micros() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports them in USER_HZ, which is 100 on every architecture it exports to /proc.
    Some(ticks * 10_000.0)
}

/// Nanoseconds SQLite's writer threads (`oncebox-writer`) of this process have run and have
/// waited for a CPU; zeros where Linux's per-thread `schedstat` is missing.
fn writer_nanos() -> (u64, u64) {
    crate::thread_times()
        .iter()
        .filter(|t| t.name == "oncebox-writer")
        .fold((0, 0), |(on, waiting), t| (on + t.on, waiting + t.waiting))
}

/// Times a drain of `n` messages: runs `run` from now until `counts` show `n` acks, then fires
/// its shutdown receiver and waits for it to end.
pub async fn drain<E: Debug, F: Future<Output = Result<(), E>>>(
    mut counts: watch::Receiver<Counts>,
    n: usize,
    run: impl FnOnce(oneshot::Receiver<()>) -> F,
) -> Drained {
    let cpu_before = cpu_micros();
    let writer_before = writer_nanos();
    let started = Instant::now();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = run(stopped);
    let wait = async {
        counts
            .wait_for(|c| c.acked == n as u64)
            .await
            .expect("the consumer's counts");
        let elapsed = started.elapsed();
        let cpu = cpu_micros();
        let writer = writer_nanos();
        let _ = stop.send(());
        (elapsed, cpu, writer)
    };
    let (mut run, mut wait) = (std::pin::pin!(run), std::pin::pin!(wait));
    // A consumer that ends before the drain (its options refused, the broker gone) says why,
    // where waiting on its counts would wait for ever.
    let (elapsed, cpu_after, writer_after) = tokio::select! {
        measured = &mut wait => {
            run.await.expect("the consumer ran");
            measured
        }
        ran = &mut run => panic!("the consumer ended before draining {n} messages: {ran:?}"),
    };
    let cpu_us = match (cpu_before, cpu_after) {
        (Some(b), Some(a)) => (a - b) / n as f64,
        _ => f64::NAN,
    };
    Drained {
        rate: n as f64 / elapsed.as_secs_f64(),
        cpu_us,
        writer_us: writer_after.0.saturating_sub(writer_before.0) as f64 / 1000.0 / n as f64,
        writer_wait_us: writer_after.1.saturating_sub(writer_before.1) as f64 / 1000.0 / n as f64,
    }
}

/// Prints a benchmark's figures under `title`: each round's baseline (plain) and inbox drain,
/// and the medians of the rounds' ratios; then checks that each of the `unique` keys of all
/// rounds was applied exactly once.
#[expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]
pub async fn report(title: &str, rounds: &[(Drained, Drained)], store: &Store, unique: usize) {
    let (rows, distinct) = store.rows().await;
    println!("{title}");
    println!(
        "  round  (a) ack without dedup        (b) oncebox inbox, SQLite FULL [writer on CPU, waiting]   b/a rate  b/a CPU"
    );
    for (i, (plain, dedup)) in rounds.iter().enumerate() {
        println!(
            "  {:>5}  {:>8.0} msg/s {:>5.1} µs/msg   {:>8.0} msg/s {:>5.1} µs/msg [{:>4.1}, {:>4.1}]          {:>6.2}   {:>6.2}",
            i + 1,
            plain.rate,
            plain.cpu_us,
            dedup.rate,
            dedup.cpu_us,
            dedup.writer_us,
            dedup.writer_wait_us,
            dedup.rate / plain.rate,
            dedup.cpu_us / plain.cpu_us
        );
    }
    let rate = median(rounds.iter().map(|(p, d)| d.rate / p.rate).collect());
    let cpu = median(rounds.iter().map(|(p, d)| d.cpu_us / p.cpu_us).collect());
    println!(
        "  ratio b/a (median of {} rounds): {rate:.2} (target >= 0.50); CPU per message b/a: {cpu:.2}",
        rounds.len()
    );
    let stats = store.inbox.stats();
    println!(
        "  (b) committed {} requests in {} transactions ({:.1} per commit, {:.2} ms in each COMMIT)",
        stats.committed_requests(),
        stats.commits(),
        stats.committed_requests() as f64 / stats.commits().max(1) as f64,
        stats.commit_time().as_secs_f64() * 1000.0 / stats.commits().max(1) as f64
    );
    println!("  check: {rows} effect rows for {distinct} keys (expected {unique} and {unique})");
    assert_eq!(
        (rows, distinct),
        (unique as i64, unique as i64),
        "a key applied twice or lost"
    );
}
