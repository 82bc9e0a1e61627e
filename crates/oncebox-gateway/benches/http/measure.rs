//! The HTTP benchmark's bookkeeping: what a run measured, CPU time per thread group from
//! Linux's schedstat, the disk's writes from its block-layer counters, and the rounds a phase
//! is split into.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use oncebox_sqlite::Inbox;

/// Per connection, the requests it sends in order: (event id, body).
pub type Load = Vec<Vec<(String, String)>>;

/// Round `round` of `rounds` of `load`: each connection's share of its own requests, in order.
pub fn chunk(load: &Load, round: usize, rounds: usize) -> Load {
    load.iter()
        .map(|mine| {
            let (from, to) = (
                mine.len() * round / rounds,
                mine.len() * (round + 1) / rounds,
            );
            mine[from..to].to_vec()
        })
        .collect()
}

/// What one phase measured on one target.
#[derive(Default)]
pub struct Run {
    pub requests: usize,
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
    pub statuses: BTreeMap<u16, usize>,
    pub replayed: usize,
    pub errors: usize,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile_ms(&self, p: usize) -> f64 {
        let rank = (self.latencies.len() * p)
            .div_ceil(100)
            .clamp(1, self.latencies.len().max(1));
        self.latencies
            .get(rank - 1)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    pub fn answers(&self) -> String {
        let mut parts: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        if self.replayed > 0 {
            parts.push(format!("replayed: {}", self.replayed));
        }
        if self.errors > 0 {
            parts.push(format!("no answer: {}", self.errors));
        }
        parts.join(", ")
    }
}

/// Nanoseconds this process's threads spent on a CPU and runnable but waiting for one, and
/// the part of the first spent by SQLite's threads (writer and checkpointer), from Linux's
/// per-thread `schedstat`; zeros elsewhere. On 2 cores the wait says how much the load
/// generator and the servers slow each other down.
#[derive(Clone, Copy, Default)]
pub struct Cpu {
    on: u64,
    waiting: u64,
    writer: u64,
    /// Time the writer thread was runnable but waiting for a CPU.
    writer_waiting: u64,
    checkpointer: u64,
    /// The servers' request threads and the load generator's.
    server: u64,
    load: u64,
}

pub fn cpu() -> Cpu {
    let mut total = Cpu::default();
    for oncebox_testkit::ThreadTime { name, on, waiting } in oncebox_testkit::thread_times() {
        total.on += on;
        total.waiting += waiting;
        match name.as_str() {
            "oncebox-writer" => {
                total.writer += on;
                total.writer_waiting += waiting;
            }
            "oncebox-ckpt" => total.checkpointer += on,
            "server" => total.server += on,
            "load" => total.load += on,
            _ => {}
        }
    }
    total
}

fn line(label: &str, run: &Run) {
    println!(
        "    {label:<9} {:>8.0} req/s   p50 {:>6.2} ms   p99 {:>6.2} ms   [{}]",
        run.rate(),
        run.percentile_ms(50),
        run.percentile_ms(99),
        run.answers()
    );
}

impl Run {
    /// Adds another round's run: requests, time, latencies and answers.
    fn absorb(&mut self, other: Run) {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        for (s, n) in other.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.replayed += other.replayed;
        self.errors += other.errors;
    }
}

impl Cpu {
    pub fn minus(self, before: Cpu) -> Cpu {
        Cpu {
            on: self.on.saturating_sub(before.on),
            waiting: self.waiting.saturating_sub(before.waiting),
            writer: self.writer.saturating_sub(before.writer),
            writer_waiting: self.writer_waiting.saturating_sub(before.writer_waiting),
            checkpointer: self.checkpointer.saturating_sub(before.checkpointer),
            server: self.server.saturating_sub(before.server),
            load: self.load.saturating_sub(before.load),
        }
    }

    fn plus(self, other: Cpu) -> Cpu {
        Cpu {
            on: self.on + other.on,
            waiting: self.waiting + other.waiting,
            writer: self.writer + other.writer,
            writer_waiting: self.writer_waiting + other.writer_waiting,
            checkpointer: self.checkpointer + other.checkpointer,
            server: self.server + other.server,
            load: self.load + other.load,
        }
    }
}

/// The block device holding the database, as Linux counts its work: what a new event costs the
/// disk (the WAL's pages, and the checkpoint's copies once written back) and how long its
/// writes took. The WAL's fsync waits behind those writes, so `COMMIT` grows with the bytes
/// every request makes the disk write, the checkpoint's included. The counters are the whole
/// device's: another program writing to it during a phase counts too. `None` where they cannot
/// be read (not Linux, or a filesystem with no block device of its own).
#[derive(Clone, Copy, Default)]
pub struct Disk {
    writes: u64,
    sectors: u64,
    write_ms: u64,
    flushes: u64,
}

impl Disk {
    /// `/sys/dev/block/MAJOR:MINOR/stat` of the device holding `dir`.
    pub fn stat_file(dir: &Path) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(dir).ok()?.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let file = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"));
        file.exists().then_some(file)
    }

