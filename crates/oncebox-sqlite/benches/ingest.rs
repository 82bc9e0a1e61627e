//! Ingest benchmark: the naive transaction-per-event inbox, oncebox's group commit and a raw
//! batched INSERT ceiling, side by side in one run, with ratios.
//!
//! `cargo bench -p oncebox-sqlite --bench ingest` (options: `-- --events N --producers N
//! --preload N --naive-events N`).
//! Every mode: `synchronous=FULL`, WAL, 32 producers, 10% duplicates, UUIDv4 event ids, a
//! trivial effect (`UPDATE accounts`). Prints events/s and ratios; asserts nothing about time.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::path::Path;
use std::time::Instant;

use oncebox_core::{Event, Key, Processed, Response};
use oncebox_sqlite::rusqlite::{Connection, params};
use oncebox_sqlite::{Inbox, Options};

const PRAGMAS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;";
const SETUP: &str =
    "CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
    INSERT OR IGNORE INTO accounts VALUES (1, 0);";

struct Load {
    /// Per producer, its events in order; 10% repeat an earlier id of the same producer.
    per_producer: Vec<Vec<(String, Vec<u8>)>>,
    unique: usize,
}

fn load(events: usize, producers: usize) -> Load {
    let per = events / producers;
    let mut unique = 0;
    let per_producer = (0..producers)
        .map(|p| {
            let mut mine: Vec<(String, Vec<u8>)> = Vec::with_capacity(per);
            for i in 0..per {
                // Every tenth event repeats one sent earlier: a sender's retry.
                if i % 10 == 9 {
                    let again = mine[(i * 7 + p) % i].clone();
                    mine.push(again);
                } else {
                    unique += 1;
                    let id = uuid::Uuid::new_v4().to_string();
                    let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":1}}"#);
                    mine.push((id, body.into_bytes()));
                }
            }
            mine
        })
        .collect();
    Load {
        per_producer,
        unique,
    }
}

/// (a) As in the seed: each producer has a connection and commits one `BEGIN IMMEDIATE`
/// transaction per event, contending for SQLite's write lock.
fn naive(dir: &Path, load: &Load) -> f64 {
    let path = copy_template(dir, "naive.db");
    let start = Instant::now();
    std::thread::scope(|s| {
        for mine in &load.per_producer {
            let path = &path;
            s.spawn(move || {
                let c = Connection::open(path).expect("open");
                c.busy_timeout(std::time::Duration::from_secs(60)).expect("busy");
                c.execute_batch("PRAGMA synchronous = FULL").expect("pragma");
                for (id, body) in mine {
                    c.execute_batch("BEGIN IMMEDIATE").expect("begin");
                    let n = c
                        .prepare_cached(
                            "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload,
                               received_at, completed_at)
                             VALUES ('bench', ?1, ?3, 'completed', ?2, 0, 0)
                             ON CONFLICT DO NOTHING",
                        )
                        .and_then(|mut st| st.execute(params![id, body, fingerprint(id)]))
                        .expect("insert");
                    if n == 1 {
                        c.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1", [])
                            .expect("effect");
                    }
                    c.execute_batch("COMMIT").expect("commit");
                }
            });
        }
    });
    rate(load, start)
}

/// A 32-byte stand-in fingerprint, so raw rows are as wide as oncebox's.
fn fingerprint(id: &str) -> Vec<u8> {
    let mut f = id.as_bytes().to_vec();
    f.resize(32, 0);
    f
}

/// Builds, once, a database holding oncebox's schema, the accounts table and `preload` earlier
/// events with random keys: a real inbox holds days of history, and inserting random keys into
/// a large index costs more than into an empty one.
fn template(dir: &Path, preload: usize) {
    let path = dir.join("template.db");
    drop(Inbox::open(Options::new(&path)).expect("schema"));
    let mut c = Connection::open(&path).expect("open");
    c.execute_batch(PRAGMAS)
        .and_then(|()| c.execute_batch(SETUP))
        .expect("setup");
    for _ in 0..preload.div_ceil(10_000) {
        let tx = c.transaction().expect("tx");
        {
            let mut st = tx
                .prepare(
                    "INSERT INTO oncebox_inbox (source, event_id, fingerprint, state, payload,
                       received_at, completed_at) VALUES ('bench', ?1, ?2, 'completed', ?3, 0, 0)",
                )
                .expect("prepare");
            for _ in 0..10_000 {
                let id = uuid::Uuid::new_v4().to_string();
                let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":1}}"#);
                st.execute(params![id, fingerprint(&id), body])
                    .expect("preload");
            }
        }
        tx.commit().expect("commit");
    }
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
}

fn copy_template(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::copy(dir.join("template.db"), &path).expect("copy template");
    std::fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .expect("sync copy");
    path
}

