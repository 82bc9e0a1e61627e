//! `oncebox consume` as a user runs it, against the real NATS JetStream: each message stored
//! once with its route's delivery, the source's ordering guard holding for broker messages as
//! for webhooks (a late version stored stale and not routed), a message whose guard field has
//! the wrong type quarantined, and a clean stop on SIGTERM that logs the consumer's totals.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use serde_json::Value;

use crate::support::{oncebox, text};

/// One RabbitMQ consumer of queue `orders` for source `shop`.
const ORDERS: &str = "[sources.shop]\nsignature = \"none\"\n\n[consumers.orders]\nsource = \"shop\"\n\
                      queue = \"orders\"\nkey = \"message-id\"\nquarantine = \"oncebox.quarantine\"\n";

fn config(stream: &str, subject: &str, quarantine: &str) -> String {
    format!(
        r#"
[sources.shop]
signature = "none"
order = {{ entity = "/order", version = "/v" }}

[routes.hooks]
sources = ["shop"]
url = "http://127.0.0.1:9/hook"

[consumers.orders]
source = "shop"
stream = "{stream}"
subject = "{subject}.>"
key = {{ pointer = "/id" }}
quarantine = "{quarantine}"
retry_delay = "100ms"
"#
    )
}

/// Stored events by id: the state `oncebox events` shows.
fn events(dir: &Path) -> Vec<(String, String)> {
    let out = oncebox(dir, &["events", "--output", "json"]);
    assert!(out.status.success(), "{}", crate::support::text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut found: Vec<_> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_owned(),
                e["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    found.sort();
    found
}

fn deliveries(dir: &Path) -> Vec<String> {
    let out = oncebox(dir, &["deliveries", "list", "--output", "json"]);
    assert!(out.status.success(), "{}", crate::support::text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["event_id"].as_str().unwrap().to_owned())
        .collect()
}

/// A consumer process, killed when dropped.
pub(crate) struct Consuming(pub(crate) Child);

impl Drop for Consuming {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn consume_stores_once_and_keeps_the_sources_ordering_guard() {
    let Some(url) = oncebox_testkit::service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (name, subject) = (format!("OBC_{tag}"), format!("obc.{tag}"));
        let (qname, quarantine) = (format!("OBQ_{tag}"), format!("obq.{tag}"));
        let js = jetstream::new(async_nats::connect(&url).await.expect("NATS"));
        for (n, s) in [
            (&name, format!("{subject}.>")),
            (&qname, quarantine.clone()),
        ] {
            js.create_stream(stream::Config {
                name: n.clone(),
                subjects: vec![s],
                ..Default::default()
            })
            .await
            .expect("stream");
        }
        // Version 2 of order o1 first, then the late version 1, one duplicate and one whose
        // version is not an integer.
        for body in [
            r#"{"id":"e2","order":"o1","v":2}"#,
            r#"{"id":"e1","order":"o1","v":1}"#,
            r#"{"id":"e2","order":"o1","v":2}"#,
            r#"{"id":"e3","order":"o1","v":"3"}"#,
        ] {
            js.publish(format!("{subject}.paid"), body.into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("oncebox.toml"),
            config(&name, &subject, &quarantine),
        )
        .unwrap();
        // `consume` opens an existing store only; `migrate` creates it, as an operator would.
        assert!(oncebox(dir.path(), &["migrate"]).status.success());
        let log = dir.path().join("consume.log");
        let child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["consume", "--nats", &url])
            .current_dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_AMQP_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let consuming = Consuming(child);

        // Done when the two events are stored and the bad message reached the quarantine.
        let mut quarantined = js.get_stream(&qname).await.expect("quarantine stream");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = quarantined.info().await.expect("info").state.messages;
            if held == 1 && dir.path().join("oncebox.db").exists() && events(dir.path()).len() == 2
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not consumed in time; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let mut child = consuming;
        let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = child.0.wait().unwrap();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "consume: {status}; log: {log}");
        // What it did, in its log: `consume` serves no metrics.
        let totals = log.lines().find(|l| l.contains("consumer totals"));
        let totals = totals.unwrap_or_else(|| panic!("no totals logged: {log}"));
        for count in ["applied=1 ", "duplicates=1 ", "stale=1 ", "quarantined=1 "] {
            assert!(totals.contains(count), "{count}: {totals}");
        }

        assert_eq!(
            events(dir.path()),
            [
                ("e1".to_owned(), "stale".to_owned()),
                ("e2".to_owned(), "completed".to_owned())
            ],
            "the late version is stored stale"
        );
        assert_eq!(
            deliveries(dir.path()),
            ["e2"],
            "only the applied version is routed"
        );
        let copy = js
            .get_stream(&qname)
            .await
            .unwrap()
            .get_last_raw_message_by_subject(&quarantine)
            .await
            .expect("the quarantined copy");
        let reason = copy
            .headers
            .get("Oncebox-Reason")
            .map(|v| v.as_str().to_owned());
        assert_eq!(reason.as_deref(), Some("invalid"), "{:?}", copy.headers);
        for n in [&name, &qname] {
            let _ = js.delete_stream(n).await;
        }
    });
}

