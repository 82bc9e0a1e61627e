//! A PostgreSQL node whose clock is set a year wrong, for real (libfaketime), from the start of
//! its boot, so that no anchor of an earlier purge bounds it: only the server's clock, which
//! every node shares, can tell. A year ahead, its purge runs by the server's time and anchors
//! nothing; a year behind, it dates the records it finishes by the server's time.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::schema::Schema;
use crate::support::{oncebox, serve_by, text};

/// Where Debian's libfaketime keeps the library its `faketime` preloads.
fn libfaketime() -> String {
    format!(
        "/usr/lib/{}-linux-gnu/faketime/libfaketime.so.1",
        std::env::consts::ARCH
    )
}

/// A directory whose `oncebox.toml` names one unsigned source on a schema of its own.
struct Node {
    rt: tokio::runtime::Runtime,
    schema: Schema,
    dir: tempfile::TempDir,
    faketime: std::path::PathBuf,
}

impl Node {
    fn new() -> Option<Node> {
        let faketime = oncebox_testkit::require_program("/usr/bin/faketime")?;
        let base = oncebox_testkit::service_url("ONCEBOX_POSTGRES_URL")?;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let schema = rt.block_on(Schema::create(&base, "skew"));
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"{}\"\n\n[sources.shop]\nsignature = \"none\"\n",
            schema.url
        );
        std::fs::write(dir.path().join("oncebox.toml"), config).unwrap();
        Some(Node {
            rt,
            schema,
            dir,
            faketime,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The binary with its wall clock moved by `offset` (`+365d`) by libfaketime, preloaded
    /// into the binary itself: the `faketime` wrapper would run it as a child of its own, and
    /// a stop signal sent to the wrapper would never reach it.
    fn moved(&self, offset: &str) -> Command {
        let lib = libfaketime();
        assert!(
            Path::new(&lib).is_file(),
            "{lib}, from the package that installs {}, is missing",
            self.faketime.display()
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_oncebox"));
        c.env("LD_PRELOAD", lib)
            .env("FAKETIME", offset)
            // A wall clock set wrong moves neither the monotonic clocks nor the time since
            // boot; libfaketime fakes those too unless told not to.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env_remove("ONCEBOX_DATABASE");
        c
    }

    /// `serve` through `command`, two events sent to it, and its log once stopped.
    fn two_events(&self, command: Command) -> String {
        let server = serve_by(command, self.path(), &["--no-relay"]);
        for id in ["evt_1", "evt_2"] {
            let out = oncebox(
                self.path(),
                &["send", "shop", "--id", id, "--url", &server.1],
            );
            assert!(out.status.success(), "{}", text(&out));
        }
        let log = server.2.clone().unwrap();
        server.stop();
        std::fs::read_to_string(log).unwrap()
    }

    fn scalar(&self, sql: &str) -> i64 {
        self.rt.block_on(async {
            let pool = self.schema.pool().await;
            oncebox_postgres::sqlx::query_scalar(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        })
    }

    fn purge(&self, mut command: Command) -> (Value, String) {
        let out: Output = command
            .args(["purge", "--output", "json"])
            .current_dir(self.path())
            .env_remove("ONCEBOX_CONFIG")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let json =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
        (json, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn a_postgres_node_a_year_ahead_purges_by_the_servers_clock() {
    let Some(node) = Node::new() else {
        return;
    };
    node.two_events(Command::new(env!("CARGO_BIN_EXE_oncebox")));
    // `serve` purged at start and anchored this boot: forgotten, so the jump alone decides.
    node.scalar(
        "WITH gone AS (DELETE FROM oncebox_purge_anchors RETURNING 1) SELECT count(*) FROM gone",
    );
    let (purged, said) = node.purge(node.moved("+365d"));
    assert_eq!(purged, json!({ "purged": 0 }), "{said}");
    // The jump reached the binary, which said so at open (leases) and at the purge.
    for part in [
        "its leases (deliveries in flight, two-phase keys) are judged by the server's clock",
        "purging by the server's time",
    ] {
        assert!(said.contains(part), "{part:?} not said: {said}");
    }
    assert_eq!(
        node.scalar("SELECT count(*) FROM oncebox_inbox"),
        2,
        "both kept"
    );
    assert_eq!(
        node.scalar("SELECT count(*) FROM oncebox_purge_anchors"),
        0,
        "no anchor from the wrong clock"
    );
    // At the right time the purge's open anchors the boot, and still nothing is due.
    let right = node.purge(Command::new(env!("CARGO_BIN_EXE_oncebox")));
    assert_eq!(right.0, json!({ "purged": 0 }), "{}", right.1);
    assert_eq!(node.scalar("SELECT count(*) FROM oncebox_purge_anchors"), 1);
}

#[test]
fn a_postgres_node_a_year_behind_dates_its_records_by_the_servers_clock() {
    let Some(node) = Node::new() else {
        return;
    };
    let log = node.two_events(node.moved("-365d"));
    assert!(
        log.contains("behind the database server's"),
        "the jump reached the binary, which said so: {log}"
    );
    // Dated a year early, both would be past a 7-day retention for every node's purge.
    let early = node.scalar(
        "SELECT count(*) FROM oncebox_inbox \
         WHERE completed_at < (extract(epoch FROM now() - interval '1 hour') * 1000)::bigint",
    );
    assert_eq!(early, 0, "no record dated early");
    assert_eq!(node.scalar("SELECT count(*) FROM oncebox_inbox"), 2);
    let (purged, said) = node.purge(Command::new(env!("CARGO_BIN_EXE_oncebox")));
    assert_eq!(purged, json!({ "purged": 0 }), "{said}");
}
