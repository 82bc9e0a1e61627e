//! `oncebox bench`: load a running gateway with new and duplicate events, as fast as answers come
//! or on a schedule (`--rate`), then judge the latency budget and check storage.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use oncebox_core::{Clock, Source, SystemClock};
use oncebox_gateway::policy::SourcePolicy;

use crate::client;
use crate::config::Settings;
use crate::exit;

mod connection;
mod figures;
mod open;
mod report;

use connection::Connection;
use figures::{print_figures, within_budget};
use open::Schedule;
use report::{check, stored_ids};

/// Largest page `GET /v1/events` returns.
const PAGE: usize = 500;
/// A request that takes longer is counted as unanswered (its outcome is unknown).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How many differing keys the invariant report names, per kind of difference.
const SHOWN: usize = 10;

/// Options of `oncebox bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Gateway base URL [default: http://<listen>]
    #[arg(long)]
    pub url: Option<String>,
    /// Source to send to [default: a fresh `bench-<millis>` in zero-config mode]. With configured
    /// sources it must name one; its scheme and first secret sign every request.
    #[arg(long)]
    pub source: Option<String>,
    /// Concurrent connections, one sender each; with --rate, the most requests in flight.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Requests to send in all, duplicates included.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Share of requests that resend an id the same connection already sent (same body).
    #[arg(long, default_value_t = 0.1)]
    pub duplicates: f64,
    /// Bearer token of the admin API, for the final listing [default: the configured admin_token]
    #[arg(long)]
    pub admin_token: Option<String>,
    /// Print the figures only: no final listing and invariant check, for a target that is not
    /// an oncebox gateway (a bare server measured for comparison stores nothing to list).
    #[arg(long)]
    pub no_check: bool,
    /// Open loop: requests fall due at this many per second (request i at i/rate seconds after
    /// the start), however fast the answers come; --connections caps how many are in flight,
    /// and a request due while every connection is busy waits for one. Its latency runs from
    /// its due time, not from when it went out, so the wait counts: that is what a sender with
    /// a timeout sees. Without it, the closed loop: each connection sends its next request when
    /// the last is answered, and its latencies leave out the queueing a slow gateway causes.
    #[arg(long, allow_negative_numbers = true)]
    pub rate: Option<f64>,
    /// Latency budget: when the p99 of all requests is above it (e.g. 10s, GitHub's timeout, or
    /// 250ms), the run is refused with exit code 5. Pair it with --rate: the closed loop's p99
    /// leaves the queueing out.
    // A value starting with '-' is taken as one, so that "-1s" is refused as a duration rather
    // than as a stray flag that names neither.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = crate::config::parse_duration,
        allow_hyphen_values = true
    )]
    pub p99_max: Option<Duration>,
}

/// What every sender shares.
struct Target {
    ingest_url: String,
    source: Source,
    policy: SourcePolicy,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    New,
    Duplicate,
}

/// The answer to one request; `status` is `None` when none came (connection error, timeout).
struct Outcome {
    class: Class,
    status: Option<u16>,
    latency: Duration,
}

/// What the gateway told one connection about each of its keys.
#[derive(Default)]
struct KeyState {
    /// Some request for the key was answered 2xx: it must be stored.
    acked: bool,
    /// Some request for the key got no answer or a 503: it may or may not be stored.
    uncertain: bool,
}

#[derive(Default)]
struct ConnectionReport {
    outcomes: Vec<Outcome>,
    keys: HashMap<String, KeyState>,
    /// Keys answered 2xx without `Idempotent-Replayed` after an earlier 2xx: accepted twice.
    reaccepted: Vec<String>,
    /// Keys answered 2xx and then, sent again unchanged, refused with a definite status (not
    /// 503 or 429, which overload answers): a resend must be replayed (DESIGN §4).
    refused_again: Vec<String>,
    first_error: Option<String>,
    /// Open loop: requests that fell due while every connection was busy, and so started more
    /// than [`open::LATE`] after their due time.
    late: usize,
    /// Open loop: requests that started that late although a connection was free: this
    /// process itself was slow to send them.
    lagged: usize,
}

/// The most connections one load generator opens.
const MAX_CONNECTIONS: usize = 10_000;

