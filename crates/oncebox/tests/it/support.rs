//! Support for tests that run `oncebox serve` as a child process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A running `oncebox serve`, its base URL and the file its log goes to (if it has one);
/// killed when dropped if still running.
pub struct Server(pub Child, pub String, pub Option<PathBuf>);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `oncebox serve` in `dir` (reading `dir/oncebox.toml`) and waits for its address.
pub fn serve(dir: &Path) -> Server {
    serve_with(dir, &[])
}

/// `oncebox serve` with extra flags, once it printed its address.
pub fn serve_with(dir: &Path, flags: &[&str]) -> Server {
    serve_by(Command::new(env!("CARGO_BIN_EXE_oncebox")), dir, flags)
}

/// [`serve_with`] through `command`: the binary itself, or a program that runs it (such as
/// `faketime`).
pub fn serve_by(mut command: Command, dir: &Path, flags: &[&str]) -> Server {
    // The log is kept for a failing stop to show.
    let log = dir.join("serve.log");
    let mut child = command
        .arg("serve")
        .args(flags)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("address line").unwrap();
        if let Some(rest) = line.strip_prefix("oncebox listening on ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Server(child, addr, Some(log))
}

/// Runs `oncebox args…` in `dir` as a user would, with no configuration from this process's
/// environment.
pub fn oncebox(dir: &Path, args: &[&str]) -> Output {
    oncebox_with_env(dir, &[], args)
}

/// As [`oncebox`], with `vars` set on top of this process's environment (which holds the
/// suites' own `ONCEBOX_POSTGRES_URL` and the like: those must keep working).
pub fn oncebox_with_env(dir: &Path, vars: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(args)
        .current_dir(dir)
        .env_remove("ONCEBOX_CONFIG")
        .env_remove("ONCEBOX_DATABASE")
        .env_remove("RUST_BACKTRACE")
        .envs(vars.iter().copied())
        .output()
        .expect("run oncebox")
}

/// Runs a command that must exit 0 and print one JSON document on stdout.
pub fn json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = oncebox(dir, args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {}", text(&out)))
}

/// The one document a failed command printed on stdout under `--output json`, checked to say
/// `ok: false` and exit `code`.
pub fn failure_document(out: &Output, code: i32) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON document ({e}): {}", text(out)));
    assert_eq!(
        (&doc["ok"], &doc["code"]),
        (&false.into(), &code.into()),
        "{doc}"
    );
    doc
}

/// What a command printed, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl Server {
    /// SIGTERM: the relay finishes and records the attempt in hand, then the process exits.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        let log = self.2.as_ref().map(std::fs::read_to_string);
        assert!(
            status.success(),
            "oncebox serve: {status}; its log: {log:?}"
        );
    }

    /// SIGKILL, as a crash.
    pub fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}