/// (b) oncebox: producers await `process`; the writer group-commits whatever is queued.
fn oncebox(dir: &Path, load: &Load, rt: &tokio::runtime::Runtime) -> (f64, usize) {
    let inbox = Inbox::open(Options::new(copy_template(dir, "oncebox.db"))).expect("open");
    let start = Instant::now();
    let applied = rt.block_on(async {
        let tasks: Vec<_> = load
            .per_producer
            .iter()
            .map(|mine| {
                let (inbox, mine) = (inbox.clone(), mine.clone());
                tokio::spawn(async move {
                    let mut applied = 0;
                    for (id, body) in mine {
                        let key = Key::parse("bench", &id).expect("key");
                        let event = Event::json(key, body).expect("event");
                        let out = inbox
                            .process(event, |tx| {
                                tx.conn()
                                    .prepare_cached(
                                        "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
                                    )?
                                    .execute([])?;
                                Ok(Response::completed(""))
                            })
                            .await
                            .expect("process");
                        applied += usize::from(matches!(out, Processed::Applied(_)));
                    }
                    applied
                })
            })
            .collect();
        let mut applied = 0;
        for t in tasks {
            applied += t.await.expect("producer");
        }
        applied
    });
    let stats = inbox.stats();
    let per_commit = stats.committed_requests() as f64 / stats.commits().max(1) as f64;
    println!(
        "    oncebox: {} commits, {per_commit:.1} requests per commit",
        stats.commits()
    );
    (rate(load, start), applied)
}

/// (c) The ceiling: the same keys inserted by one connection in plain batched transactions,
/// no claim, no effect, no answers.
fn ceiling(dir: &Path, load: &Load, batch: usize) -> f64 {
    let path = copy_template(dir, &format!("ceiling-{batch}.db"));
    let c = Connection::open(&path).expect("open");
    // The same page cache oncebox's writer gets.
    c.execute_batch("PRAGMA synchronous = FULL; PRAGMA cache_size = -65536")
        .expect("pragma");
    // Interleave producers as they would arrive.
    let mut all = Vec::new();
    let longest = load.per_producer.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        all.extend(load.per_producer.iter().filter_map(|p| p.get(i)));
    }
    let start = Instant::now();
    for chunk in all.chunks(batch) {
        c.execute_batch("BEGIN IMMEDIATE").expect("begin");
        let mut st = c
            .prepare_cached(
                "INSERT OR IGNORE INTO oncebox_inbox (source, event_id, fingerprint, state, payload,
                   received_at, completed_at) VALUES ('bench', ?1, ?3, 'completed', ?2, 0, 0)",
            )
            .expect("prepare");
        for (id, body) in chunk {
            st.execute(params![id, body, fingerprint(id)])
                .expect("insert");
        }
        c.execute_batch("COMMIT").expect("commit");
    }
    rate(load, start)
}

fn rate(load: &Load, start: Instant) -> f64 {
    let n: usize = load.per_producer.iter().map(Vec::len).sum();
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let events = oncebox_testkit::bench_arg("--events", 40_000);
    let naive_events = oncebox_testkit::bench_arg("--naive-events", 4_000);
    let producers = oncebox_testkit::bench_arg("--producers", 32);
    let preload = oncebox_testkit::bench_arg("--preload", 1_000_000);
    let base = std::env::var_os("ONCEBOX_BENCH_DIR")
        .map_or_else(|| Path::new("target").to_path_buf(), Into::into);
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    template(dir.path(), preload);
    let big = load(events, producers);
    let small = load(naive_events, producers);
    if std::env::args().any(|a| a == "--only-oncebox") {
        let (b, _) = oncebox(dir.path(), &big, &rt);
        println!("(b) oncebox group commit ({events} events): {b:.0} events/s");
        return;
    }
    println!(
        "ingest: {producers} producers, 10% duplicates, UUIDv4 ids, synchronous=FULL, WAL, \
         {preload} earlier events in the inbox"
    );
    let a = naive(dir.path(), &small);
    println!("(a) naive, one BEGIN IMMEDIATE per event ({naive_events} events): {a:>9.0} events/s");
    let (b, applied) = oncebox(dir.path(), &big, &rt);
    assert_eq!(applied, big.unique, "every unique key applied exactly once");
    println!("(b) oncebox group commit ({events} events):           {b:>9.0} events/s");
    let c = ceiling(dir.path(), &big, producers);
    println!("(c) raw batched INSERT, {producers} rows/commit:              {c:>9.0} events/s");
    let c_big = ceiling(dir.path(), &big, 1000);
    println!("    raw batched INSERT, 1000 rows/commit (reference):  {c_big:>9.0} events/s");
    println!(
        "ratios: b/a = {:.1}x (target >= 10x), b/c = {:.0}% (target >= 80%), b/c1000 = {:.0}%",
        b / a,
        100.0 * b / c,
        100.0 * b / c_big
    );
}
