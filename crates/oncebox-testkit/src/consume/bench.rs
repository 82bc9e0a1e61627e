//! The broker consumer benchmarks' shared part: the backlog with 10% duplicates, the baseline
//! that acks without dedup, the timed drain (rate and this process's CPU per message) and the
//! report with its exactly-once check.

use std::fmt::Debug;
use std::future::Future;
use std::time::Instant;

use oncebox_core::consume::{Apply, Counts, from_fn};
use oncebox_core::{ProcessError, Processed, Response};
use tokio::sync::{oneshot, watch};

use super::Store;

/// The benchmark's backlog: `n` message ids, every tenth repeating an earlier one (same id,
/// same body).
pub fn backlog(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let k = if i % 10 == 9 { i / 2 } else { i };
            format!("evt_{k}")
        })
        .collect()
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
}

impl Drained {
    /// A drain that did not run.
    pub const SKIPPED: Drained = Drained {
        rate: f64::NAN,
        cpu_us: f64::NAN,
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

/// Times a drain of `n` messages: runs `run` from now until `counts` show `n` acks, then fires
/// its shutdown receiver and waits for it to end.
pub async fn drain<E: Debug, F: Future<Output = Result<(), E>>>(
    mut counts: watch::Receiver<Counts>,
    n: usize,
    run: impl FnOnce(oneshot::Receiver<()>) -> F,
) -> Drained {
    let cpu_before = cpu_micros();
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
        let _ = stop.send(());
        (elapsed, cpu)
    };
    let (ran, (elapsed, cpu_after)) = tokio::join!(run, wait);
    ran.expect("the consumer ran");
    let cpu_us = match (cpu_before, cpu_after) {
        (Some(b), Some(a)) => (a - b) / n as f64,
        _ => f64::NAN,
    };
    Drained {
        rate: n as f64 / elapsed.as_secs_f64(),
        cpu_us,
    }
}

/// Prints a benchmark's figures under `title` (the baseline `plain`, the inbox's `dedup`), and
/// checks that each of the `unique` keys was applied exactly once.
#[expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]
pub async fn report(title: &str, plain: Drained, dedup: Drained, store: &Store, unique: usize) {
    let (rows, distinct) = store.rows().await;
    println!("{title}");
    println!(
        "  (a) same loop, ack without dedup:          {:>9.0} msg/s  {:>6.1} µs CPU/msg",
        plain.rate, plain.cpu_us
    );
    println!(
        "  (b) oncebox inbox on SQLite (FULL sync):   {:>9.0} msg/s  {:>6.1} µs CPU/msg",
        dedup.rate, dedup.cpu_us
    );
    println!(
        "  ratio b/a: {:.2} (target >= 0.50); CPU per message b/a: {:.2}",
        dedup.rate / plain.rate,
        dedup.cpu_us / plain.cpu_us
    );
    let stats = store.inbox.stats();
    println!(
        "  (b) committed {} requests in {} transactions ({:.1} per commit)",
        stats.committed_requests(),
        stats.commits(),
        stats.committed_requests() as f64 / stats.commits().max(1) as f64
    );
    println!("  check: {rows} effect rows for {distinct} keys (expected {unique} and {unique})");
    assert_eq!(
        (rows, distinct),
        (unique as i64, unique as i64),
        "a key applied twice or lost"
    );
}
