//! Stopping `serve` and `relay` by signal: the first asks for a graceful stop and says what it
//! waits for, a second stops at once, SIGHUP is a stop request like SIGTERM, and a stop during
//! the start ends it.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oncebox_postgres::sqlx::{self, Connection, PgConnection};

use crate::schema::Schema;
use crate::support::{oncebox, serve_with, text};

/// Far longer than the test may take: an attempt the stop waited for would show.
const CONFIG: &str = r#"
listen = "127.0.0.1:0"
[sources.shop]
signature = "none"
[routes.hooks]
sources = ["shop"]
url = "http://RECEIVER/hook"
timeout = "120s"
[relay]
lease = "150s"
"#;

/// A receiver that reads each request and never answers; says on `arrived` when one came.
fn hanging_receiver() -> (String, mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 1024];
            // The request's first bytes: the attempt is under way.
            if stream.read(&mut buf).unwrap_or(0) > 0 {
                let _ = tx.send(());
            }
            held.push(stream);
        }
    });
    (addr, rx)
}

/// `oncebox args…` in `dir` with its log on a pipe, at info level.
fn start(
    dir: &Path,
    args: &[&str],
) -> (Child, std::io::Lines<BufReader<std::process::ChildStderr>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(args)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, log)
}

/// Reads the log until a line holds `what`; the line, or the log so far when it ended first.
fn until(log: &mut impl Iterator<Item = std::io::Result<String>>, what: &str) -> String {
    let mut seen = String::new();
    for line in log.by_ref() {
        let line = line.unwrap();
        if line.contains(what) {
            return line;
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    panic!("the log ended without {what:?}: {seen}");
}

/// The process's exit code, which must come within `within` (a bound on a failure, not a
/// pause: a passing run returns as soon as the process exits).
fn exit_within(mut child: Child, within: Duration) -> Option<i32> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().unwrap());
    });
    match rx.recv_timeout(within) {
        Ok(status) => status.code(),
        Err(_) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("still running {within:?} after the second signal");
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
}

/// A directory whose configuration routes `shop` to a receiver that never answers, with one
/// event stored and its delivery owed.
fn one_event_owed() -> (tempfile::TempDir, mpsc::Receiver<()>) {
    let dir = tempfile::tempdir().unwrap();
    let (addr, arrived) = hanging_receiver();
    std::fs::write(
        dir.path().join("oncebox.toml"),
        CONFIG.replace("RECEIVER", &addr),
    )
    .unwrap();
    let server = serve_with(dir.path(), &["--no-relay"]);
    let sent = oncebox(
        dir.path(),
        &["send", "shop", "--id", "evt_1", "--url", &server.1],
    );
    assert!(sent.status.success(), "{}", text(&sent));
    server.stop();
    (dir, arrived)
}

/// The first signal waits for the attempt in progress (up to the route's 120 s timeout) and
/// says so; the second ends the process at once, the delivery left in flight as after a
/// crash, for its lease to end and another relay to take it.
#[test]
fn a_second_signal_stops_serve_and_relay_at_once() {
    for command in [&["serve"][..], &["relay"]] {
        let (dir, arrived) = one_event_owed();
        let (child, mut log) = start(dir.path(), command);
        arrived
            .recv_timeout(Duration::from_secs(60))
            .expect("the attempt reached the receiver");
        signal(&child, Signal::SIGTERM);
        let line = until(&mut log, "delivery attempt");
        assert!(
            line.contains("waiting for 1 delivery attempt, up to")
                && line.contains("signal again to stop now"),
            "{command:?}: {line}"
        );
        signal(&child, Signal::SIGINT);
        // Drained so the process never blocks on a full pipe.
        std::thread::spawn(move || log.for_each(drop));
        assert_eq!(
            exit_within(child, Duration::from_secs(20)),
            Some(128 + Signal::SIGINT as i32),
            "{command:?}"
        );
        let list = oncebox(
            dir.path(),
            &[
                "deliveries",
                "list",
                "--state",
                "in_flight",
                "--output",
                "json",
            ],
        );
        let doc: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(doc["items"].as_array().map(Vec::len), Some(1), "{doc}");
    }
}

