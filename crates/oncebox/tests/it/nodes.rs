//! Nodes of a deployment on PostgreSQL as child processes: a schema of its own per test, gateway
//! and relay processes of the built `oncebox`, and the signals a test sends them.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

/// The log line a relay writes when it may not record an outcome: its lease was taken over.
const FENCED_LINE: &str = "lease lost";

/// Runs an async test on a multi-threaded runtime and fails it if it takes longer than `limit`.
pub fn run_within<F: Future<Output = ()>>(limit: Duration, test: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        tokio::time::timeout(limit, test)
            .await
            .unwrap_or_else(|_| panic!("test timed out after {limit:?}"));
    });
}

/// Polls `done` until it holds; fails after `patience` naming `what`.
pub async fn until(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + patience;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {patience:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running `oncebox` process, killed when dropped if still running.
pub struct Node {
    child: Child,
    /// A gateway's base URL (`http://ADDR`); empty for a relay.
    pub url: String,
    /// How many times the process logged that it lost a lease before recording an outcome.
    pub fenced: Arc<AtomicUsize>,
}

/// Starts `oncebox serve` in `dir` (reading `dir/oncebox.toml`) on `database` with `args`
/// after `serve`, and waits until it listens.
pub fn gateway(dir: &Path, database: &str, args: &[&str]) -> Node {
    let mut child = oncebox(dir, database)
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log_file(dir, "gateway"))
        .spawn()
        .expect("start oncebox serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the gateway printed its address")
            .unwrap();
        if let Some(rest) = line.strip_prefix("oncebox listening on ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stdout so the gateway never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Node {
        child,
        url,
        fenced: Arc::default(),
    }
}

/// Starts `oncebox relay` in `dir` on `database` and waits until it runs; counts the outcomes
/// it was refused to record from its log.
pub fn relay(dir: &Path, database: &str) -> Node {
    let mut child = oncebox(dir, database)
        .arg("relay")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oncebox relay");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = lines
            .next()
            .expect("the relay reported that it runs")
            .unwrap();
        if line.contains("relay running") {
            break;
        }
    }
    let fenced = Arc::new(AtomicUsize::new(0));
    let count = fenced.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.contains(FENCED_LINE) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    Node {
        child,
        url: String::new(),
        fenced,
    }
}

fn oncebox(dir: &Path, database: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oncebox"));
    c.arg("--database")
        .arg(database)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE");
    c
}

/// The process's stderr goes to a numbered file in `dir`, kept for a failing run's diagnosis.
fn log_file(dir: &Path, name: &str) -> std::fs::File {
    let mut n = 0;
    loop {
        let path = dir.join(format!("{name}-{n}.log"));
        if let Ok(f) = std::fs::File::create_new(&path) {
            return f;
        }
        n += 1;
    }
}

impl Node {
    pub fn signal(&self, signal: Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the node");
    }

    /// SIGKILL, as a crash; returns how the process ended.
    pub fn kill(&mut self) -> ExitStatus {
        self.signal(Signal::SIGKILL);
        self.child.wait().expect("wait for the killed node")
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM: a graceful stop, which must end with success.
    pub fn stop(mut self) {
        self.signal(Signal::SIGTERM);
        let status = self.child.wait().expect("wait for the node");
        assert!(status.success(), "graceful stop ended with {status}");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped (SIGSTOP) process.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