/// A broker that accepts the connection and never answers holds the AMQP handshake, which has
/// no deadline of its own: a stop request must still end `oncebox consume` at once. The broker
/// listens on IPv6's loopback only, so that reaching it shows the consumer connects to the
/// address written (lapin's own reading of the URL put `localhost` in place of an IPv6 address,
/// and `localhost` is 127.0.0.1 here).
#[test]
fn a_stop_during_a_handshake_that_never_ends_is_not_held_up() {
    oncebox_testkit::run(async {
        let silent = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
        let url = format!("amqp://guest:guest@{}/%2f", silent.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oncebox.toml"), ORDERS).unwrap();
        assert!(oncebox(dir.path(), &["migrate"]).status.success());
        let log = dir.path().join("consume.log");
        let child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["consume", "--amqp", &url])
            .current_dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_NATS_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut consuming = Consuming(child);
        // Held: the consumer connected and waits for the broker's first frame.
        let (_held, _) = tokio::time::timeout(Duration::from_secs(30), silent.accept())
            .await
            .expect("the consumer connected")
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(consuming.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = consuming.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "consume still running 10 s after SIGTERM; log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "consume: {status}");
    });
}

/// A RabbitMQ URL that could never connect is refused at start, not retried for ever; one whose
/// vhost is longer than AMQP can name made lapin panic in the consumer's task, and `amqps://`
/// connected in plain text, credentials and all.
#[test]
fn an_amqp_url_that_cannot_work_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), ORDERS).unwrap();
    let long = format!("amqp://127.0.0.1/{}", "v".repeat(256));
    for (url, why) in [
        (long.as_str(), "vhost"),
        ("http://127.0.0.1/", "not an AMQP URL"),
        // Every handshake was given up at once, and said to be a broker that did not answer.
        (
            "amqp://127.0.0.1:1/%2f?connection_timeout=0",
            "connection_timeout=0",
        ),
        // No TLS for RabbitMQ in this build: it would have connected in plain text.
        (
            "amqps://guest:guest@127.0.0.1/%2f",
            "amqps:// (TLS) is not supported",
        ),
    ] {
        let out = oncebox(dir.path(), &["consume", "--amqp", url]);
        assert_eq!(out.status.code(), Some(2), "{url}: {}", text(&out));
        assert!(text(&out).contains(why), "{url}: {}", text(&out));
    }
}

/// A RabbitMQ URL lapin cannot read is refused without being repeated: lapin's own words for
/// one without `//` quote it whole, password and all.
#[test]
fn a_malformed_amqp_url_is_refused_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), ORDERS).unwrap();
    for (url, why) in [
        ("amqp:guest:s3cret@rabbit/%2f", "no // after the scheme"),
        (
            "amqp://guest:s3cret@rabbit:notaport/%2f",
            "invalid port number",
        ),
        (
            "amqp://guest:s3cret@rabbit/%2f?heartbeat=often",
            "not an AMQP URL",
        ),
    ] {
        let out = oncebox(dir.path(), &["consume", "--amqp", url]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {said}");
        assert!(
            said.contains("--amqp: ") && said.contains(why),
            "{url}: {said}"
        );
        assert!(!said.contains("s3cret"), "{url}: {said}");
    }
}

/// A NATS URL the client cannot read is refused at start, as a RabbitMQ one is, and without
/// its credentials: with a database to consume into, the consumer said "reconnecting" for
/// ever (each run here is given 30 s to exit).
#[test]
fn a_malformed_nats_url_is_refused_at_start_without_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("oncebox.toml"), config("S", "s", "q.x")).unwrap();
    assert!(oncebox(dir.path(), &["migrate"]).status.success());
    let log = dir.path().join("consume.log");
    for (url, why) in [
        ("nats://relay:s3cret@nats:notaport", "invalid port number"),
        ("relay:s3cret@nats:42220000", "invalid port number"),
        (
            "http://relay:s3cret@nats:4222",
            "the scheme is not nats or tls",
        ),
        ("nats://relay:s3cret@:4222", "empty host"),
        ("nats://relay:s3cret@a:4222,b:4222", "invalid port number"),
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["consume", "--nats", url])
            .current_dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_DATABASE")
            .env_remove("ONCEBOX_AMQP_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut consuming = Consuming(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = consuming.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{url}: consume still running after 30 s: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let said = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(2), "{url}: {said}");
        assert!(
            said.contains("--nats: ") && said.contains(why),
            "{url}: {said}"
        );
        assert!(!said.contains("s3cret"), "{url}: {said}");
    }
}
