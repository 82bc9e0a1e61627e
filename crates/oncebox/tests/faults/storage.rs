//! SQLite under storage faults, with `oncebox serve` on the file: the write lock held by
//! another connection, and the disk full (a 2 MiB tmpfs). Every event is routed, with no relay
//! (`outbox.rs`), so each stored event must hold its one delivery.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oncebox_sqlite::rusqlite::Connection;
use oncebox_testkit::history::{History, Outcome};

use crate::outbox;
use crate::table::{Report, Scenario, scale};
use crate::world::{self, StoreCounts, block_on};

/// The senders' source.
const SOURCE: &str = "disk";

pub const SQLITE_LOCKED: Scenario = Scenario {
    name: "storage: SQLite write lock held",
    backend: "sqlite",
    run: || Some(locked()),
};

pub const DISK_FULL: Scenario = Scenario {
    name: "storage: disk full (tmpfs)",
    backend: "sqlite",
    run: disk_full,
};

/// Senders deliver `n` events with ids `{prefix}{i}` at once; returns their outcomes.
async fn burst(
    history: &Arc<History>,
    base: &str,
    prefix: &str,
    n: usize,
    size: usize,
) -> Vec<Outcome> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (history, base, id) = (history.clone(), base.to_owned(), format!("{prefix}{i}"));
            // The tag carries padding, so a disk fills with few events.
            let tag = format!("v1{}", "x".repeat(size));
            tokio::spawn(async move {
                world::deliver(&world::client(), &history, &base, SOURCE, &id, &tag).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Another connection holds SQLite's write lock (`BEGIN IMMEDIATE`) past the store's busy
/// timeout: new events are refused with 503 while committed ones still answer as replays
/// (read from a reader); after the lock goes, retries apply every new event once.
fn locked() -> Report {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locked.db");
    let database = format!("sqlite://{}", db.display());
    let history = Arc::new(History::new());
    block_on(Duration::from_secs(90), async {
        outbox::configure(dir.path(), SOURCE);
        let spec = world::serve(dir.path(), &database, "127.0.0.1:0", outbox::NO_RELAY);
        let mut server = spec.start();
        let base = world::url(&server);
        let n = scale(10);
        burst(&history, &base, "warm", n, 0).await;
        let holder = Connection::open(&db).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let fresh = burst(&history, &base, "new", n, 0);
        let again = burst(&history, &base, "warm", n, 0);
        let (fresh, again) = tokio::join!(fresh, again);
        holder.execute_batch("ROLLBACK").unwrap();
        drop(holder);
        let refused = fresh
            .iter()
            .filter(|o| **o == Outcome::Info("HTTP 503".into()))
            .count();
        assert!(
            fresh.iter().all(|o| !matches!(o, Outcome::Ok { .. })),
            "a new event acknowledged while the write lock was held: {fresh:?}"
        );
        // Each told to come back (503), not cut off or answered 500.
        assert_eq!(refused, n, "new events under the lock: {fresh:?}");
        let replays = again
            .iter()
            .filter(|o| **o == Outcome::Ok { replayed: true })
            .count();
        assert_eq!(
            replays, n,
            "committed events answered as replays under the lock: {again:?}"
        );
        world::drain(&history, &base, 4).await;
        server.terminate();
        let store = StoreCounts::new(&db, None).await;
        let (figures, queued) = outbox::figures(&history.ops(), &store).await;
        Report {
            figures,
            exercised: refused as u64,
            what: format!(
                "{refused} refused 503 under the lock, {replays} replays served, {queued} \
                 deliveries queued"
            ),
            expected_unresolved: 0,
        }
    })
}

/// A tmpfs mounted for the scenario, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// Fills the file system at `dir` with one file, as far as it goes.
fn fill(dir: &Path) -> std::fs::File {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.flush();
    f
}

/// The database on a 2 MiB tmpfs that another file fills: events are refused (never a 2xx
/// without a commit); once space is freed, retries apply each once and the file is intact.
fn disk_full() -> Option<Report> {
    let fs = match Tmpfs::mount("2m") {
        Ok(fs) => fs,
        Err(why) => {
            let why = format!("cannot mount a tmpfs (needs root): {why}");
            if std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
                panic!("{why}; ONCEBOX_REQUIRE_SERVICES=1 makes this a failure");
            }
            eprintln!("SKIPPED: {why}");
            return None;
        }
    };
    let db = fs.0.path().join("full.db");
    let database = format!("sqlite://{}", db.display());
    let logs = tempfile::tempdir().unwrap();
    let history = Arc::new(History::new());
    Some(block_on(Duration::from_secs(90), async {
        outbox::configure(logs.path(), SOURCE);
        let spec = world::serve(logs.path(), &database, "127.0.0.1:0", outbox::NO_RELAY);
        let mut server = spec.start();
        let base = world::url(&server);
        burst(&history, &base, "warm", 10, 0).await;
        let filler = fill(fs.0.path());
        let mut refused = 0;
        for round in 0..scale(20) {
            let out = burst(&history, &base, &format!("full{round}-"), 8, 8192).await;
            for o in out.iter().filter(|o| !matches!(o, Outcome::Ok { .. })) {
                // A full disk is the store's trouble, not the request's: 503 (retry later),
                // never a 4xx that tells the sender to drop the event, nor a 500.
                assert_eq!(
                    *o,
                    Outcome::Info("HTTP 503".into()),
                    "a full disk answered {o:?}"
                );
                refused += 1;
            }
            if refused >= 8 {
                break;
            }
        }
        // Unready while the disk is full, as every event is refused; ready once it is not.
        let unready = ready(&base).await;
        drop(filler);
        std::fs::remove_file(fs.0.path().join("filler")).unwrap();
        assert_eq!(unready, 503, "/readyz with the disk full");
        assert_eq!(ready(&base).await, 200, "/readyz with room again");
        world::drain(&history, &base, 4).await;
        server.terminate();
        let store = StoreCounts::new(&db, None).await;
        let (figures, queued) = outbox::figures(&history.ops(), &store).await;
        Report {
            figures,
            exercised: refused as u64,
            what: format!("{refused} refused while the disk was full, {queued} deliveries queued"),
            expected_unresolved: 0,
        }
    }))
}

/// `GET /readyz`'s status.
async fn ready(base: &str) -> u16 {
    let answer = world::client()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("/readyz answers");
    answer.status().as_u16()
}
