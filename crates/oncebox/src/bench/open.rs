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

/// A request that begins later than this after its due time is counted as a late start.
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

/// A request released by the pacer: its number, and whether a connection was waiting for work
/// when it fell due (one was set aside for it).
struct Due {
    index: usize,
    connection_free: bool,
}

/// Runs the schedule from now on `connections`. A thread of its own releases each request at
/// its due time into a queue the connections take from in order; a request that falls due
/// while every connection is busy waits in the queue for the first to become free, and the
/// wait counts in its latency. Returns each connection's report.
pub(super) async fn run(
    connections: Vec<Connection>,
    schedule: Schedule,
    bar: &ProgressBar,
) -> Result<Vec<ConnectionReport>> {
    let (queue, due) = flume::unbounded();
    let idle = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let senders: Vec<_> = connections
        .into_iter()
        .map(|connection| {
            tokio::spawn(sender(
                connection,
                schedule,
                start,
                due.clone(),
                idle.clone(),
                bar.clone(),
            ))
        })
        .collect();
    // Only the senders take from the queue: once they are all gone, the pacer's next send
    // fails and it stops.
    drop(due);
    // Not a tokio timer: those tick in milliseconds, and a request released up to a tick late
    // would carry the tick in its latency. A sleeping thread wakes within tens of µs.
    let pacer = {
        let idle = idle.clone();
        std::thread::Builder::new()
            .name("oncebox-bench-pacer".into())
            .spawn(move || pace(schedule, start, &queue, &idle))
            .context("starting the pacing thread")?
    };
    let mut reports = Vec::with_capacity(senders.len());
    for s in senders {
        reports.push(s.await.context("a sender task failed")??);
    }
    // Every sender saw the queue closed, which the pacer does by returning, so this join does
    // not wait; it fails only on a panic, and nothing in `pace` panics on an accepted schedule.
    let _ = pacer.join();
    Ok(reports)
}

/// Releases every request at its due time, in order, and closes the queue after the last.
fn pace(schedule: Schedule, start: Instant, queue: &flume::Sender<Due>, idle: &AtomicUsize) {
    for index in 0..schedule.events {
        let due = start + schedule.offset(index);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        // Sets aside one of the connections waiting for work, if any: that one takes this
        // request (or an earlier one, which comes to the same count).
        let connection_free = idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        let released = Due {
            index,
            connection_free,
        };
        if queue.send(released).is_err() {
            // Every sender is gone (one failed): nobody is left to take the rest.
            return;
        }
    }
}

/// One connection's share: the next request released, sent at once, until the queue closes.
async fn sender(
    mut connection: Connection,
    schedule: Schedule,
    start: Instant,
    due: flume::Receiver<Due>,
    idle: Arc<AtomicUsize>,
    bar: ProgressBar,
) -> Result<ConnectionReport> {
    loop {
        // Built before the wait, so that building it is not counted as the gateway's time.
        let (class, event) = connection.next_event()?;
        // Counted as waiting until the pacer sets it aside or it takes a request nobody had
        // set aside a connection for: every count is taken back exactly once.
        idle.fetch_add(1, Ordering::AcqRel);
        let Ok(released) = due.recv_async().await else {
            return Ok(connection.report);
        };
        if !released.connection_free {
            // Saturating: the pacer may just have set this count aside for a later request.
            let _ = idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        let due_at = start + schedule.offset(released.index);
        if Instant::now().saturating_duration_since(due_at) > LATE {
            if released.connection_free {
                // A connection was waiting, yet took the request late: this process was slow
                // to run it (short of CPU), which inflates the latency without the gateway.
                connection.report.lagged += 1;
            } else {
                connection.report.late += 1;
            }
        }
        connection.send(class, &event, due_at).await;
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