/// SIGHUP (a closed terminal, a supervisor's hang-up) stops `serve` gracefully, as SIGTERM
/// does: it used to kill it at once, exit 129, mid-commit.
#[test]
fn sighup_stops_serve_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let (child, mut log) = start(dir.path(), &["serve", "--listen", "127.0.0.1:0"]);
    until(&mut log, "zero-config");
    signal(&child, Signal::SIGHUP);
    until(&mut log, "stopped");
    std::thread::spawn(move || log.for_each(drop));
    assert_eq!(exit_within(child, Duration::from_secs(20)), Some(0));
}

/// The commands that open a store before they run, each with a directory of its own (the
/// relay's holding a configuration with a route, which it needs to start).
fn starts() -> [(&'static [&'static str], tempfile::TempDir); 2] {
    let relay = tempfile::tempdir().unwrap();
    std::fs::write(
        relay.path().join("oncebox.toml"),
        CONFIG.replace("RECEIVER", "127.0.0.1:9"),
    )
    .unwrap();
    [
        (
            &["serve", "--listen", "127.0.0.1:0"],
            tempfile::tempdir().unwrap(),
        ),
        (&["relay"], relay),
    ]
}

/// A stop asked for while the store opens ends the start there. Here the open waits for the
/// migration lock a test session holds (up to two minutes): a SIGTERM used to be noticed only
/// once the lock was free and the gateway listening, and a second one not at all.
#[test]
fn a_stop_during_the_open_ends_the_start() {
    let Some(base) = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let schema = rt.block_on(Schema::create(&base, "oncebox_stop"));
    let mut holder = rt.block_on(async {
        let mut conn = PgConnection::connect(&schema.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext('oncebox-migrate:' || current_schema()))",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn
    });
    for (command, dir) in starts() {
        let mut args = vec!["--database", schema.url.as_str()];
        args.extend_from_slice(command);
        let (child, mut log) = start(dir.path(), &args);
        // The process is in the open, blocked behind the lock: the fault is in place.
        until(&mut log, "waiting for the migration lock");
        signal(&child, Signal::SIGTERM);
        let line = until(&mut log, "stopped before the");
        std::thread::spawn(move || log.for_each(drop));
        assert_eq!(
            exit_within(child, Duration::from_secs(20)),
            Some(0),
            "{line}"
        );
    }
    rt.block_on(async {
        // Still held: the stops did not wait for it.
        let held: bool = sqlx::query_scalar(
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .fetch_one(&mut holder)
        .await
        .unwrap();
        assert!(held);
        sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    });
}

/// The same on SQLite: a file another process holds locked. The open waited out each busy
/// step on the runtime's own thread, so a SIGTERM was noticed only once the open gave up
/// (exit 4, "database is locked") or got through.
#[test]
fn a_stop_during_a_sqlite_open_ends_the_start() {
    for (command, dir) in starts() {
        let file = dir.path().join("oncebox.db");
        let holder = oncebox_sqlite::rusqlite::Connection::open(&file).unwrap();
        holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let (mut child, mut log) = start(dir.path(), command);
        // The process is in the open, behind the lock: it has the file open.
        let fds = format!("/proc/{}/fd", child.id());
        let opened = || {
            std::fs::read_dir(&fds).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to == file))
            })
        };
        while !opened() {
            assert!(child.try_wait().unwrap().is_none(), "ended before its open");
            std::thread::yield_now();
        }
        signal(&child, Signal::SIGTERM);
        let line = until(&mut log, "stopped before the");
        std::thread::spawn(move || log.for_each(drop));
        assert_eq!(
            exit_within(child, Duration::from_secs(20)),
            Some(0),
            "{line}"
        );
        // Still held: the stop did not wait for it.
        assert!(!holder.is_autocommit());
        holder.execute_batch("ROLLBACK").unwrap();
    }
}
