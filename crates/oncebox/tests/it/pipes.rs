//! Output to a reader that went away (`oncebox check | head -0`): the command did its work, and
//! the closed pipe is no error to report.

use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    // Closed before the process starts: its first write to stdout fails with EPIPE, which
    // is the fault under test (a reader closing later might race the write).
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .arg("check")
        .current_dir(dir.path())
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}
