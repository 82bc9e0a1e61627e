//! A private PostgreSQL cluster for one test: its own data directory, port and socket directory,
//! so a test can take the database away (an outage) without touching the server other tests use.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The OS user the server runs as when the test runs as root: `initdb` and `postgres` refuse
/// to run as root.
const SERVER_USER: &str = "postgres";

/// A running cluster, stopped and deleted when dropped.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    root: tempfile::TempDir,
    port: u16,
    /// `Some(user)` when every server command must run as that user (the test runs as root).
    run_as: Option<&'static str>,
}

impl Cluster {
    /// Creates and starts a cluster with trust authentication for the user `postgres` and
    /// commit timestamps on.
    ///
    /// `None` when no PostgreSQL server binaries are installed: the test says so on stderr and
    /// skips, unless `ONCEBOX_REQUIRE_SERVICES=1`, which makes it a failure. The binaries are
    /// looked up in `ONCEBOX_PG_BIN`, then `/usr/lib/postgresql/<newest>/bin` (Debian, Ubuntu),
    /// then the directory of an `initdb` on `PATH`.
    pub fn start() -> Option<Cluster> {
        let Some(bin) = server_binaries() else {
            let why = "no PostgreSQL server binaries (initdb, pg_ctl) found: set ONCEBOX_PG_BIN \
                       to their directory or install the server package";
            if std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
                panic!("{why}; ONCEBOX_REQUIRE_SERVICES=1 makes this a failure");
            }
            eprintln!("SKIPPED: {why}");
            return None;
        };
        let run_as = is_root().then_some(SERVER_USER);
        let root = tempfile::Builder::new()
            .prefix("oncebox-pg-")
            .tempdir()
            .expect("temporary directory for the cluster");
        std::fs::create_dir(root.path().join("socket")).expect("socket directory");
        if let Some(user) = run_as {
            let (uid, gid) = ids(user);
            for dir in [root.path().to_owned(), root.path().join("socket")] {
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {} to {user}: {e}", dir.display()));
            }
        }
        let cluster = Cluster {
            bin,
            port: free_port(),
            root,
            run_as,
        };
        let data = cluster.data();
        // No fsync while initialising: the cluster lives as long as the test.
        cluster.run(
            "initdb",
            &[
                "-D",
                path(&data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        cluster.resume();
        Some(cluster)
    }

    /// The URL of `database` on this cluster, over TCP on the loopback.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server the way a crash does (`pg_ctl stop -m immediate`: no checkpoint, every
    /// connection cut); returns once it is down. Committed transactions survive, as after a
    /// crash: the next start replays the WAL.
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }

    /// Starts the server (again) on the same port and data; returns once it accepts
    /// connections.
    pub fn resume(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c track_commit_timestamp=on",
            self.port,
            path(&self.root.path().join("socket")),
        );
        let log = self.root.path().join("server.log");
        // fsync=off: an immediate stop kills the processes, not the machine, so what was
        // written survives in the page cache; the outage is what the test is about, not disks.
        // Commit timestamps let a test read when a row really committed
        // (`pg_xact_commit_timestamp(xmin)`), e.g. to prove nothing committed while it was down.
        self.pg_ctl(&["start", "-w", "-t", "60", "-o", &options, "-l", path(&log)]);
    }

    /// Freezes the server as a stalled host would: SIGSTOP to the postmaster, then to every
    /// process it started. Connections stay open and whatever was sent waits unanswered; new
    /// connections are never served. Returns how many processes were stopped.
    pub fn freeze(&self) -> usize {
        let Some(postmaster) = self.postmaster() else {
            return 0;
        };
        kill(postmaster, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP {postmaster}: {e}"));
        // SIGSTOP takes effect after `kill` returns: a fork under way could still finish.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while state(postmaster) != Some('T') {
            assert!(
                std::time::Instant::now() < deadline,
                "the postmaster did not stop"
            );
            std::thread::yield_now();
        }
        // Stopped, the postmaster starts no one; a child it started just before is found by
        // the next scan. A child that ended meanwhile needs no stopping.
        let mut stopped = vec![postmaster];
        loop {
            let new: Vec<Pid> = children(postmaster)
                .into_iter()
                .filter(|pid| !stopped.contains(pid))
                .collect();
            if new.is_empty() {
                return stopped.len();
            }
            for pid in new {
                let _ = kill(pid, Signal::SIGSTOP);
                stopped.push(pid);
            }
        }
    }

    /// Undoes [`Cluster::freeze`]: SIGCONT to the postmaster and everything it started.
    pub fn thaw(&self) {
        let Some(postmaster) = self.postmaster() else {
            return;
        };
        for pid in std::iter::once(postmaster).chain(children(postmaster)) {
            // A process may have ended meanwhile.
            let _ = kill(pid, Signal::SIGCONT);
        }
    }

    /// The postmaster's process id, from its lock file.
    fn postmaster(&self) -> Option<Pid> {
        let lockfile = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        let pid = lockfile.lines().next()?.trim().parse().ok()?;
        Some(Pid::from_raw(pid))
    }

    fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.data();
        let mut all = vec!["-D", path(&data)];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all);
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            // The server's own working directory must be readable by its user.
            .current_dir(self.root.path())
            .output()
            .unwrap_or_else(|e| match self.run_as {
                Some(user) => panic!("cannot run {program} as {user} through runuser: {e}"),
                None => panic!("cannot run {program}: {e}"),
            });
        if !out.status.success() {
            panic!(
                "{program} {args:?} failed: {}\n{}\nserver log:\n{}",
                text(&out),
                self.root.path().display(),
                std::fs::read_to_string(self.root.path().join("server.log")).unwrap_or_default()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Already stopped is fine; the directory goes with `root`. A frozen server could not
        // act on the stop.
        self.thaw();
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", path(&data), "stop", "-m", "immediate", "-w"])
            .current_dir(self.root.path())
            .output();
    }
}

/// A process's state letter from `/proc` (`T`: stopped).
fn state(pid: Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The processes whose parent is `parent`, from `/proc`.
fn children(parent: Pid) -> Vec<Pid> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; the command name may itself hold spaces and `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(parent.as_raw()) {
            found.push(Pid::from_raw(pid));
        }
    }
    found
}

fn server_binaries() -> Option<PathBuf> {
    let has = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("ONCEBOX_PG_BIN") {
        return Some(PathBuf::from(dir)).filter(|d| has(d));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, dir)| has(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has(d)))
}

fn is_root() -> bool {
    // The owner of /proc/self is the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The uid and gid of `user`.
fn ids(user: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, user])
            .output()
            .unwrap_or_else(|e| panic!("cannot run id: {e}"));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| {
                panic!(
                    "the test runs as root and PostgreSQL refuses root, but there is no OS \
                     user {user:?} to run it as: {}",
                    text(&out)
                )
            })
    };
    (id("-u"), id("-g"))
}

/// A port nobody listens on right now. Another process could take it before the server binds;
/// the start then fails with the server's log, it does not hang.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::Cluster;

    #[test]
    fn cluster_stops_and_comes_back_on_the_same_port() {
        let Some(cluster) = Cluster::start() else {
            return;
        };
        let addr = ("127.0.0.1", cluster.port());
        assert!(TcpStream::connect(addr).is_ok(), "listening after start");
        cluster.stop_immediate();
        assert!(TcpStream::connect(addr).is_err(), "refused while stopped");
        cluster.resume();
        assert!(TcpStream::connect(addr).is_ok(), "listening again");
    }
}