pub async fn run(settings: &Settings, args: BenchArgs) -> Result<bool> {
    // Exit codes as the README's table has them: 2 for a flag that cannot work, 3 for a
    // source that is not configured.
    if args.connections == 0 || args.events == 0 {
        return Err(exit::usage("--connections and --events must be at least 1"));
    }
    // Each connection is a client of its own, built before the first request: a count no
    // machine's file descriptors could hold would only eat memory for minutes first.
    if args.connections > MAX_CONNECTIONS {
        return Err(exit::usage(format!(
            "--connections must be at most {MAX_CONNECTIONS}"
        )));
    }
    if !(0.0..1.0).contains(&args.duplicates) {
        return Err(exit::usage(
            "--duplicates must be a share in [0, 1), e.g. 0.1",
        ));
    }
    let schedule = args
        .rate
        .map(|rate| Schedule::new(rate, args.events))
        .transpose()?;
    let source = match &args.source {
        Some(name) => Source::new(name.as_str()).context("--source")?,
        None if settings.gateway.open_sources => {
            Source::new(format!("bench-{}", SystemClock.now().millis()))?
        }
        None => {
            return Err(exit::usage(format!(
                "--source is required with configured sources (one of: {})",
                names(settings)
            )));
        }
    };
    let Some(policy) = settings.gateway.source(&source) else {
        return Err(exit::not_found(format!(
            "no source {:?} in the configuration (one of: {})",
            source.as_str(),
            names(settings)
        )));
    };
    let base = client::gateway_base(args.url.as_deref(), settings)?;
    let token = args
        .admin_token
        .clone()
        .or_else(|| settings.gateway.admin_token.clone());
    // Fail in a second, not after a full run of refused connections.
    let probe = format!("{base}/healthz");
    // Printed redacted: `--url` may carry credentials (`http://user:token@host`).
    let shown = crate::config::redact_url(&base);
    client::http()
        .build()
        .context("building the HTTP client")?
        .get(&probe)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(reqwest::Error::without_url)
        .with_context(|| format!("GET {shown}/healthz: is `oncebox serve` running?"))?;

    let target = Arc::new(Target {
        ingest_url: format!("{base}/v1/sources/{source}/events"),
        source: source.clone(),
        policy: policy.clone(),
    });
    let mut out = crate::out::stdout();
    let mode = match &schedule {
        Some(s) => format!("open loop at {} req/s, at most", s.rate()),
        None => "closed loop,".to_owned(),
    };
    writeln!(
        out,
        "oncebox bench: {} requests ({:.0}% duplicates), {mode} {} connections to {shown}, source {source}",
        args.events,
        args.duplicates * 100.0,
        args.connections
    )?;
    drop(out);

    let bar = ProgressBar::new(args.events as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // Clients are built before the clock starts: each loads the system's root certificates,
    // which would otherwise make the first requests of the schedule late.
    let connections = (0..args.connections)
        .map(|c| Connection::new(target.clone(), args.duplicates, c))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let reports = match schedule {
        Some(schedule) => open::run(connections, schedule, &bar).await?,
        None => closed_loop(connections, args.events, &bar).await?,
    };
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let mut out = crate::out::stdout();
    let p99 = print_figures(&mut out, &reports, elapsed, schedule.map(|s| s.rate()))?;
    // The budget is judged first and the invariant still checked: a slow run can also be wrong.
    let over_budget = match args.p99_max {
        Some(max) if !within_budget(&mut out, p99, max)? => Some(max),
        _ => None,
    };
    let ok = if args.no_check {
        writeln!(out, "invariant: not checked (--no-check)")?;
        true
    } else {
        let stored = stored_ids(&base, &target.source, token.as_deref()).await?;
        check(&mut out, &reports, &stored)?
    };
    // With nothing accepted the invariant holds of nothing, and the latencies are those of
    // refusals: a run against a source the gateway does not have, or with a wrong secret,
    // measured nothing.
    let accepted = reports
        .iter()
        .flat_map(|r| r.keys.values())
        .any(|k| k.acked);
    if !accepted {
        return Err(exit::refused(
            "no request was accepted (2xx): the statuses above say why (404: a source the \
             gateway does not have, 401: another secret, 503: the store or the limit)",
        ));
    }
    if let Some(max) = over_budget {
        return Err(exit::refused(format!(
            "p99 latency {} is above --p99-max {}{}",
            figures::millis(p99),
            humantime::format_duration(max),
            if ok {
                ""
            } else {
                ", and the invariant check failed"
            }
        )));
    }
    Ok(ok)
}

/// The closed loop: each connection sends its share of the requests one after another, the
/// next as soon as the last is answered.
async fn closed_loop(
    connections: Vec<Connection>,
    events: usize,
    bar: &ProgressBar,
) -> Result<Vec<ConnectionReport>> {
    let count = connections.len();
    let senders: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(c, mut connection)| {
            // The remainder goes to the first connections, one each.
            let n = events / count + usize::from(c < events % count);
            let bar = bar.clone();
            tokio::spawn(async move {
                for _ in 0..n {
                    let (class, event) = connection.next_event()?;
                    connection.send(class, &event, Instant::now()).await;
                    bar.inc(1);
                }
                anyhow::Ok(connection.report)
            })
        })
        .collect();
    let mut reports = Vec::with_capacity(senders.len());
    for s in senders {
        reports.push(s.await.context("a sender task failed")??);
    }
    Ok(reports)
}

fn names(settings: &Settings) -> String {
    let names: Vec<&str> = settings
        .gateway
        .sources
        .keys()
        .map(Source::as_str)
        .collect();
    names.join(", ")
}
