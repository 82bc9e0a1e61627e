//! Crash test: a child process applies events and SIGKILLs itself at a named crash point; the
//! parent restarts it, retries everything, and checks that no key was applied twice, every
//! acknowledged key was applied, and the database is intact.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use oncebox_core::{Event, Key, Processed, Response};
use oncebox_sqlite::rusqlite::{Connection, params};
use oncebox_sqlite::{Inbox, Options};

const EVENTS: usize = 400;
const WORKERS: usize = 8;
const CHILD: &str = "ONCEBOX_CRASH_CHILD";

/// The child's side: `ONCEBOX_CRASH_CHILD=<db path>|<crash point or none>|<hits to let pass>`.
/// Marked ignored so a normal run skips it; the parent runs it with `--include-ignored`.
#[test]
#[ignore = "entry point of the crash test's child process"]
fn child_process() {
    let spec =
        std::env::var(CHILD).expect("run by crash_points_lose_nothing_and_apply_nothing_twice");
    let mut parts = spec.split('|');
    let (path, point, skip) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    if point != "none" {
        fail::cfg(point, &format!("{skip}*off->return")).expect("arm crash point");
    }
    let inbox = Inbox::open(Options::new(path)).expect("open");
    inbox
        .write_blocking(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS effects (event_id TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER);
                 INSERT OR IGNORE INTO accounts VALUES (1, 0);",
            )
        })
        .expect("schema");
    let next = Arc::new(Mutex::new(0..EVENTS));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (inbox, next, out) = (inbox.clone(), next.clone(), out.clone());
            std::thread::spawn(move || {
                loop {
                    let Some(i) = next.lock().unwrap().next() else {
                        return;
                    };
                    let id = format!("evt-{i}");
                    let event =
                        Event::json(Key::parse("crash", &id).unwrap(), format!(r#"{{"n":{i}}}"#))
                            .unwrap();
                    let effect_id = id.clone();
                    let answer = inbox.process_blocking(event, move |tx| {
                        tx.conn()
                            .execute("INSERT INTO effects (event_id) VALUES (?1)", [&effect_id])?;
                        tx.conn().execute(
                            "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
                            [],
                        )?;
                        Ok(Response::completed(""))
                    });
                    // Only an answer received is an acknowledgement; print it before anything else
                    // can happen, so the parent knows exactly what was acknowledged.
                    let kind = match answer {
                        Ok(Processed::Applied(_)) => "applied",
                        Ok(Processed::Duplicate(_)) => "duplicate",
                        other => panic!("{id}: {other:?}"),
                    };
                    let mut out = out.lock().unwrap();
                    writeln!(out, "ack {kind} {id}").unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}

struct Run {
    acked: Vec<String>,
    duplicates: usize,
    killed: bool,
}

fn run_child(path: &Path, point: &str, skip: usize) -> Run {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::child_process",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{}|{point}|{skip}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut acked = Vec::new();
    let mut duplicates = 0;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // libtest may print "test … ... " on the same line before the child's first output.
        if let Some(rest) = line.find("ack ").map(|at| &line[at + 4..]) {
            let (kind, id) = rest.split_once(' ').unwrap();
            duplicates += usize::from(kind == "duplicate");
            acked.push(id.to_owned());
        }
    }
    let status = child.wait().unwrap();
    let killed = status.signal() == Some(9);
    assert!(killed || status.success(), "child failed: {status:?}");
    Run {
        acked,
        duplicates,
        killed,
    }
}

#[test]
fn crash_points_lose_nothing_and_apply_nothing_twice() {
    for point in oncebox_sqlite::crash::POINTS {
        // At the first hit, and after some batches committed. The transaction's points (after
        // BEGIN, around COMMIT) are passed once per batch, the others once per event.
        let skips: &[usize] = if point.ends_with("commit") || point == "after-begin" {
            &[0, 7]
        } else {
            &[0, 7, 150]
        };
        for &skip in skips {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("crash.db");
            let first = run_child(&path, point, skip);
            assert!(
                first.killed,
                "{point}/{skip}: the crash point was never reached"
            );
            let retry = run_child(&path, "none", 0);
            assert!(!retry.killed);
            assert_eq!(
                retry.acked.len(),
                EVENTS,
                "{point}/{skip}: retry acknowledged everything"
            );

            let c = Connection::open(&path).unwrap();
            let ok: String = c
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(ok, "ok", "{point}/{skip}");
            let doubles: i64 = c
                .query_row("SELECT count(*) FROM (SELECT event_id FROM effects GROUP BY 1 HAVING count(*) > 1)", [], |r| r.get(0))
                .unwrap();
            let applied: i64 = c
                .query_row("SELECT count(DISTINCT event_id) FROM effects", [], |r| {
                    r.get(0)
                })
                .unwrap();
            let balance: i64 = c
                .query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| {
                    r.get(0)
                })
                .unwrap();
            let lost = first
                .acked
                .iter()
                .filter(|id| {
                    let n: i64 = c
                        .query_row(
                            "SELECT count(*) FROM effects WHERE event_id = ?1",
                            params![id],
                            |r| r.get(0),
                        )
                        .unwrap();
                    n != 1
                })
                .count();
            eprintln!(
                "crash at {point} after {skip} hits: acked before crash {}, retry duplicates {}, D={doubles} L={lost} applied={applied}",
                first.acked.len(),
                retry.duplicates
            );
            assert_eq!((doubles, lost), (0, 0), "{point}/{skip}");
            assert_eq!(
                (applied, balance),
                (EVENTS as i64, EVENTS as i64),
                "{point}/{skip}"
            );
            // Everything acknowledged before the crash comes back as a duplicate.
            assert!(retry.duplicates >= first.acked.len(), "{point}/{skip}");
            if point == "after-commit" && skip > 0 {
                // Committed but never answered: the retry finds them done. This is the case the
                // point exists for; seeing it proves the fault happened where intended.
                assert!(
                    retry.duplicates > first.acked.len(),
                    "{point}/{skip}: no unanswered commit"
                );
            }
        }
    }
}
