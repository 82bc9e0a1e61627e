//! Where the storage threads run: a placement on one CPU keeps the writer and the checkpointer
//! there, and `Anywhere` leaves them where the process may run. Checked in a child process of
//! its own, so that no other test's storage threads are counted.

use std::process::Command;

use oncebox_sqlite::{Inbox, Options, Placement};
use oncebox_testkit::{process_cpus, thread_cpus};

const CHILD: &str = "ONCEBOX_PLACEMENT_CHILD";

#[test]
#[ignore = "run by storage_threads_stay_where_placed in a process of its own"]
fn placement_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let everywhere = process_cpus().unwrap();
    // The first CPU the process may use ("0-1", "2,5" → 0, 2).
    let first = everywhere
        .split([',', '-'])
        .next()
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap();
    {
        let options = Options::new(dir.path().join("one.db")).placement(Placement::Cpu(first));
        let _inbox = Inbox::open(options).unwrap();
        for thread in ["oncebox-writer", "oncebox-ckpt"] {
            assert_eq!(thread_cpus(thread), [first.to_string()], "{thread}");
        }
    }
    // Dropping the inbox joined its threads: any thread of that name now is the next one's.
    let options = Options::new(dir.path().join("any.db")).placement(Placement::Anywhere);
    let _inbox = Inbox::open(options).unwrap();
    for thread in ["oncebox-writer", "oncebox-ckpt"] {
        assert_eq!(
            thread_cpus(thread),
            std::slice::from_ref(&everywhere),
            "{thread}"
        );
    }
}

#[test]
fn storage_threads_stay_where_placed() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "placement::placement_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        // "1 passed": the child ran the check rather than filtering it out.
        out.status.success() && stdout.contains("1 passed"),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
