//! The benchmark's closing lines: the ratios of the rounds, their spread and the verdicts.

use std::collections::BTreeMap;

use crate::measure::Tally;

/// Targets of the issue: gateway/baseline for new events and for duplicates.
const TARGET_NEW: f64 = 0.50;
const TARGET_DUPLICATES: f64 = 0.70;
/// The alternative for new events when the storage itself is slower than half the
/// baseline: the gateway reaches this share of the library's own ceiling.
const TARGET_OF_CEILING: f64 = 0.80;

/// Prints the ratios of the phases in `tallies` (by phase and target) and whether the targets
/// were met.
pub fn report(tallies: &BTreeMap<(&str, &str), Tally>) {
    // The rounds' ratios of `a` to `b`, sorted.
    let round_ratios = |phase: &str, a: &str, b: &str| {
        let (a, b) = (&tallies[&(phase, a)].rates, &tallies[&(phase, b)].rates);
        let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    };
    let median_ratio = |phase: &str, a: &str, b: &str| {
        let ratios = round_ratios(phase, a, b);
        ratios.get(ratios.len() / 2).copied().unwrap_or(0.0)
    };
    let rates: BTreeMap<(&str, &str), f64> =
        tallies.iter().map(|(k, t)| (*k, t.run.rate())).collect();

    let ratio = |phase: &str| median_ratio(phase, "gateway", "baseline");
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let (new, dup, mixed) = (ratio("new"), ratio("dup"), ratio("mixed"));
    let ceiling = rates[&("new", "library")];
    let ceiling_share = median_ratio("new", "library", "baseline");
    let of_ceiling = median_ratio("new", "gateway", "library");
    let below = ceiling_share < TARGET_NEW;
    println!(
        "ratios gateway/baseline (median of the rounds): new events {:.0}%, duplicates {:.0}% \
         (target >= {:.0}%: {}), mixed {:.0}%",
        100.0 * new,
        100.0 * dup,
        100.0 * TARGET_DUPLICATES,
        verdict(dup >= TARGET_DUPLICATES),
        100.0 * mixed
    );
    // On a shared machine one run's verdict can turn on a single slow minute: the spread
    // of the rounds and the whole phases' ratio say how close to the line it was.
    let spread = |phase: &str| {
        let ratios = round_ratios(phase, "gateway", "baseline");
        let (low, high) = (ratios.first(), ratios.last());
        let whole = rates[&(phase, "gateway")] / rates[&(phase, "baseline")];
        format!(
            "{:.0}–{:.0}% (whole phase {:.0}%)",
            100.0 * low.copied().unwrap_or(0.0),
            100.0 * high.copied().unwrap_or(0.0),
            100.0 * whole
        )
    };
    println!(
        "  rounds' ratios: new events {}, duplicates {}, mixed {}",
        spread("new"),
        spread("dup"),
        spread("mixed")
    );
    println!(
        "new events: the storage library's own ceiling is {ceiling:.0}/s = {:.0}% of the baseline; \
         gateway/ceiling {:.0}%",
        100.0 * ceiling_share,
        100.0 * of_ceiling
    );
    println!(
        "new-event target (>= {:.0}% of the baseline, or >= {:.0}% of the library's ceiling where \
         that ceiling is below {:.0}% of the baseline): {}",
        100.0 * TARGET_NEW,
        100.0 * TARGET_OF_CEILING,
        100.0 * TARGET_NEW,
        verdict(new >= TARGET_NEW || (below && of_ceiling >= TARGET_OF_CEILING))
    );
    if rates.contains_key(&("new", "gateway-pg")) {
        let pg = |phase: &str| median_ratio(phase, "gateway-pg", "gateway");
        println!(
            "gateway on PostgreSQL / on SQLite: new {:.0}%, duplicates {:.0}%, mixed {:.0}%",
            100.0 * pg("new"),
            100.0 * pg("dup"),
            100.0 * pg("mixed")
        );
    }
}
