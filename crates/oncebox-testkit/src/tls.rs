//! A test certificate authority and a server certificate it signed for 127.0.0.1, made with
//! `openssl`, for servers the tests start with TLS (Redis, NATS).

use std::path::Path;
use std::process::Command;

/// Writes `ca.pem`, `server.pem` and `server.key` into `dir`; `None` (skip, or a failure
/// under `ONCEBOX_REQUIRE_SERVICES=1`) without `openssl`.
pub fn certificates(dir: &Path) -> Option<()> {
    let openssl = crate::require_program("/usr/bin/openssl")?;
    let run = |args: &[&str]| {
        let out = Command::new(&openssl)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=oncebox test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("san"), "subjectAltName=IP:127.0.0.1\n").expect("write san");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san",
    ]);
    Some(())
}
