//! `oncebox bench --rate`: the open loop. Requests fall due on a fixed schedule whatever the
//! pace of the answers, and each one's latency runs from its due time, as a sender sees it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::ProgressBar;

use super::ConnectionReport;
use super::connection::Connection;
use crate::exit;

/// A request that begins later than this after its due time is counted as a late start. Tokio's
/// timers tick in milliseconds, so a start up to a tick late is the clock's grain, not a delay.
pub(super) const LATE: Duration = Duration::from_millis(1);

/// Durations count nanoseconds: above this rate two requests would fall due less than 1 ns
/// apart, and the schedule could no longer tell them apart.
const MAX_RATE: f64 = 1e9;

/// The longest schedule taken: a century, as for every duration the binary reads. A due time
/// much further ahead would overflow the clock it is added to.
const MAX_SPAN: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// When each request falls due: request `i` at the start plus `i / rate` seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    rate: f64,
    events: usize,
}

impl Schedule {
    /// The schedule of `events` requests at `rate` per second, refused (exit 2) when some due
    /// time cannot be computed: a rate that is not a positive number, one so high that
    /// requests fall due less than a nanosecond apart, or one so low that the last request
    /// would fall due more than a century after the first.
    pub(super) fn new(rate: f64, events: usize) -> Result<Schedule> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(exit::usage(format!(
                "--rate must be a positive number of requests per second, e.g. 2000 (got {rate})"
            )));
        }
        if rate > MAX_RATE {
            return Err(exit::usage(format!(
                "--rate {rate:e} is above {MAX_RATE:e} requests per second: requests would \
                 fall due less than 1 ns apart"
            )));
        }
        let last = events.saturating_sub(1) as f64 / rate;
        if last > MAX_SPAN.as_secs_f64() {
            return Err(exit::usage(format!(
                "--rate {rate:e}: {events} requests would take more than 100 years"
            )));
        }
        Ok(Schedule { rate, events })
    }

    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// How long after the start request `i` is due. Within the bounds `new` checked, this is
    /// at most a century, so adding it to an `Instant` cannot overflow.
    fn offset(&self, i: usize) -> Duration {
        // `as` saturates and never panics; f64 keeps the nanosecond for runs of up to months.
        Duration::from_nanos((i as f64 * 1e9 / self.rate) as u64)
    }
}

/// Runs the schedule from now on `connections`. Each free connection claims the next request
/// in order and waits for its due time; a request that falls due while every connection is
/// busy is claimed by the first to become free, and its wait counts in its latency. Returns
/// each connection's report.
pub(super) async fn run(
    connections: Vec<Connection>,
    schedule: Schedule,
    bar: &ProgressBar,
) -> Result<Vec<ConnectionReport>> {
    let claimed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let senders: Vec<_> = connections
        .into_iter()
        .map(|connection| {
            tokio::spawn(sender(
                connection,
                schedule,
                start,
                claimed.clone(),
                bar.clone(),
            ))
        })
        .collect();
    let mut reports = Vec::with_capacity(senders.len());
    for s in senders {
        reports.push(s.await.context("a sender task failed")??);
    }
    Ok(reports)
}

/// One connection's share: the next unclaimed request, at its due time, until none is left.
async fn sender(
    mut connection: Connection,
    schedule: Schedule,
    start: Instant,
    claimed: Arc<AtomicUsize>,
    bar: ProgressBar,
) -> Result<ConnectionReport> {
    loop {
        // Claims are taken in order; the counter only orders them, it guards no other data.
        let i = claimed.fetch_add(1, Ordering::Relaxed);
        if i >= schedule.events {
            return Ok(connection.report);
        }
        let due = start + schedule.offset(i);
        // A free connection claims its next request ahead of time, so one claimed after its
        // due time fell due while every connection was busy.
        let busy = Instant::now().saturating_duration_since(due) > LATE;
        // Built before the wait, so that building it is not counted as the gateway's time.
        let (class, event) = connection.next_event()?;
        tokio::time::sleep_until(due.into()).await;
        if busy {
            connection.report.late += 1;
        } else if Instant::now().saturating_duration_since(due) > LATE {
            // A connection was free, yet the request went out late: this process was slow to
            // run it (busy CPUs), which inflates the latencies without the gateway's doing.
            connection.report.lagged += 1;
        }
        connection.send(class, &event, due).await;
        bar.inc(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_fall_due_at_i_over_rate() {
        let s = Schedule::new(4.0, 9).unwrap();
        assert_eq!(s.offset(0), Duration::ZERO);
        assert_eq!(s.offset(1), Duration::from_millis(250));
        assert_eq!(s.offset(8), Duration::from_secs(2));
    }

    #[test]
    fn rates_whose_schedule_cannot_be_computed_are_usage_errors() {
        for (rate, said) in [
            (0.0, "positive"),
            (-5.0, "positive"),
            (f64::NAN, "positive"),
            (f64::INFINITY, "positive"),
            (2e9, "less than 1 ns apart"),
            (1e-12, "more than 100 years"),
        ] {
            let e = Schedule::new(rate, 1000).unwrap_err();
            assert_eq!(exit::classify(&e), exit::Code::Usage, "{rate}");
            assert!(format!("{e:#}").contains(said), "{rate}: {e:#}");
            assert!(format!("{e:#}").contains("--rate"), "{rate}: {e:#}");
        }
    }
}
