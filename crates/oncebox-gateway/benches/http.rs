//! HTTP ingest benchmark: the gateway on SQLite against a trivial axum handler, side by side.
//!
//! `cargo bench -p oncebox-gateway --bench http` (options: `-- --requests N --connections N
//! --warmup N --preload N --rounds N`; with `ONCEBOX_POSTGRES_URL` set, the gateway on
//! PostgreSQL too).
//! One process serves both targets on their own loopback listeners with `oncebox_gateway::serve`:
//! (a) the baseline, an axum route that parses the JSON body and answers 202 without storing;
//! (b) the real router over `oncebox_sqlite::Inbox` (WAL, `synchronous=FULL`, on disk under
//! `target/`) in zero-config mode (signature `none`, id from `Idempotency-Key`). The same load
//! generator drives both: a warm-up, then phase by phase new events only, duplicates only
//! (every id of the new phase again) and a mix with 10% duplicates. The inbox first gets
//! `--preload` earlier events (default 1 000 000, as the storage bench does: a real inbox holds
//! days of events). In the new-event phase the storage library's own ceiling is measured in the
//! same run: as many callers as connections calling `EventStore::ingest` on the same inbox,
//! without HTTP. Each phase runs in `--rounds` (default 5) rounds with the targets taking turns,
//! and the ratios are the median of the rounds' ratios: a shared machine's speed drifts during a
//! run, and a target measured alone in a fast minute would skew its ratio. Each round starts once
//! the log the last one wrote is copied back, and with a PostgreSQL target once its server has
//! written its dirty buffers out (`settle::Settle`). Prints requests/s,
//! p50/p99 latency, CPU per request, the writer's commits, the disk's writes (on Linux) and the
//! ratios; asserts nothing about time.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use oncebox_core::SystemClock;
use oncebox_gateway::policy::{GatewayConfig, Limits};
use oncebox_gateway::{Gateway, router, serve};
use oncebox_sqlite::{Inbox, Options};
use tokio::runtime::Runtime;

#[path = "http/baseline.rs"]
mod baseline;
#[path = "http/drive.rs"]
mod drive;
#[path = "http/measure.rs"]
mod measure;
#[path = "http/settle.rs"]
mod settle;
#[path = "http/verdict.rs"]
mod verdict;

use drive::{clients, drive, drive_library, load, preload};
use measure::{Disk, Mark, Tally, chunk, cpu};
use settle::Settle;

/// The allocator `oncebox serve` runs with, so both targets are measured as shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A served router; dropping `stop` shuts it down.
struct Server {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn start(rt: &Runtime, app: Router) -> Server {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("local addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(serve(listener, app, Limits::default(), async {
        let _ = stopped.await;
    }));
    Server {
        url: format!("http://{addr}/v1/sources/bench/events"),
        stop,
        task,
    }
}

