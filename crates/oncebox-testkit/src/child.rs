//! Child processes under test (a server, a relay, a test binary re-run as a worker): start them,
//! wait until they are ready by a line they print or a port that accepts, SIGKILL, SIGSTOP and
//! SIGCONT them, and start them again with the same command. Nothing here sleeps to wait for an
//! outcome: readiness is a line read or a connection accepted, within a deadline.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// How long a child may take to become ready before the test fails.
pub const READY_PATIENCE: Duration = Duration::from_secs(30);

/// When a started child counts as ready.
#[derive(Debug, Clone)]
pub enum Ready {
    /// It printed a line starting with this on stdout; the rest of the line is kept as
    /// [`Proc::ready`] (e.g. the address after `oncebox listening on `).
    Stdout(String),
    /// It printed a line containing this on stderr (a log line).
    Stderr(String),
    /// Something accepts TCP connections at this address.
    Port(SocketAddr),
    /// Started is enough (a worker whose progress the test reads elsewhere).
    Started,
}

/// How to start a child: a command line, its environment, and when it is ready.
#[derive(Debug, Clone)]
pub struct Spec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub dir: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    pub env_remove: Vec<String>,
    pub ready: Ready,
    /// Lines (stdout or stderr) containing each of these are counted, e.g. a log line that
    /// proves a fault was noticed.
    pub watch: Vec<String>,
    /// Where the child's output goes besides the watcher, kept for a failing run's diagnosis.
    pub log: Option<PathBuf>,
}

impl Spec {
    pub fn new(program: impl Into<PathBuf>) -> Spec {
        Spec {
            program: program.into(),
            args: Vec::new(),
            dir: None,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready: Ready::Started,
            watch: Vec::new(),
            log: None,
        }
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<str>>(mut self, args: I) -> Spec {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn dir(mut self, dir: &Path) -> Spec {
        self.dir = Some(dir.to_owned());
        self
    }

    pub fn env(mut self, name: &str, value: impl AsRef<str>) -> Spec {
        self.env.push((name.to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn env_remove(mut self, name: &str) -> Spec {
        self.env_remove.push(name.to_owned());
        self
    }

    pub fn ready(mut self, ready: Ready) -> Spec {
        self.ready = ready;
        self
    }

    pub fn watch(mut self, needle: &str) -> Spec {
        self.watch.push(needle.to_owned());
        self
    }

    pub fn log(mut self, path: &Path) -> Spec {
        self.log = Some(path.to_owned());
        self
    }

    /// Starts the child and waits until it is ready; fails the test if it exits first or takes
    /// longer than [`READY_PATIENCE`].
    pub fn start(&self) -> Proc {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        for name in &self.env_remove {
            cmd.env_remove(name);
        }
        for (name, value) in &self.env {
            cmd.env(name, value);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.program.display()));
        let counts: Arc<HashMap<String, AtomicUsize>> = Arc::new(
            self.watch
                .iter()
                .map(|w| (w.clone(), AtomicUsize::new(0)))
                .collect(),
        );
        let (lines_tx, lines) = mpsc::channel();
        let log = self.log.as_ref().map(|p| {
            Arc::new(std::sync::Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .unwrap_or_else(|e| panic!("open log {}: {e}", p.display())),
            ))
        });
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (stream, is_err) in [
            (Box::new(out) as Box<dyn Read + Send>, false),
            (Box::new(err), true),
        ] {
            let (counts, tx, log) = (counts.clone(), lines_tx.clone(), log.clone());
            // Each stream is drained to its end, so the child never blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    for (needle, n) in counts.iter() {
                        if line.contains(needle.as_str()) {
                            n.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if let Some(log) = &log {
                        use std::io::Write;
                        let _ = writeln!(log.lock().unwrap(), "{line}");
                    }
                    let _ = tx.send((is_err, line));
                }
            });
        }
        drop(lines_tx);
        let mut proc = Proc {
            spec: self.clone(),
            child,
            ready: String::new(),
            counts,
        };
        proc.ready = proc.wait_ready(&lines);
        proc
    }
}

/// A running child; SIGKILLed when dropped if still running (also when stopped).
#[derive(Debug)]
pub struct Proc {
    spec: Spec,
    child: Child,
    /// What readiness captured: the rest of the [`Ready::Stdout`] line, else empty.
    pub ready: String,
    counts: Arc<HashMap<String, AtomicUsize>>,
}

impl Proc {
    fn wait_ready(&mut self, lines: &mpsc::Receiver<(bool, String)>) -> String {
        let deadline = Instant::now() + READY_PATIENCE;
        let program = self.spec.program.display().to_string();
        match self.spec.ready.clone() {
            Ready::Started => String::new(),
            Ready::Port(addr) => {
                until(
                    &format!("{program} accepts on {addr}"),
                    READY_PATIENCE,
                    || {
                        assert!(self.running(), "{program} exited before it was ready");
                        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                    },
                );
                String::new()
            }
            Ready::Stdout(prefix) | Ready::Stderr(prefix) => {
                let on_err = matches!(self.spec.ready, Ready::Stderr(_));
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match lines.recv_timeout(left) {
                        Ok((is_err, line)) if is_err == on_err => {
                            if !on_err && let Some(rest) = line.strip_prefix(&prefix) {
                                return rest.to_owned();
                            }
                            if on_err && line.contains(&prefix) {
                                return line;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => panic!(
                            "{program} did not print {prefix:?} within {READY_PATIENCE:?} \
                             (exit status {:?}; log {:?})",
                            self.child.try_wait(),
                            self.spec.log
                        ),
                    }
                }
            }
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(self.pid(), signal).expect("signal the child");
    }

    /// SIGKILL, as a crash; returns once the process is gone.
    pub fn kill(&mut self) -> ExitStatus {
        self.signal(Signal::SIGKILL);
        self.child.wait().expect("wait for the killed child")
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT after [`Proc::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM, and the exit status once it stopped.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        self.child.wait().expect("wait for the child")
    }

    /// Waits for the process to end by itself (a crash point, a finished worker).
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().expect("wait for the child")
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the process if it still runs and starts the same command again.
    pub fn restart(&mut self) {
        if self.running() {
            self.kill();
        }
        *self = self.spec.start();
    }

    /// Lines seen so far containing `needle` (one of [`Spec::watch`]).
    pub fn seen(&self, needle: &str) -> usize {
        self.counts
            .get(needle)
            .unwrap_or_else(|| panic!("{needle:?} is not watched"))
            .load(Ordering::SeqCst)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped process.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a status is death by SIGKILL.
pub fn killed(status: ExitStatus) -> bool {
    status.signal() == Some(Signal::SIGKILL as i32)
}

/// Polls `done` every 10 ms until it holds; fails after `patience`, naming `what`. For a
/// condition another process makes true, where no event reaches this one.
pub fn until(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {patience:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`until`] for async tests: yields to the runtime between polls.
pub async fn until_async(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {patience:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_ready_by_its_line_paused_resumed_and_killed() {
        let spec = Spec::new("sh")
            .args(["-c", "echo ready at 42; echo fault >&2; exec sleep 30"])
            .ready(Ready::Stdout("ready at ".into()))
            .watch("fault");
        let mut p = spec.start();
        assert_eq!(p.ready, "42");
        until("the watched line was counted", READY_PATIENCE, || {
            p.seen("fault") == 1
        });
        p.pause();
        p.resume();
        assert!(killed(p.kill()));
        p.restart();
        assert!(p.running(), "started again with the same command");
    }
}
