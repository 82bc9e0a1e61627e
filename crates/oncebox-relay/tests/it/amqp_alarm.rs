//! A RabbitMQ memory alarm under a route: the broker blocks the publishing connection and
//! reads nothing it sends until the alarm clears. The publish that meets the alarm waits out
//! its confirm (an unknown outcome); the next ones are not sent, on the same connection, kept
//! for the alarm's end; once it clears, every delivery goes. Before, each attempt opened a
//! new connection, which the broker blocked at its first publish and held open with its
//! message: every attempt an unknown outcome (uncertain on a route that does not honour the
//! key), and connections piling up for as long as the alarm lasted. On a private broker of the
//! test's own, whose alarm no other test meets.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::run;

use crate::{World, broker_route, with_query};

/// A RabbitMQ node of the test's own on free loopback ports, shut down on drop.
struct PrivateRabbit {
    node: String,
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Why the test cannot start its broker here, if it cannot: skipped, or a failure under
/// `ONCEBOX_REQUIRE_SERVICES=1`.
fn unable() -> Option<&'static str> {
    let found = |name: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain(["/usr/sbin".into()])
            .any(|dir| dir.join(name).is_file())
    };
    if !found("rabbitmq-server") || !found("rabbitmqctl") {
        return Some("rabbitmq-server and rabbitmqctl not found");
    }
    // The server's script runs the broker as its own user, and only root may ask it to.
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
    fn start() -> Option<PrivateRabbit> {
        if let Some(why) = unable() {
            let required = std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(!required, "{why}, and ONCEBOX_REQUIRE_SERVICES=1");
            eprintln!("SKIPPED: {why}; this test starts its own RabbitMQ node");
            return None;
        }
        let (port, dist) = (free_port(), free_port());
        let node = format!("oncebox-{}@localhost", uuid::Uuid::new_v4().simple());
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("rabbitmq.conf");
        std::fs::write(
            &config,
            format!("listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .unwrap();
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

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// A connection, once the node takes one (it was just started).
    async fn connect(&self) -> Connection {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match Connection::connect(&self.url(), ConnectionProperties::default()).await {
                Ok(c) => return c,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the private RabbitMQ node never took a client: {e}"),
            }
        }
    }

    /// `rabbitmqctl -n NODE args…`, which must succeed; its output.
    fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("rabbitmqctl")
            .args(["-n", &self.node])
            .args(args)
            .output()
            .expect("rabbitmqctl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "rabbitmqctl {args:?}: {text}");
        text
    }

    /// The node's client connections.
    fn connections(&self) -> usize {
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

#[test]
fn publishes_during_a_memory_alarm_are_not_sent_and_go_once_it_clears() {
    let Some(rabbit) = PrivateRabbit::start() else {
        return;
    };
    run(async move {
        let reader = rabbit.connect().await;
        let channel = reader.create_channel().await.unwrap();
        let queue = "alarmed";
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let url = with_query(&rabbit.url(), &[("exchange", ""), ("routing_key", queue)]);
        let mut route = broker_route("q", &url, true);
        route.timeout = Duration::from_secs(2);
        let w = World::new();
        let relay = w.relay(vec![route]);
        w.accept("evt_1", &["q"]).await;
        assert_eq!(relay.run_once().await.unwrap().delivered, 1);
        let before = rabbit.connections();

        rabbit.ctl(&["set_vm_memory_high_watermark", "0.000001"]);
        // The publish that meets the alarm: blocked, no confirm in time.
        w.accept("evt_2", &["q"]).await;
        let met = relay.run_once().await.unwrap();
        assert_eq!(met.delivered, 0, "{met:?}");
        let d2 = w.delivery("evt_2").await;
        assert_eq!(d2.state, DeliveryState::Retrying, "{d2:?}");
        // The next is not sent, on the connection kept for the alarm's end.
        w.accept("evt_3", &["q"]).await;
        assert_eq!(relay.run_once().await.unwrap().delivered, 0);
        let d3 = w.delivery("evt_3").await;
        let error = d3.last_error.clone().unwrap_or_default();
        assert!(error.contains("blocks publishing"), "{d3:?}");
        assert_eq!(rabbit.connections(), before, "no connection added");

        rabbit.ctl(&["set_vm_memory_high_watermark", "0.4"]);
        // Once the broker says the connection is unblocked, both go.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            w.clock.advance(Duration::from_secs(3600));
            relay.run_once().await.unwrap();
            let states = (
                w.delivery("evt_2").await.state,
                w.delivery("evt_3").await.state,
            );
            if states == (DeliveryState::Delivered, DeliveryState::Delivered) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not delivered after the alarm: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Every key reached the queue (evt_2's first publish, confirmed late, maybe twice:
        // the route honours the key).
        let mut ids = Vec::new();
        while let Some(m) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            ids.push(
                m.delivery
                    .properties
                    .message_id()
                    .clone()
                    .unwrap()
                    .to_string(),
            );
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids, ["shop:evt_1", "shop:evt_2", "shop:evt_3"]);
    });
}