fn main() {
    // Each round ends when the last connection has sent its share, and the rounds' tails run
    // below full concurrency; at 20 000 requests per phase (4 000 a round) that cost the
    // baseline, which finishes a round in about 60 ms, 5–15% of its rate and the gateway less,
    // so the ratios read 5 points too high. From 100 000 on the baseline's rate is steady.
    let requests = oncebox_testkit::bench_arg("--requests", 100_000);
    let connections = oncebox_testkit::bench_arg("--connections", 64).max(1);
    let warmup = oncebox_testkit::bench_arg("--warmup", 2_000);
    let preloaded = oncebox_testkit::bench_arg("--preload", 1_000_000);
    let rounds = oncebox_testkit::bench_arg("--rounds", 5).max(1);
    let base = std::env::var_os("ONCEBOX_BENCH_DIR")
        .map_or_else(|| Path::new("target").to_path_buf(), Into::into);
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("tempdir");

    // The servers get a runtime like `oncebox serve`'s (one worker per core); the load
    // generator gets its own, as if it were another process: the two share the cores only
    // through the OS scheduler, not through one task queue.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("server")
        .build()
        .expect("server runtime");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("load")
        .build()
        .expect("client runtime");

    let inbox = Inbox::open(Options::new(dir.path().join("gateway.db"))).expect("open inbox");
    let disk = Disk::stat_file(dir.path());
    let loading = Instant::now();
    preload(&inbox, preloaded);
    println!(
        "preloaded {preloaded} earlier events in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    // As `oncebox serve` does: metrics are recorded on every request.
    let metrics = oncebox_gateway::meter::recorder()
        .install_recorder()
        .expect("metrics recorder");
    // ...and its histogram samples are folded in on a timer, as `oncebox serve` does.
    server_rt.spawn(oncebox_gateway::meter::upkeep(
        metrics.clone(),
        oncebox_gateway::meter::UPKEEP_EVERY,
    ));
    let gateway = Arc::new(Gateway {
        store: inbox.clone(),
        config: GatewayConfig {
            open_sources: true,
            ..GatewayConfig::default()
        },
        clock: Arc::new(SystemClock),
        metrics: Some(metrics),
        loopback_only: true,
        logouts: Default::default(),
    });
    let mut servers = vec![
        ("baseline", start(&server_rt, baseline::router())),
        ("gateway", start(&server_rt, router(gateway.clone()))),
    ];
    // The same gateway on PostgreSQL, in a fresh schema, when a server is named.
    let mut pg_pool = None;
    if let Ok(url) = std::env::var("ONCEBOX_POSTGRES_URL") {
        let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let pg = server_rt
            .block_on(oncebox_postgres::Inbox::open(
                oncebox_postgres::Options::new(url).schema(schema),
            ))
            .expect("open PostgreSQL");
        pg_pool = Some(pg.pool().clone());
        let on_pg = Arc::new(Gateway {
            store: pg,
            config: gateway.config.clone(),
            clock: Arc::new(SystemClock),
            metrics: None,
            loopback_only: true,
            logouts: Default::default(),
        });
        servers.push(("gateway-pg", start(&server_rt, router(on_pg))));
    }

    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "http ingest: {connections} connections, {requests} requests per phase, UUIDv4 ids, \
         POST /v1/sources/bench/events, signature none"
    );
    println!(
        "  baseline: axum handler parsing the JSON, 202, nothing stored; gateway: oncebox router, \
         SQLite WAL synchronous=FULL on disk ({})",
        base.display()
    );
    println!(
        "  {cpus} CPUs: the load generator runs in this process and competes with the servers \
         (and with SQLite's writer thread) for them; writer and checkpointer on CPUs {:?}",
        oncebox_testkit::thread_cpus("oncebox-writer")
    );

    // Per target: its clients, and its own ids (the gateway stores them; duplicates resend them).
    let targets: Vec<_> = servers
        .iter()
        .map(|(name, server)| {
            let clients = client_rt.block_on(async { clients(connections) });
            let warm = load(warmup, connections, false);
            client_rt.block_on(drive(&clients, &server.url, &warm));
            (*name, server, clients, load(requests, connections, false))
        })
        .collect();

    // Each phase runs in rounds, the targets taking turns, so that a change in the machine's
    // speed during the run (a shared VM's CPUs vary by a factor of two from minute to minute)
    // weighs on all targets alike; ratios are the median of the rounds' ratios.
    let mut settle = Settle::open(&dir.path().join("gateway.db"));
    if let Some(pool) = pg_pool {
        settle = settle.with_postgres(server_rt.handle().clone(), pool);
    }
    let mut tallies: BTreeMap<(&str, &str), Tally> = BTreeMap::new();
    let phases: [(&str, &str); 3] = [
        ("new", "new events only"),
        ("dup", "duplicates only (every id of the new phase again)"),
        ("mixed", "mixed, 10% duplicates"),
    ];
    for (phase, title) in phases {
        println!("{title} ({rounds} rounds, targets taking turns):");
        let mixed = load(requests, connections, true);
        let library = load(requests, connections, false);
        let mut names: Vec<&str> = targets.iter().map(|t| t.0).collect();
        if phase == "new" {
            names.push("library");
        }
        for round in 0..rounds {
            for (name, server, clients, fresh) in &targets {
                // "new" and "dup" send the same ids: new the first time, duplicates the second.
                let sent = chunk(if phase == "mixed" { &mixed } else { fresh }, round, rounds);
                settle.wait();
                let (mark, before, io) = (Mark::of(&inbox), cpu(), Disk::of(disk.as_deref()));
                let run = client_rt.block_on(drive(clients, &server.url, &sent));
                tallies.entry((phase, name)).or_default().add(
                    run,
                    cpu().minus(before),
                    mark.since(&inbox),
                    io.and_then(|io| io.since(disk.as_deref())),
                );
            }
            if phase == "new" {
                let sent = chunk(&library, round, rounds);
                settle.wait();
                let (mark, before, io) = (Mark::of(&inbox), cpu(), Disk::of(disk.as_deref()));
                let run = client_rt.block_on(drive_library(&inbox, &sent));
                tallies.entry((phase, "library")).or_default().add(
                    run,
                    cpu().minus(before),
                    mark.since(&inbox),
                    io.and_then(|io| io.since(disk.as_deref())),
                );
            }
        }
        for name in names {
            tallies[&(phase, name)].print(name);
        }
    }
    verdict::report(&tallies);

    for (_, server) in servers {
        let _ = server.stop.send(());
        server_rt
            .block_on(server.task)
            .expect("server task")
            .expect("serve");
    }
}