    pub fn of(file: Option<&Path>) -> Option<Disk> {
        let text = std::fs::read_to_string(file?).ok()?;
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|n| n.parse().unwrap_or(0))
            .collect();
        // Fields 5–8 are the writes; 16 the flushes (kernels from 5.5 on).
        Some(Disk {
            writes: *f.get(4)?,
            sectors: *f.get(6)?,
            write_ms: *f.get(7)?,
            flushes: f.get(15).copied().unwrap_or(0),
        })
    }

    pub fn since(self, file: Option<&Path>) -> Option<Disk> {
        let now = Disk::of(file)?;
        Some(Disk {
            writes: now.writes.saturating_sub(self.writes),
            sectors: now.sectors.saturating_sub(self.sectors),
            write_ms: now.write_ms.saturating_sub(self.write_ms),
            flushes: now.flushes.saturating_sub(self.flushes),
        })
    }

    fn plus(self, other: Disk) -> Disk {
        Disk {
            writes: self.writes + other.writes,
            sectors: self.sectors + other.sectors,
            write_ms: self.write_ms + other.write_ms,
            flushes: self.flushes + other.flushes,
        }
    }
}

/// The SQLite writer's counters at one moment.
#[derive(Clone, Copy, Default)]
pub struct Mark {
    commits: u64,
    committed: u64,
    committing: Duration,
    /// Duplicates answered from the memory of recent answers, without a read.
    remembered: u64,
}

impl Mark {
    pub fn of(inbox: &Inbox) -> Mark {
        Mark {
            commits: inbox.stats().commits(),
            committed: inbox.stats().committed_requests(),
            committing: inbox.stats().commit_time(),
            remembered: inbox.stats().answered_from_memory(),
        }
    }

    /// What the writer did since this mark.
    pub fn since(self, inbox: &Inbox) -> Mark {
        let now = Mark::of(inbox);
        Mark {
            commits: now.commits - self.commits,
            committed: now.committed - self.committed,
            committing: now.committing.saturating_sub(self.committing),
            remembered: now.remembered - self.remembered,
        }
    }
}

/// One target's rounds in one phase.
#[derive(Default)]
pub struct Tally {
    pub run: Run,
    pub cpu: Cpu,
    writes: Mark,
    disk: Option<Disk>,
    /// Requests/s of each round, in order.
    pub rates: Vec<f64>,
}

impl Tally {
    pub fn add(&mut self, run: Run, cpu: Cpu, writes: Mark, disk: Option<Disk>) {
        self.disk = match (self.disk, disk) {
            (Some(a), Some(b)) => Some(a.plus(b)),
            (a, b) => a.or(b),
        };
        self.rates.push(run.rate());
        self.run.absorb(run);
        self.cpu = self.cpu.plus(cpu);
        self.writes = Mark {
            commits: self.writes.commits + writes.commits,
            committed: self.writes.committed + writes.committed,
            committing: self.writes.committing + writes.committing,
            remembered: self.writes.remembered + writes.remembered,
        };
    }

    /// The target's line: rate and latencies over all rounds, CPU per request and, where it
    /// wrote, the writer's share and its commits.
    pub fn print(&self, name: &str) {
        let mut latencies = self.run.latencies.clone();
        latencies.sort_unstable();
        let run = Run {
            requests: self.run.requests,
            elapsed: self.run.elapsed,
            latencies,
            statuses: self.run.statuses.clone(),
            replayed: self.run.replayed,
            errors: self.run.errors,
        };
        line(name, &run);
        let per = |ns: u64| ns as f64 / 1000.0 / self.run.requests.max(1) as f64;
        let c = &self.cpu;
        // CPU time over wall time: how many of the machine's cores this process kept busy.
        // Below the baseline's, the target left cores idle while its requests waited (on an
        // fsync, say); at the same share, it was bound by its CPU per request.
        let busy = c.on as f64 / self.run.elapsed.as_nanos().max(1) as f64;
        let mut detail = format!(
            "CPU per request {:.0} µs (request threads {:.0}, load generator {:.0}), {busy:.2} \
             cores busy, waiting for a CPU {:.0} µs",
            per(c.on),
            per(c.server),
            per(c.load),
            per(c.waiting)
        );
        let w = &self.writes;
        if w.commits > 0 {
            detail += &format!(
                "; SQLite writer {:.0} µs (waiting for a CPU {:.0} µs), checkpointer {:.0} µs; \
                 {} commits, {:.1} requests per commit, {:.2} ms in each COMMIT",
                per(c.writer),
                per(c.writer_waiting),
                per(c.checkpointer),
                w.commits,
                w.committed as f64 / w.commits as f64,
                w.committing.as_secs_f64() * 1000.0 / w.commits as f64
            );
        }
        // Which path answered the duplicates: the memory holds only the newest answers, and a
        // replay older than that is a reader's look (or the writer's, while looks do not pay).
        // The marks read the SQLite inbox: a target on another store shows none.
        if w.remembered > 0 {
            detail += &format!(
                "; {} of {} duplicates answered from memory",
                w.remembered, self.run.replayed
            );
        }
        println!("              {detail}");
        if let Some(d) = self.disk.filter(|d| d.sectors > 0 && w.commits > 0) {
            let n = self.run.requests.max(1) as f64;
            println!(
                "              disk: {:.1} KiB written per request ({:.1} MB/s), {:.2} ms per \
                 write on average, {:.2} flushes per commit",
                d.sectors as f64 * 512.0 / 1024.0 / n,
                d.sectors as f64 * 512.0 / 1e6 / self.run.elapsed.as_secs_f64().max(1e-9),
                d.write_ms as f64 / d.writes.max(1) as f64,
                d.flushes as f64 / w.commits as f64
            );
        }
    }
}
