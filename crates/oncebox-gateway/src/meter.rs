//! Ingest metrics per source: the counter and histogram handles are looked up once per source
//! name, not on every request, and the Prometheus recorder's histogram samples are drained on
//! a timer.
//!
//! Why the handles are kept: `counter!` and `histogram!` with a source label build the label
//! (a copy of the name), hash the key and look it up in the recorder's registry on every call:
//! about 3% of the request threads' CPU with new events (perf), and about 1 900 instructions
//! per request, now about 480 (callgrind, gateway benchmark).
//!
//! Why the drain: the Prometheus recorder keeps every histogram sample (a value and an
//! instant, 24 bytes) until `/metrics` is scraped or its upkeep runs. A recorder installed
//! with `install_recorder`, as `oncebox serve` does, has no upkeep of its own, so a gateway
//! nobody scraped grew by 24 bytes per request without bound.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use oncebox_core::Source;

use crate::policy::GatewayConfig;
use crate::problem::OUTCOMES;

/// The two series, made both for kept handles and through the macros.
const TOTAL: &str = "oncebox_ingest_total";
const DURATION: &str = "oncebox_ingest_duration_seconds";

/// The ingest latency histogram's bucket bounds, in seconds: from a cached replay to GitHub's
/// 10 s delivery timeout, the strictest a common sender sets.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The Prometheus recorder as the gateway installs it: the ingest latency is a histogram with
/// [`DURATION_BUCKETS`], so that the series of several gateways add up (a summary's quantiles
/// do not), and every other distribution keeps the exporter's default.
pub fn recorder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DURATION.to_owned()), &DURATION_BUCKETS)
        // Only an empty list is refused, and this one is not.
        .unwrap_or_else(|_| PrometheusBuilder::new())
}

/// Source names counted under their own name. Open sources (loopback only) take any name; past
/// this many the rest are counted together under [`OTHERS`].
const MOST_KEPT: usize = 1024;

/// The source label of the names past [`MOST_KEPT`]: no source can be named so (a name starts
/// with a lowercase letter or a digit).
pub const OTHERS: &str = "_others";

/// The source label of requests to a name no source has. Not `unknown`, which a source may be
/// named: its figures would have taken anyone's requests to made-up names.
pub const UNKNOWN: &str = "_unknown";

/// How often the recorder's histogram samples are folded in: the interval
/// `metrics-exporter-prometheus` uses for the recorders it installs with an upkeep task.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// One source's handles.
struct Meter {
    outcomes: [Counter; OUTCOMES.len()],
    duration: Histogram,
}

impl Meter {
    fn new(source: &str) -> Meter {
        Meter {
            outcomes: OUTCOMES.map(|outcome| {
                metrics::counter!(TOTAL, "source" => source.to_owned(), "outcome" => outcome)
            }),
            duration: metrics::histogram!(DURATION, "source" => source.to_owned()),
        }
    }
}

/// Kept handles by source name. They belong to the global recorder, which is set once per
/// process, so one map serves every gateway in it.
static METERS: LazyLock<Meters> = LazyLock::new(Default::default);

type Meters = RwLock<HashMap<String, Arc<Meter>>>;

/// Whether requests for `source` are counted under its own name: senders choose names, so one
/// that names no source is counted under [`UNKNOWN`] (any valid name, with open sources).
pub(crate) fn known(config: &GatewayConfig, source: &Source) -> bool {
    config.open_sources || config.sources.contains_key(source)
}

