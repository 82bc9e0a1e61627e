//! Power loss: a child process applies events through `oncebox_sqlite::powerloss`, a VFS that
//! keeps every write in memory until its file is synced, and is SIGKILLed under load; what is
//! left on disk is only what was synced, as after a power cut. Every event the child
//! acknowledged must be there, three cuts in a row, with the log started over several times
//! between them. The same store at `Durability::Normal` (commits not synced) loses
//! acknowledged events under the same cuts, and a plain SQLite connection that never syncs
//! loses them all: the simulation bites.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use oncebox_core::{Event, Key, Processed, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Durability, Inbox, Options, powerloss};

const CHILD: &str = "ONCEBOX_POWERLOSS_CHILD";
const WORKERS: usize = 8;
/// Acknowledgements after which the parent cuts the power.
const CUT_AFTER: usize = 600;

/// The child's side: `ONCEBOX_POWERLOSS_CHILD=<db path>|<store, normal or raw>|<round>`. Runs until
/// killed. Marked ignored so a normal run skips it; the parent runs it with
/// `--include-ignored`.
#[test]
#[ignore = "entry point of the power-loss test's child process"]
fn child_process() {
    let spec = std::env::var(CHILD).expect("run by the power-loss tests");
    let mut parts = spec.split('|');
    let (path, mode, round) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert!(powerloss::install(), "the power-loss VFS installs");
    // As every store runs: the VFS started SQLite up, after which the cache cannot be wrapped.
    assert!(
        oncebox_sqlite::page_cache_wrapped(),
        "the page cache is wrapped"
    );
    if mode == "raw" {
        raw(path);
    }
    if mode == "failsync" {
        // A sync of the database file from the tenth on fails.
        powerloss::fail_database_sync(10);
    }
    if mode == "faillog" {
        // A commit's sync of the log, from the fiftieth on, fails.
        powerloss::fail_log_sync(50);
    }
    let durability = match mode {
        "normal" => Durability::Normal,
        _ => Durability::Full,
    };
    // A short log: it starts over many times between two cuts.
    let options = Options::new(path)
        .wal_restart_frames(256)
        .durability(durability);
    let inbox = Inbox::open(options).expect("open");
    let failed = match mode {
        "failsync" => Some((
            powerloss::failed_database_syncs as fn() -> u32,
            "sync-failed",
        )),
        "faillog" => Some((
            powerloss::failed_log_syncs as fn() -> u32,
            "log-sync-failed",
        )),
        _ => None,
    };
    if let Some((failures, line)) = failed {
        // Tells the parent when the sync failed, and whether the log started over after it.
        let inbox = inbox.clone();
        std::thread::spawn(move || {
            let look = || std::thread::sleep(std::time::Duration::from_millis(2));
            while failures() == 0 {
                look();
            }
            let restarts = inbox.stats().log_restarts();
            say(line);
            while inbox.stats().log_restarts() == restarts {
                look();
            }
            say("log-restarted");
        });
    }
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (inbox, round, retry) = (inbox.clone(), round.to_owned(), mode == "faillog");
            std::thread::spawn(move || {
                for n in 0.. {
                    let id = format!("r{round}-w{w}-{n}");
                    let body = format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(300));
                    let event = Event::json(Key::parse("power", &id).unwrap(), body).unwrap();
                    // Sent again until stored, as a sender does after a 503: the answer to
                    // each try is what a sender would be told.
                    loop {
                        let answer = inbox.process_blocking(event.clone(), |_| {
                            Ok(Response::completed("applied"))
                        });
                        match answer {
                            Ok(Processed::Applied(_) | Processed::Duplicate(_)) => break,
                            Err(oncebox_core::ProcessError::Unavailable(_)) if retry => {
                                say(&format!("refused {id}"));
                            }
                            other => panic!("{id}: {other:?}"),
                        }
                    }
                    ack(&id);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}

/// Prints an acknowledgement at once: the parent must know exactly what was acknowledged.
fn ack(id: &str) {
    say(&format!("ack {id}"));
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// A WAL database with `synchronous=OFF`: commits that are never synced.
fn raw(path: &str) -> ! {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
         CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY);",
    )
    .unwrap();
    for n in 0.. {
        let id = format!("raw-{n}");
        conn.execute("INSERT INTO t (id) VALUES (?1)", [&id])
            .unwrap();
        ack(&id);
    }
    unreachable!()
}

/// Runs the child until it acknowledged [`CUT_AFTER`] events, then SIGKILLs it; returns every
/// id it acknowledged before it died.
fn cut(path: &Path, mode: &str, round: usize) -> Vec<String> {
    cut_after(path, mode, round, None, CUT_AFTER).0
}

/// As [`cut`], cutting after `after` acknowledgements that followed the child's line `mark`
/// (when one is given); also returns every line the child printed that was no acknowledgement.
fn cut_after(
    path: &Path,
    mode: &str,
    round: usize,
    mark: Option<&str>,
    after: usize,
) -> (Vec<String>, Vec<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "powerloss::child_process",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{}|{mode}|{round}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut acked = Vec::new();
    let mut killed = false;
    let mut marked = mark.is_none();
    let mut since_mark = 0;
    let mut said = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        marked |= mark.is_some_and(|m| line.contains(m));
        // libtest may print "test … ... " on the same line before the child's first output.
        if let Some(id) = line.find("ack ").map(|at| &line[at + 4..]) {
            acked.push(id.to_owned());
            since_mark += usize::from(marked);
        } else {
            said.push(line);
        }
        if since_mark == after && !killed {
            // Lines already printed are still read: they were acknowledged before the cut.
            child.kill().expect("SIGKILL the child");
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the child died of the cut: {status:?}"
    );
    (acked, said)
}

/// How many of `ids` the table `table` holds in column `column`, after a plain open (the
/// platform VFS: what a restarted machine reads).
fn present(path: &Path, table: &str, column: &str, ids: &[String]) -> usize {
    let conn = Connection::open(path).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let sql = format!("SELECT count(*) FROM {table} WHERE {column} = ?1");
    let Ok(mut q) = conn.prepare(&sql) else {
        // The table itself was never synced.
        return 0;
    };
    ids.iter()
        .filter(|id| q.query_row([id.as_str()], |r| r.get::<_, i64>(0)).unwrap() == 1)
        .count()
}

/// Three cuts in a row on one database at `mode`; returns, after each, how many acknowledged
/// events were kept and how many were acknowledged in all by then.
fn three_cuts(mode: &str) -> Vec<(usize, usize)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("power.db");
    let mut all = Vec::new();
    (0..3)
        .map(|round| {
            all.extend(cut(&path, mode, round));
            let kept = present(&path, "oncebox_inbox", "event_id", &all);
            eprintln!(
                "{mode}, cut {round}: {} acknowledged in all, {kept} kept",
                all.len()
            );
            (kept, all.len())
        })
        .collect()
}

