//! How a batch worker fills a batch from the queue: by count and by the bytes it binds.

use std::sync::atomic::Ordering;

use super::{BatchStats, Job};
use crate::limit::MAX_EVENT_BYTES;
use crate::options::Options;

/// Bytes a request binds in its batch's statements: its payload once in the inbox and once
/// per route in the outbox, its stored answer and its headers.
fn weight(job: &Job) -> usize {
    let i = &job.ingest;
    let headers = i.event.meta.header_lines().map_or(0, str::len);
    let payload = i.event.payload.len();
    payload
        .saturating_mul(1 + i.routes.len())
        .saturating_add(i.accepted.len())
        .saturating_add(headers)
}

/// The next batch: `first`, then what the queue holds now, up to `max_batch` requests and
/// `max_batch_bytes` bound bytes. PostgreSQL refuses a value or a message past 1 GB, which 256
/// one-megabyte events to four routes would pass, failing the whole batch each time it came
/// round. A request that would pass the bytes is handed back to open the next batch; `first`
/// alone may pass them. Each request taken from the queue is counted as held.
pub(super) fn gather(
    first: Job,
    receiver: &flume::Receiver<Job>,
    options: &Options,
    stats: &BatchStats,
) -> (Vec<Job>, Option<Job>) {
    // However high it was set: past PostgreSQL's own bound, the requests beside a large one
    // would fail with it.
    let limit = options.max_batch_bytes.min(MAX_EVENT_BYTES);
    let mut bytes = weight(&first);
    let mut jobs = vec![first];
    while jobs.len() < options.max_batch {
        let Ok(job) = receiver.try_recv() else {
            break;
        };
        stats.held.fetch_add(1, Ordering::Relaxed);
        let w = weight(&job);
        if bytes.saturating_add(w) > limit {
            return (jobs, Some(job));
        }
        bytes += w;
        jobs.push(job);
    }
    (jobs, None)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use oncebox_core::store::Ingest;
    use oncebox_core::{Event, Key};

    use super::*;

    fn job(id: &str, payload_bytes: usize, routes: usize) -> Job {
        let body = format!(r#"{{"p":"{}"}}"#, "x".repeat(payload_bytes - 8));
        let event = Event::json(Key::parse("shop", id).unwrap(), body).unwrap();
        assert_eq!(event.payload.len(), payload_bytes);
        let (answer, _) = tokio::sync::oneshot::channel();
        Job {
            ingest: Ingest {
                event,
                order: None,
                accepted: Vec::new(),
                stale: Vec::new(),
                routes: (0..routes).map(|r| format!("r{r}")).collect(),
            },
            deadline: Instant::now(),
            answer,
        }
    }

    fn ids(jobs: &[Job]) -> Vec<&str> {
        jobs.iter()
            .map(|j| j.ingest.event.key.event_id.as_str())
            .collect()
    }

    #[test]
    fn a_batch_stops_before_the_bytes_it_binds_pass_the_limit() {
        let options = Options::new("postgres://unused")
            .max_batch(100)
            .max_batch_bytes(1_000);
        let stats = BatchStats::default();
        let (tx, rx) = flume::unbounded();
        // 100 bytes to 3 routes bind 400; 100 to none, 100.
        for (id, bytes, routes) in [("b", 100, 3), ("c", 100, 0), ("d", 100, 3), ("e", 20, 0)] {
            tx.send(job(id, bytes, routes)).unwrap();
        }
        let (jobs, carried) = gather(job("a", 100, 3), &rx, &options, &stats);
        // 400 + 400 + 100 = 900; d's 400 more would pass 1000: it opens the next batch.
        assert_eq!(ids(&jobs), ["a", "b", "c"]);
        let carried = carried.expect("d handed back");
        assert_eq!(ids(std::slice::from_ref(&carried)), ["d"]);
        assert_eq!(stats.held(), 3, "b, c and d taken from the queue");
        let (jobs, carried) = gather(carried, &rx, &options, &stats);
        assert_eq!(ids(&jobs), ["d", "e"]);
        assert!(carried.is_none());
    }

    #[test]
    fn a_request_past_the_limit_alone_still_goes_in_a_batch_of_its_own() {
        let options = Options::new("postgres://unused")
            .max_batch(100)
            .max_batch_bytes(1_000);
        let stats = BatchStats::default();
        let (tx, rx) = flume::unbounded();
        tx.send(job("b", 100, 0)).unwrap();
        let (jobs, carried) = gather(job("a", 2_000, 0), &rx, &options, &stats);
        assert_eq!(ids(&jobs), ["a"]);
        assert_eq!(ids(std::slice::from_ref(&carried.expect("b next"))), ["b"]);
    }

    #[test]
    fn no_batch_passes_what_postgresql_takes_however_high_its_bound_is_set() {
        let options = Options::new("postgres://unused").max_batch_bytes(usize::MAX);
        let stats = BatchStats::default();
        let (tx, rx) = flume::unbounded();
        // Allocated zeroed, never touched: two of them pass 1 GiB together.
        let big = |id: &str| {
            let mut j = job(id, 100, 0);
            j.ingest.event.payload = vec![0; MAX_EVENT_BYTES / 2 + 1];
            j
        };
        tx.send(big("b")).unwrap();
        tx.send(job("c", 100, 0)).unwrap();
        let (jobs, carried) = gather(big("a"), &rx, &options, &stats);
        assert_eq!(ids(&jobs), ["a"]);
        let carried = carried.expect("b opens the next batch");
        let (jobs, _) = gather(carried, &rx, &options, &stats);
        assert_eq!(ids(&jobs), ["b", "c"]);
    }

    #[test]
    fn the_count_limit_still_holds() {
        let options = Options::new("postgres://unused").max_batch(2);
        let stats = BatchStats::default();
        let (tx, rx) = flume::unbounded();
        for id in ["b", "c"] {
            tx.send(job(id, 100, 1)).unwrap();
        }
        let (jobs, carried) = gather(job("a", 100, 1), &rx, &options, &stats);
        assert_eq!(ids(&jobs), ["a", "b"]);
        assert!(carried.is_none());
        assert_eq!(rx.len(), 1, "c stays queued");
    }
}
