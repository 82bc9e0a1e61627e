//! A RabbitMQ node of a test's own, on free loopback ports, for what must not touch the shared
//! broker: a memory alarm blocks every publishing connection of its node, another test's too.
//! Started by `rabbitmq-server`, which runs the broker as its own user and takes that only
//! from root; shut down on drop.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private RabbitMQ node.
#[derive(Debug)]
pub struct PrivateRabbit {
    node: String,
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Why a node cannot be started here, if it cannot.
fn unable() -> Option<&'static str> {
    let found = |name: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain(["/usr/sbin".into()])
            .any(|dir| dir.join(name).is_file())
    };
    if !found("rabbitmq-server") || !found("rabbitmqctl") {
        return Some("rabbitmq-server and rabbitmqctl not found");
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Some("starting a RabbitMQ node needs root (its script runs it as its user)");
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl PrivateRabbit {
    /// `None` (skip, said on stderr) when a node cannot be started here; a failure under
    /// `ONCEBOX_REQUIRE_SERVICES=1`. The node is listening once [`PrivateRabbit::ready`]
    /// returns.
    pub fn start() -> Option<PrivateRabbit> {
        if let Some(why) = unable() {
            let required = std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(!required, "{why}, and ONCEBOX_REQUIRE_SERVICES=1");
            eprintln!("SKIPPED: {why}; this test starts its own RabbitMQ node");
            return None;
        }
        let (port, dist) = (free_port(), free_port());
        let node = format!(
            "oncebox-{}-{}@localhost",
            std::process::id(),
            rand::random::<u64>()
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!("listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .expect("the node's configuration");
        let owned = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(owned.success(), "the node's directory given to its user");
        let child = Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("RABBITMQ_CONFIG_FILE", &config)
            // Nothing of the host's own node's advanced settings (a listener among them).
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                dir.path().join("advanced.config"),
            )
            .env("RABBITMQ_MNESIA_BASE", dir.path().join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.path().join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.path().join("plugins"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rabbitmq-server");
        Some(PrivateRabbit {
            node,
            port,
            child,
            _dir: dir,
        })
    }

    /// Waits until the node listens (it was just started; a minute at most).
    pub async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the private RabbitMQ node never listened"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `rabbitmqctl -n NODE args…`, which must succeed; its output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("rabbitmqctl")
            .args(["-n", &self.node])
            .args(args)
            .output()
            .expect("rabbitmqctl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "rabbitmqctl {args:?}: {text}");
        text
    }

    /// Raises a memory alarm (`true`) or clears it, and waits until the node has (the command
    /// returns before the alarm reaches the node's connections).
    pub fn alarm(&self, on: bool) {
        let watermark = if on { "0.000001" } else { "0.4" };
        self.ctl(&["set_vm_memory_high_watermark", watermark]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self
            .ctl(&["eval", "rabbit_alarm:get_alarms()."])
            .contains("memory")
            != on
        {
            assert!(Instant::now() < deadline, "the alarm never turned {on}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node's client connections.
    pub fn connections(&self) -> usize {
        let listed = self.ctl(&["list_connections", "--silent", "name"]);
        listed.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-n", &self.node, "shutdown"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
