//! `oncebox bench`: load a running gateway with new and duplicate events, then check storage.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use oncebox_core::signature::sign;
use oncebox_core::{Clock, Source, SystemClock};
use oncebox_gateway::policy::{EventIdRule, SourcePolicy};
use serde_json::json;

use crate::client;
use crate::config::Settings;
use crate::exit;

mod report;

use report::{check, print_figures, stored_ids};

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
    /// Concurrent connections, one sender each.
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
}

/// What every sender shares.
struct Target {
    ingest_url: String,
    source: Source,
    policy: SourcePolicy,
}

/// One event as sent: the id the sender puts in headers, the id the gateway will store it
/// under (differs only for derived ids), and the body, resent unchanged by duplicates.
#[derive(Clone)]
struct Sent {
    id: String,
    stored_as: String,
    body: String,
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
    first_error: Option<String>,
}

pub async fn run(settings: &Settings, args: BenchArgs) -> Result<bool> {
    // Exit codes as the README's table has them: 2 for a flag that cannot work, 3 for a
    // source that is not configured.
    if args.connections == 0 || args.events == 0 {
        return Err(exit::usage("--connections and --events must be at least 1"));
    }
    if !(0.0..1.0).contains(&args.duplicates) {
        return Err(exit::usage(
            "--duplicates must be a share in [0, 1), e.g. 0.1",
        ));
    }
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
    reqwest::Client::new()
        .get(&probe)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .with_context(|| format!("GET {probe}: is `oncebox serve` running?"))?;

    let target = Arc::new(Target {
        ingest_url: format!("{base}/v1/sources/{source}/events"),
        source: source.clone(),
        policy: policy.clone(),
    });
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "oncebox bench: {} requests ({:.0}% duplicates) on {} connections to {base}, source {source}",
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
    let started = Instant::now();
    let senders: Vec<_> = (0..args.connections)
        .map(|c| {
            // The remainder goes to the first connections, one each.
            let n =
                args.events / args.connections + usize::from(c < args.events % args.connections);
            tokio::spawn(connection(
                target.clone(),
                n,
                args.duplicates,
                seed(c),
                bar.clone(),
            ))
        })
        .collect();
    let mut reports = Vec::with_capacity(senders.len());
    for s in senders {
        reports.push(s.await.context("a sender task failed")??);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let mut out = std::io::stdout().lock();
    print_figures(&mut out, &reports, elapsed)?;
    if args.no_check {
        writeln!(out, "invariant: not checked (--no-check)")?;
        return Ok(true);
    }
    let stored = stored_ids(&base, &target.source, token.as_deref()).await?;
    check(&mut out, &reports, &stored)
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

/// A per-connection seed, so connections pick different earlier ids to repeat.
fn seed(connection: usize) -> u64 {
    0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(connection as u64 + 1)
}

/// xorshift64: enough to pick which earlier id a duplicate repeats.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One connection: `n` requests in sequence, a `duplicates` share of them resending an id this
/// connection sent before, so a duplicate never races its original.
async fn connection(
    target: Arc<Target>,
    n: usize,
    duplicates: f64,
    mut rng: u64,
    bar: ProgressBar,
) -> Result<ConnectionReport> {
    // One pooled connection per sender: the connection count is exactly `--connections`.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let mut sent: Vec<Sent> = Vec::new();
    let mut report = ConnectionReport::default();
    let mut repeated = 0usize;
    for i in 0..n {
        // Duplicates are spread evenly: after i+1 requests, floor((i+1)·share) were repeats.
        let due = ((i + 1) as f64 * duplicates) as usize;
        let (class, event) = if repeated < due && !sent.is_empty() {
            repeated += 1;
            let pick = (next(&mut rng) % sent.len() as u64) as usize;
            (Class::Duplicate, sent[pick].clone())
        } else {
            let event = new_event(&target.policy)?;
            sent.push(event.clone());
            (Class::New, event)
        };
        let started = Instant::now();
        let answer = send(&client, &target, &event).await;
        let latency = started.elapsed();
        let state = report.keys.entry(event.stored_as.clone()).or_default();
        let status = match answer {
            Ok((status, replayed)) => {
                let success = (200..300).contains(&status);
                if success && !replayed && state.acked {
                    report.reaccepted.push(event.stored_as.clone());
                }
                state.acked |= success;
                // 503 may mean "commit outcome unknown" (DESIGN §4): the key may be stored.
                state.uncertain |= status == 503;
                Some(status)
            }
            Err(e) => {
                state.uncertain = true;
                report.first_error.get_or_insert_with(|| format!("{e:#}"));
                None
            }
        };
        report.outcomes.push(Outcome {
            class,
            status,
            latency,
        });
        bar.inc(1);
    }
    Ok(report)
}

/// A fresh UUIDv4 event, with the id wherever the source's rule looks for it.
fn new_event(policy: &SourcePolicy) -> Result<Sent> {
    let id = uuid::Uuid::new_v4().to_string();
    let mut doc = json!({
        "id": id,
        "type": "oncebox.bench",
        "amount": 1,
        "created": SystemClock.now().millis() / 1000,
    });
    client::place_id(&policy.event_id, &mut doc, &id);
    let body = doc.to_string();
    let stored_as = client::stored_id(&policy.event_id, &body, &id)?;
    Ok(Sent {
        id,
        stored_as,
        body,
    })
}

/// Posts one event, signed now (a sender's retry is signed again, with the same body).
async fn send(client: &reqwest::Client, target: &Target, event: &Sent) -> Result<(u16, bool)> {
    let policy = &target.policy;
    let mut request = client
        .post(&target.ingest_url)
        .header("content-type", "application/json")
        .body(event.body.clone());
    match &policy.event_id {
        EventIdRule::Header(name) => request = request.header(name.as_str(), event.id.as_str()),
        EventIdRule::Default => request = request.header("idempotency-key", event.id.as_str()),
        // Pointer and derived ids come from the body itself.
        _ => {}
    }
    if let Some(secret) = policy.secrets.first() {
        let now = SystemClock.now();
        for (name, value) in sign(
            &policy.scheme,
            secret,
            &event.id,
            now,
            event.body.as_bytes(),
        ) {
            request = request.header(name, value);
        }
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    // Read the body so the connection can carry the next request; the status already decided.
    let _ = response.bytes().await;
    Ok((status, replayed))
}