#[test]
fn acknowledged_events_survive_power_cuts() {
    for (kept, acked) in three_cuts("store") {
        assert_eq!(kept, acked, "acknowledged events lost to a power cut");
    }
}

/// With commits not synced, the events acknowledged since the last checkpoint's sync are
/// lost: three cuts, each after 600 acknowledgements from eight busy writers, cannot all land
/// right after a sync.
#[test]
fn unsynced_commits_lose_acknowledged_events_to_power_cuts() {
    let (kept, acked) = *three_cuts("normal").last().unwrap();
    assert!(
        kept < acked,
        "{acked} acknowledged without a sync each, all kept: the cuts dropped nothing"
    );
}

/// A sync of the database file fails as Linux fails one after a writeback error (the pages it
/// was to persist are dropped, the next sync succeeds without them), and the store goes on
/// taking events, its log otherwise starting over every 256 frames. Had a checkpoint after the
/// failure let the log start over, the copies that never reached the disk would exist nowhere
/// (without the change the log started over in each of three runs, and one of them found the
/// file damaged after the cut). The store stops copying the log back instead,
/// and the log keeps them for the next open.
#[test]
fn a_failed_sync_of_the_database_file_loses_nothing_acknowledged() {
    const AFTER: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("power.db");
    let (acked, said) = cut_after(&path, "failsync", 0, Some("sync-failed"), AFTER);
    let saw = |line: &str| said.iter().any(|l| l.contains(line));
    assert!(
        saw("sync-failed"),
        "the sync never failed: nothing was tested"
    );
    let kept = present(&path, "oncebox_inbox", "event_id", &acked);
    let restarted = saw("log-restarted");
    eprintln!(
        "failed sync: {} acknowledged ({AFTER} after the failure), {kept} kept, the log \
         started over after it: {restarted}",
        acked.len()
    );
    assert!(!restarted, "the log started over after the failed sync");
    assert_eq!(
        kept,
        acked.len(),
        "acknowledged events lost after a failed sync"
    );
}

/// A commit's sync of the log fails as Linux fails one after a writeback error: its frames stay
/// readable and never reach the disk. The commit is answered unavailable, the sender tries
/// again and must be answered only once what it is told of is durable: a try answered as a
/// duplicate from frames that are readable but lost would be an acknowledged event the power
/// cut takes. Every event acknowledged, first tries and tries again alike, survives the cut.
///
/// SQLite publishes a commit only after its sync, so the failed one is never read, and the
/// next commit writes its frames at the same place in the log; the page cache takes them and
/// their sync persists them. The power-loss VFS once let the failed commit's lost bytes lie
/// over a shorter retry's once those were synced (`powerloss/unsynced.rs`), and the
/// checkpoint then copied the lost frames' pages into the database file: a damaged file in
/// about one run in six, which was the model's fault, not the store's.
#[test]
fn a_failed_sync_of_the_log_loses_nothing_acknowledged() {
    const AFTER: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("power.db");
    let (acked, said) = cut_after(&path, "faillog", 0, Some("log-sync-failed"), AFTER);
    let saw = |line: &str| said.iter().any(|l| l.contains(line));
    assert!(
        saw("log-sync-failed"),
        "the log's sync never failed: nothing was tested"
    );
    let refused = said.iter().filter(|l| l.contains("refused ")).count();
    let kept = present(&path, "oncebox_inbox", "event_id", &acked);
    // Not asserted either way: the checkpointer is told of the failure at its next sync of the
    // log and stops, but the writer may have started the log over before that.
    let restarted = saw("log-restarted");
    eprintln!(
        "failed log sync: {} acknowledged ({AFTER} after the failure), {refused} tries refused, \
         {kept} kept, the log started over after it: {restarted}",
        acked.len()
    );
    assert!(
        refused > 0,
        "no try was refused: the failed sync answered nobody"
    );
    assert_eq!(
        kept,
        acked.len(),
        "acknowledged events lost after a failed sync of the log"
    );
}

#[test]
fn writes_never_synced_are_lost_to_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.db");
    let acked = cut(&path, "raw", 0);
    let kept = present(&path, "t", "id", &acked);
    eprintln!("no sync: {} acknowledged, {kept} kept", acked.len());
    assert!(
        kept < acked.len(),
        "every unsynced commit survived: the simulated power cut dropped nothing"
    );
}
