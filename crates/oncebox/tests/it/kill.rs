//! A server process SIGKILLed under load and restarted: every key answered 202 is stored, the
//! database is intact, and retries of everything converge to exactly one record per key.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use oncebox_sqlite::rusqlite::Connection;

const EVENTS: usize = 3000;
const CLIENTS: usize = 16;

struct Server {
    child: Child,
    addr: String,
}

fn start(db: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database"])
        .arg(format!("sqlite://{}", db.display()))
        // Zero-config: no file in the working directory, none named by the environment.
        .current_dir(db.parent().unwrap())
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start oncebox serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(rest) = line.strip_prefix("oncebox listening on http://") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, addr }
}

/// Acknowledged ids, and a signal once enough of them arrived to kill the server mid-run.
#[derive(Default)]
struct Acks {
    ids: std::sync::Mutex<Vec<usize>>,
    enough: tokio::sync::Notify,
}

/// How a client's run ended.
#[derive(Debug, PartialEq)]
enum Run {
    /// Every id answered.
    Whole,
    /// A request was sent and the connection ended without its answer: the kill landed while
    /// this client had a request in the server's hands.
    CutMidRequest,
    /// A connection could not be made: the server was already gone.
    Refused,
}

/// Delivers `ids` in order, until the server goes away. `killing` is set just before the kill:
/// a request begun after it that fails (written on a pooled connection the kill had closed) is
/// not one the kill cut.
async fn deliver(
    addr: String,
    ids: Vec<usize>,
    acked: Arc<Acks>,
    sent: Arc<AtomicUsize>,
    killing: Arc<AtomicBool>,
) -> Run {
    let client = reqwest::Client::new();
    for i in ids {
        let url = format!("http://{addr}/v1/sources/load/events");
        let body = format!(r#"{{"id":"evt-{i}","n":{i}}}"#);
        sent.fetch_add(1, Ordering::Relaxed);
        let before_the_kill = !killing.load(Ordering::SeqCst);
        match client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
        {
            Ok(r) if r.status().as_u16() == 202 => {
                let mut ids = acked.ids.lock().unwrap();
                ids.push(i);
                if ids.len() == EVENTS / 3 {
                    acked.enough.notify_one();
                }
            }
            Ok(r) => assert!(r.status().as_u16() == 503, "unexpected {}", r.status()),
            // No answer, nothing acknowledged.
            Err(e) if e.is_connect() || !before_the_kill => return Run::Refused,
            Err(_) => return Run::CutMidRequest,
        }
    }
    Run::Whole
}

#[test]
fn server_killed_under_load_keeps_every_acknowledged_key() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("kill.db");
        let mut server = start(&db);
        let acked = Arc::new(Acks::default());
        let sent = Arc::new(AtomicUsize::new(0));
        let killing = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|c| {
                // 10% of each client's events repeat one it sent before.
                let ids = (0..EVENTS / CLIENTS)
                    .map(|k| {
                        if k % 10 == 9 {
                            c * 1000 + k - 5
                        } else {
                            c * 1000 + k
                        }
                    })
                    .collect();
                tokio::spawn(deliver(
                    server.addr.clone(),
                    ids,
                    acked.clone(),
                    sent.clone(),
                    killing.clone(),
                ))
            })
            .collect();
        // Kill once a third of the load has been answered: in the middle of the run, by count,
        // not by time.
        acked.enough.notified().await;
        killing.store(true, Ordering::SeqCst);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(server.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let status = server.child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "killed by SIGKILL"
        );
        let mut cut = 0;
        for t in tasks {
            cut += usize::from(t.await.unwrap() == Run::CutMidRequest);
        }
        let before: Vec<usize> = acked.ids.lock().unwrap().clone();
        // Proof that the kill landed under load: a client had sent a request the server never
        // answered (not merely found the server gone when it next connected).
        assert!(
            cut > 0,
            "no request was in flight when the server was killed"
        );
        assert!(
            before.len() < sent.load(Ordering::Relaxed),
            "the kill interrupted the load ({} acknowledged)",
            before.len()
        );

        let c = Connection::open(&db).unwrap();
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(ok, "ok");
        let lost: Vec<usize> = before
            .iter()
            .copied()
            .filter(|i| {
                let n: i64 = c
                    .query_row("SELECT count(*) FROM oncebox_inbox WHERE source = 'load' AND event_id = ?1", [format!("evt-{i}")], |r| r.get(0))
                    .unwrap();
                n != 1
            })
            .collect();
        assert!(
            lost.is_empty(),
            "L = {}: acknowledged but not stored: {lost:?}",
            lost.len()
        );
        drop(c);

        // Restart and retry everything: each key ends with exactly one record.
        let mut server = start(&db);
        let retry_acked = Arc::new(Acks::default());
        let all: Vec<usize> = (0..CLIENTS)
            .flat_map(|c| (0..EVENTS / CLIENTS).map(move |k| c * 1000 + k))
            .collect();
        let whole = deliver(
            server.addr.clone(),
            all.clone(),
            retry_acked.clone(),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        )
        .await;
        assert_eq!(
            whole,
            Run::Whole,
            "the restarted server answered every retry"
        );
        assert_eq!(retry_acked.ids.lock().unwrap().len(), all.len());
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let c = Connection::open(&db).unwrap();
        let rows: i64 = c
            .query_row(
                "SELECT count(*) FROM oncebox_inbox WHERE source = 'load'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows as usize, all.len());
        eprintln!(
            "killed after {} acknowledged of {} sent, {cut} of {CLIENTS} clients cut off; \
             L=0, rows={rows}",
            before.len(),
            sent.load(Ordering::Relaxed)
        );
    });
}
