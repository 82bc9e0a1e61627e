//! Output to a reader that went away (`oncebox check | head -0`): the command did its work, and
//! the closed pipe is no error to report; nor does it change the command's verdict (the
//! write's `BrokenPipe` used to end a refused `send`, taken for success).

use std::process::{Command, Output, Stdio};

use crate::support::{oncebox, serve_with, text};

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let out = unread(dir.path(), &["check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

const CONFIG: &str = r#"
[sources.shop]
signature = "none"
event_id = { header = "idempotency-key" }
"#;

/// `oncebox args…` in `dir`, with a standard output whose reader closed before it started:
/// its first write to stdout fails with EPIPE, which is the fault under test (a reader closing
/// later might race the write).
fn unread(dir: &std::path::Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(args)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run oncebox")
}

#[test]
fn a_refused_send_exits_5_though_its_output_is_unread() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), CONFIG).unwrap();
    let server = serve_with(dir.path(), &["--no-relay", "--listen", "127.0.0.1:0"]);
    let url = server.1.clone();
    let first = oncebox(
        dir.path(),
        &["send", "shop", "--id", "evt_1", "--url", &url],
    );
    assert!(first.status.success(), "{}", text(&first));
    let other_body = [
        "send",
        "shop",
        "--id",
        "evt_1",
        "--body",
        r#"{"x":2}"#,
        "--url",
        &url,
    ];
    // Read, the answer is a refusal: 422, the key reused with another body.
    let read = oncebox(dir.path(), &other_body);
    assert!(text(&read).contains("422"), "{}", text(&read));
    assert_eq!(read.status.code(), Some(5), "{}", text(&read));
    let unread_refusal = unread(dir.path(), &other_body);
    let unread_new = unread(
        dir.path(),
        &["send", "shop", "--id", "evt_2", "--url", &url],
    );
    server.stop();
    assert_eq!(
        unread_refusal.status.code(),
        Some(5),
        "{}",
        text(&unread_refusal)
    );
    assert_eq!(unread_new.status.code(), Some(0), "{}", text(&unread_new));
}