/// Counts one ingest request and records its duration, if it has one (a request shed at the
/// edge has none: it was never handled).
///
/// `installed` says a recorder is in place (the gateway holds its handle): only then are
/// handles kept, because a handle taken before any recorder is installed records nothing,
/// and would go on recording nothing after one is.
pub(crate) fn ingest(installed: bool, source: &str, outcome: &'static str, took: Option<Duration>) {
    // Every outcome is in the list; were one missing, it would still be counted, below.
    if installed && let Some(slot) = OUTCOMES.iter().position(|o| *o == outcome) {
        let record = |m: &Meter| {
            m.outcomes[slot].increment(1);
            if let Some(took) = took {
                m.duration.record(took);
            }
        };
        // A poisoned lock still holds valid handles: a panic cannot leave the map half-updated.
        // Past the names kept, a new one is counted with the others under the read lock too:
        // a flood of names must not take the write lock once per request.
        let meters = METERS.read().unwrap_or_else(|e| e.into_inner());
        let kept = meters.get(source).or_else(|| {
            (meters.len() >= MOST_KEPT)
                .then(|| meters.get(OTHERS))
                .flatten()
        });
        if let Some(m) = kept {
            return record(m);
        }
        drop(meters);
        return record(&keep(&METERS, source, MOST_KEPT));
    }
    // No handles without the gateway's recorder (an embedder's own may be installed), but the
    // names are bounded alike: a series per name a client sends would grow without end.
    let source = named(&NAMED, source, MOST_KEPT);
    metrics::counter!(TOTAL, "source" => source.to_owned(), "outcome" => outcome).increment(1);
    if let Some(took) = took {
        metrics::histogram!(DURATION, "source" => source.to_owned()).record(took);
    }
}

/// The names counted under their own label where no handles are kept.
static NAMED: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(Default::default);

/// The label `source` is counted under: its own name among the first `most` seen, else
/// [`OTHERS`].
fn named<'a>(seen: &RwLock<HashSet<String>>, source: &'a str, most: usize) -> &'a str {
    let known = seen.read().unwrap_or_else(|e| e.into_inner());
    if known.contains(source) {
        return source;
    }
    if known.len() >= most {
        return OTHERS;
    }
    drop(known);
    let mut known = seen.write().unwrap_or_else(|e| e.into_inner());
    if known.len() >= most && !known.contains(source) {
        return OTHERS;
    }
    known.insert(source.to_owned());
    source
}

/// Makes and keeps the handles of `source` on its first request, or past `most` names those
/// of [`OTHERS`], all of them together: open sources take any name a local client sends, and
/// a series per name would grow `/metrics` without end.
fn keep(meters: &Meters, source: &str, most: usize) -> Arc<Meter> {
    let mut meters = meters.write().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = meters.get(source) {
        return m.clone();
    }
    let name = if meters.len() >= most { OTHERS } else { source };
    meters
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(Meter::new(name)))
        .clone()
}

/// Folds the recorder's histogram samples into their buckets and summaries every `every`, for
/// as long as it is polled (spawn it beside the server).
pub async fn upkeep(handle: PrometheusHandle, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::collections::HashSet;
    use std::sync::RwLock;

    use super::{Meters, OTHERS, keep, named};

    /// Names past the bound get no handles of their own: they share those of `OTHERS`. Names
    /// already kept keep theirs, the same ones each time.
    #[test]
    fn names_past_the_bound_are_counted_together() {
        let meters = Meters::default();
        let a = keep(&meters, "a", 2);
        let b = keep(&meters, "b", 2);
        assert!(!Arc::ptr_eq(&a, &b));
        let c = keep(&meters, "c", 2);
        let d = keep(&meters, "d", 2);
        assert!(Arc::ptr_eq(&c, &d), "c and d share handles");
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&a, &keep(&meters, "a", 2)), "a kept name found");
        let kept = meters.read().unwrap();
        assert_eq!(kept.len(), 3);
        assert!(kept.contains_key(OTHERS) && !kept.contains_key("c"));
    }

    /// Without handles (no recorder of the gateway's) the labels are bounded alike: an
    /// embedder's own recorder got a series per name a client sent.
    #[test]
    fn names_past_the_bound_share_one_label_without_handles_too() {
        let seen = RwLock::new(HashSet::new());
        assert_eq!(named(&seen, "a", 2), "a");
        assert_eq!(named(&seen, "b", 2), "b");
        assert_eq!(named(&seen, "c", 2), OTHERS);
        assert_eq!(named(&seen, "a", 2), "a", "a kept name stays its own");
        assert_eq!(seen.read().unwrap().len(), 2);
    }
}
