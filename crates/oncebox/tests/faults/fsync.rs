//! SQLite whose fsync fails: `oncebox serve` runs under `strace`, which answers every
//! `fsync`/`fdatasync` from the N-th on with EIO. New events are refused with a 503 problem
//! (never a 2xx without a durable commit); restarted without the fault, retries apply each
//! once. Every event is routed, with no relay (`outbox.rs`): each stored event must hold its
//! one delivery.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oncebox_testkit::child::{Proc, Spec, until};
use oncebox_testkit::history::{History, Outcome, key};

use crate::outbox;
use crate::table::{Report, Scenario, scale};
use crate::world::{self, PATIENCE, StoreCounts, block_on};

pub const SQLITE_FSYNC_EIO: Scenario = Scenario {
    name: "storage: SQLite fsync EIO",
    backend: "sqlite",
    run: fsync_eio,
};

const SOURCE: &str = "fsync";

/// The fsync calls that succeed before the fault: enough for the store to open and commit a few
/// events first (each commit syncs the write-ahead log once or twice).
const GOOD_SYNCS: u32 = 40;

/// `strace`, or `None` after saying the scenario skips (`why` it needs it); a failure under
/// `ONCEBOX_REQUIRE_SERVICES=1`.
pub fn strace_or_skip(why: &str) -> Option<std::path::PathBuf> {
    let found = strace();
    if found.is_none() {
        let why = format!("strace not found: {why}");
        if std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
            panic!("{why}; ONCEBOX_REQUIRE_SERVICES=1 makes this a failure (install strace)");
        }
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// `strace` on the PATH or in the usual directories.
fn strace() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            std::path::PathBuf::from("/usr/bin"),
            std::path::PathBuf::from("/bin"),
        ])
        .map(|dir| dir.join("strace"))
        .find(|p| p.is_file())
}

/// `spec` (the gateway) run under `strace` injecting EIO into every sync from the
/// `GOOD_SYNCS`-th on.
fn under_strace(strace: &Path, spec: Spec) -> Spec {
    syncs_faulted(strace, spec, &format!("error=EIO:when={GOOD_SYNCS}+"))
}

/// `spec` run under `strace` with `fault` (strace's `inject=` tampering, e.g. `error=EIO` or
/// `delay_exit=20000`) on its `fsync` and `fdatasync` calls. Only those calls stop the
/// process (seccomp-bpf): the rest run at full speed.
pub fn syncs_faulted(strace: &Path, spec: Spec, fault: &str) -> Spec {
    let inject = format!("inject=fsync,fdatasync:{fault}");
    let mut args: Vec<String> = ["-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", "-e"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    args.extend(["trace=fsync,fdatasync".to_owned(), "-e".to_owned(), inject]);
    args.push(spec.program.display().to_string());
    args.extend(spec.args.iter().cloned());
    Spec {
        program: strace.to_owned(),
        args,
        ..spec
    }
}

/// Kills the gateway `strace` runs (its only child), then waits for `strace` to end.
pub fn kill_traced(p: &mut Proc) {
    let pid = p.pid().as_raw();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace() {
        let child = nix::unistd::Pid::from_raw(child.parse().expect("a pid"));
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    }
    p.wait();
}

/// One delivery of event `id`; returns its outcome and whether the answer was a 503 problem
/// saying the store is unavailable.
async fn deliver(c: &reqwest::Client, history: &History, base: &str, id: &str) -> (Outcome, bool) {
    let op = history.invoke(key(SOURCE, id), "v1", None);
    let sent = c
        .post(format!("{base}/v1/sources/{SOURCE}/events"))
        .header("content-type", "application/json")
        .body(world::body(id, "v1"))
        .send()
        .await;
    let (outcome, unavailable) = match sent {
        Ok(r) => {
            let status = r.status().as_u16();
            let replayed = r.headers().contains_key("idempotent-replayed");
            let problem = r
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
            let text = r.text().await.unwrap_or_default();
            let unavailable = status == 503 && problem && text.contains("unavailable");
            (Outcome::http(status, replayed), unavailable)
        }
        Err(e) => (Outcome::Info(format!("no answer: {e}")), false),
    };
    op.end(outcome.clone());
    (outcome, unavailable)
}

/// Events one after another until the fault starts (the first 503); then more events, every
/// one refused; then the gateway again without `strace`, and retries until each is acknowledged.
fn fsync_eio() -> Option<Report> {
    let strace = strace_or_skip("this scenario injects EIO into fsync with it")?;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fsync.db");
    let database = format!("sqlite://{}", db.display());
    let history = Arc::new(History::new());
    Some(block_on(Duration::from_secs(120), async {
        outbox::configure(dir.path(), SOURCE);
        let spec = world::serve(dir.path(), &database, "127.0.0.1:0", outbox::NO_RELAY);
        let mut traced = under_strace(&strace, spec.clone()).start();
        let base = world::url(&traced);
        let c = world::client();
        // Before the fault: each event acknowledged until the syncs run out.
        let mut committed = 0;
        let mut eio = 0;
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let (o, unavailable) = deliver(&c, &history, &base, &format!("good{committed}")).await;
            match o {
                Outcome::Ok { replayed: false } => committed += 1,
                _ if unavailable => {
                    eio += 1;
                    break;
                }
                other => panic!("before the fault: {other:?}"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the fault never started"
            );
        }
        assert!(committed > 0, "no commit succeeded before the fault");
        // During the fault: nothing new is acknowledged, committed keys may replay.
        let fresh = scale(10);
        for i in 0..fresh {
            let (o, unavailable) = deliver(&c, &history, &base, &format!("bad{i}")).await;
            assert!(
                unavailable,
                "bad{i} while fsync fails: {o:?}, not a 503 unavailable problem"
            );
            eio += 1;
        }
        tokio::task::block_in_place(|| kill_traced(&mut traced));
        let mut healthy = spec.start();
        let base = world::url(&healthy);
        world::drain(&history, &base, 4).await;
        // Every acknowledgement before the fault still answers as a replay.
        for i in 0..committed {
            let o = world::deliver(&c, &history, &base, SOURCE, &format!("good{i}"), "v1").await;
            assert_eq!(o, Outcome::Ok { replayed: true }, "good{i} after restart");
        }
        healthy.terminate();
        until("the gateway released the database", PATIENCE, || {
            !healthy.running()
        });
        let store = StoreCounts::new(&db, None).await;
        let (figures, queued) = outbox::figures(&history.ops(), &store).await;
        Report {
            figures,
            exercised: eio as u64,
            what: format!(
                "{eio} answered 503 under fsync EIO, {committed} committed before, {queued} \
                 deliveries queued"
            ),
            expected_unresolved: 0,
        }
    }))
}
