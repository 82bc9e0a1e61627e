//! The table of figures: one row per scenario, run one after another (the machine's cores go
//! to the system under test), a panic or a broken figure marking the row FAILED. The columns
//! are TESTING.md's figures — D, L, F, P and U must be 0, C is shown `detected/injected` and
//! must be equal — and beside them, under its own name, what the run left unresolved against
//! what the scenario parks on purpose.

use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use oncebox_testkit::checker::Figures;

/// One scenario of the table.
pub struct Scenario {
    pub name: &'static str,
    pub backend: &'static str,
    /// Runs it; `None` when the service it needs is absent (a skip, printed as such).
    pub run: fn() -> Option<Report>,
}

/// What a scenario reports.
pub struct Report {
    pub figures: Figures,
    /// How many times its fault happened; zero makes the run inconclusive, which fails.
    pub exercised: u64,
    /// What was counted, e.g. `3 kills, 41 unanswered`.
    pub what: String,
    /// What the scenario leaves unresolved on purpose (deliveries parked as uncertain).
    pub expected_unresolved: usize,
}

/// What a row shows of a scenario's figures.
struct Shown {
    /// D L F P C U findings; C's is only used to mark the cell.
    counts: [usize; 6],
    /// C as `detected/injected`.
    conflicts: String,
    unresolved: usize,
    expected_unresolved: usize,
}

pub struct Row {
    name: &'static str,
    backend: &'static str,
    figures: Option<Shown>,
    exercised: String,
    took: Duration,
    verdict: Verdict,
}

enum Verdict {
    Passed,
    Skipped,
    Failed(String),
}

impl Row {
    pub fn failed(&self) -> bool {
        matches!(self.verdict, Verdict::Failed(_))
    }
}

/// Runs one scenario on a thread of its own and turns its report, skip or panic into a row.
pub fn run(s: &Scenario) -> Row {
    eprintln!("faults: {} [{}] ...", s.name, s.backend);
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(s.run));
    let took = started.elapsed();
    let (figures, exercised, verdict) = match outcome {
        Ok(None) => (None, "-".to_owned(), Verdict::Skipped),
        Ok(Some(r)) => {
            let verdict = if !r.figures.clean(r.expected_unresolved) {
                Verdict::Failed(format!(
                    "expected D L F P U = 0, C detected = injected and {} unresolved: {}",
                    r.expected_unresolved, r.figures
                ))
            } else if r.exercised == 0 {
                Verdict::Failed(format!(
                    "inconclusive: the fault never happened ({})",
                    r.what
                ))
            } else {
                Verdict::Passed
            };
            let shown = Shown {
                counts: r.figures.counts(),
                conflicts: r.figures.conflicts(),
                unresolved: r.figures.unresolved.len(),
                expected_unresolved: r.expected_unresolved,
            };
            (
                Some(shown),
                format!("{} ({})", r.exercised, r.what),
                verdict,
            )
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panic".to_owned());
            (None, "-".to_owned(), Verdict::Failed(why))
        }
    };
    let row = Row {
        name: s.name,
        backend: s.backend,
        figures,
        exercised,
        took,
        verdict,
    };
    if let Verdict::Failed(why) = &row.verdict {
        eprintln!("faults: {} [{}] FAILED: {why}", s.name, s.backend);
    }
    record(&row);
    row
}

fn line(r: &Row) -> String {
    let (figures, unresolved) = r.figures.as_ref().map_or_else(
        || ("-  -  -  -  -      -".to_owned(), "-".to_owned()),
        |s| {
            let [d, l, f, p, c, u] = s.counts;
            // `!`: answers where detected and injected part, even if the totals agree.
            let mark = if c == 0 { "" } else { "!" };
            (
                format!(
                    "{d}  {l}  {f}  {p}  {:<6} {u}",
                    format!("{}{mark}", s.conflicts)
                ),
                format!("{}/{}", s.unresolved, s.expected_unresolved),
            )
        },
    );
    let verdict = match &r.verdict {
        Verdict::Passed => "ok",
        Verdict::Skipped => "SKIPPED",
        Verdict::Failed(_) => "FAILED",
    };
    format!(
        "{:<34} | {:<8} | {:<21} | {:<10} | {:>5.1}s | {:<7} | {}",
        r.name,
        r.backend,
        figures,
        unresolved,
        r.took.as_secs_f64(),
        verdict,
        r.exercised
    )
}

/// Appends the row to the table file as it finishes, so a run cut short still leaves the rows
/// it made.
fn record(r: &Row) {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults-table.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "FAULTS|{}", line(r));
    }
}

/// Prints the whole table on stdout.
pub fn print(rows: &[Row], took: Duration) {
    let mut out = std::io::stdout().lock();
    let header = format!(
        "{:<34} | {:<8} | {:<21} | {:<10} | {:>6} | {:<7} | exercised",
        "scenario", "backend", "D  L  F  P  C      U", "unresolved", "time", "verdict"
    );
    let _ = writeln!(
        out,
        "\nD L F P U must be 0 and C (conflicts detected/injected) equal, as in TESTING.md; \
         unresolved is left/parked on purpose.\n{header}\n{}",
        "-".repeat(header.len() + 20)
    );
    for r in rows {
        let _ = writeln!(out, "{}", line(r));
    }
    let failed = rows.iter().filter(|r| r.failed()).count();
    let skipped = rows
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Skipped))
        .count();
    let _ = writeln!(
        out,
        "{} scenarios, {failed} failed, {skipped} skipped, {:.0} s\n",
        rows.len(),
        took.as_secs_f64()
    );
}

/// The command line, read as libtest reads its own (cargo passes the same words to every test
/// binary): words filter scenarios by substring (`--exact`: by name), `--skip` words exclude
/// them, and `--ignored` selects none, as no scenario is an ignored test. libtest's other
/// options are accepted and have no effect here.
pub struct Args {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
    ignored: bool,
    pub list: bool,
}

impl Args {
    pub fn parse() -> Args {
        let mut args = Args {
            filters: Vec::new(),
            skips: Vec::new(),
            exact: false,
            ignored: false,
            list: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--list" => args.list = true,
                "--exact" => args.exact = true,
                "--ignored" => args.ignored = true,
                "--skip" => args.skips.extend(it.next()),
                // Options of libtest that take a value as the next word.
                "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => {
                    it.next();
                }
                other if other.starts_with('-') => {}
                other => args.filters.push(other.to_owned()),
            }
        }
        args
    }

    pub fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        !self.ignored
            && (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skips.iter().any(matches)
    }
}

/// `ONCEBOX_SOAK=1` multiplies a scenario's iterations by ten.
pub fn scale(n: usize) -> usize {
    if std::env::var("ONCEBOX_SOAK").is_ok_and(|v| v == "1") {
        n * 10
    } else {
        n
    }
}
