//! The figures `oncebox bench` prints: requests, rates and latency percentiles, the open loop's
//! rates and late starts, the answers' statuses, and the verdict on the p99 budget.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

use super::open::LATE;
use super::{Class, ConnectionReport, Outcome};

/// The latency percentiles printed, by label.
const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

/// Prints the requests, their rate and their latencies (all, then new and duplicate events),
/// in the open loop the rate asked and achieved and the requests that started late, then the
/// answers' statuses. Returns the p99 latency of all requests.
pub(super) fn print_figures(
    out: &mut impl Write,
    reports: &[ConnectionReport],
    elapsed: Duration,
    rate: Option<f64>,
) -> Result<Duration> {
    let secs = elapsed.as_secs_f64().max(f64::EPSILON);
    let all: Vec<&Outcome> = reports.iter().flat_map(|r| &r.outcomes).collect();
    writeln!(out, "elapsed {secs:.2} s")?;
    write!(out, "{:<11} {:>8} {:>8}", "", "requests", "req/s")?;
    for (label, _) in QUANTILES {
        write!(out, " {:>9}", format!("{label} ms"))?;
    }
    writeln!(out, " {:>9}", "max ms")?;
    let mut p99 = Duration::ZERO;
    for (label, class) in [
        ("all", None),
        ("new", Some(Class::New)),
        ("duplicates", Some(Class::Duplicate)),
    ] {
        let latencies = histogram(all.iter().filter(|o| class.is_none_or(|c| o.class == c)))?;
        let n = latencies.len();
        write!(out, "{label:<11} {n:>8} {:>8.0}", n as f64 / secs)?;
        if n == 0 {
            // No latency to tell; a row of zeros would read as a measurement.
            writeln!(out)?;
            continue;
        }
        for (_, q) in QUANTILES {
            write!(out, " {:>9.2}", ms(latencies.value_at_quantile(q)))?;
        }
        writeln!(out, " {:>9.2}", ms(latencies.max()))?;
        if class.is_none() {
            p99 = Duration::from_nanos(latencies.value_at_quantile(0.99));
        }
    }
    if let Some(rate) = rate {
        writeln!(
            out,
            "rate asked {rate} req/s, achieved {:.0} req/s",
            all.len() as f64 / secs
        )?;
        let late: usize = reports.iter().map(|r| r.late).sum();
        writeln!(
            out,
            "late starts {late} of {} (due while every connection was busy, started more than {} ms late)",
            all.len(),
            LATE.as_millis()
        )?;
        let lagged: usize = reports.iter().map(|r| r.lagged).sum();
        if lagged > 0 {
            writeln!(
                out,
                "note: {lagged} more started that late with a connection free: this process was \
                 short of CPU, and the latencies overstate the gateway's"
            )?;
        }
    }
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for o in &all {
        let name = o
            .status
            .map_or_else(|| "no answer".to_owned(), |s| s.to_string());
        *statuses.entry(name).or_default() += 1;
    }
    let statuses: Vec<String> = statuses.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    writeln!(out, "status {}", statuses.join(", "))?;
    if let Some(e) = reports.iter().find_map(|r| r.first_error.as_ref()) {
        writeln!(out, "first error: {e}")?;
    }
    Ok(p99)
}

/// The latencies in nanoseconds, to three significant digits (0.1%) at every scale.
fn histogram<'a>(outcomes: impl Iterator<Item = &'a &'a Outcome>) -> Result<Histogram<u64>> {
    // Grows to whatever latency comes: in the open loop a request's wait has no fixed bound.
    let mut h = Histogram::new(3).context("creating the latency histogram")?;
    for o in outcomes {
        let nanos = u64::try_from(o.latency.as_nanos()).unwrap_or(u64::MAX);
        h.record(nanos).context("recording a latency")?;
    }
    Ok(h)
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

/// A latency as printed: milliseconds with two decimals.
pub(super) fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Judges the p99 of all requests against `--p99-max`, naming the figure when it breaks it.
pub(super) fn within_budget(out: &mut impl Write, p99: Duration, max: Duration) -> Result<bool> {
    let max_said = humantime::format_duration(max);
    if p99 > max {
        writeln!(
            out,
            "budget: p99 {} is above --p99-max {max_said}",
            millis(p99)
        )?;
        return Ok(false);
    }
    writeln!(
        out,
        "budget: ok, p99 {} within --p99-max {max_said}",
        millis(p99)
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One connection whose `n` requests took 1, 2, … `n` ms.
    fn timed(n: u64) -> ConnectionReport {
        let outcomes = (1..=n)
            .map(|ms| Outcome {
                class: Class::New,
                status: Some(202),
                latency: Duration::from_millis(ms),
            })
            .collect();
        ConnectionReport {
            outcomes,
            ..ConnectionReport::default()
        }
    }

    fn figures(reports: &[ConnectionReport], rate: Option<f64>) -> (Duration, String) {
        let mut out = Vec::new();
        let p99 = print_figures(&mut out, reports, Duration::from_secs(2), rate).unwrap();
        (p99, String::from_utf8(out).unwrap())
    }

    /// The numbers of the row starting with `label`.
    fn row(printed: &str, label: &str) -> Vec<f64> {
        let line = printed.lines().find(|l| l.starts_with(label)).unwrap();
        line.split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect()
    }

    #[test]
    fn figures_give_p50_p90_p99_p999_and_max() {
        let (p99, printed) = figures(&[timed(1000)], None);
        let header = printed.lines().nth(1).unwrap();
        for column in [
            "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms",
        ] {
            assert!(header.contains(column), "{column} in {printed}");
        }
        let all = row(&printed, "all ");
        let expected = [1000.0, 500.0, 500.0, 900.0, 990.0, 999.0, 1000.0];
        assert_eq!(all.len(), expected.len(), "{printed}");
        for (got, want) in all.iter().zip(expected) {
            // The histogram keeps three significant digits.
            assert!(
                (got - want).abs() <= want * 0.001,
                "{got} vs {want}: {printed}"
            );
        }
        assert!(p99.abs_diff(Duration::from_millis(990)) <= Duration::from_millis(1));
        // No duplicates were sent: their row has counts and no latencies.
        assert_eq!(row(&printed, "duplicates "), [0.0, 0.0], "{printed}");
        assert!(!printed.contains("rate asked"), "{printed}");
    }

    #[test]
    fn the_open_loop_tells_the_rate_asked_and_achieved_and_the_late_starts() {
        let mut report = timed(1000);
        report.late = 3;
        report.lagged = 2;
        let (_, printed) = figures(&[report], Some(600.0));
        for line in [
            "rate asked 600 req/s, achieved 500 req/s",
            "late starts 3 of 1000 (due while every connection was busy",
            "note: 2 more started that late with a connection free",
        ] {
            assert!(printed.contains(line), "{line:?} in {printed}");
        }
    }

    #[test]
    fn a_p99_above_the_budget_is_named() {
        let mut out = Vec::new();
        let p99 = Duration::from_millis(12);
        assert!(!within_budget(&mut out, p99, Duration::from_millis(10)).unwrap());
        assert!(within_budget(&mut out, p99, Duration::from_secs(10)).unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "budget: p99 12.00 ms is above --p99-max 10ms\n\
             budget: ok, p99 12.00 ms within --p99-max 10s\n"
        );
    }
}
