//! The loop guard as users meet it: a route that delivers back into its own source makes each
//! pass a new event under a new key, which no deduplication stops. Each delivery carries
//! `oncebox-hops`, and the 16th pass is refused: by the gateway with a `400 hop-limit` (the
//! route's delivery is then dead), by a consumer with a quarantine. Without the guard both
//! loops ran until the disk filled.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use oncebox_core::hops::MAX_HOPS;
use serde_json::Value;

use crate::support::{json, oncebox, serve_with, text};

const PATIENCE: Duration = Duration::from_secs(45);

/// The ids of the stored events, oldest first.
fn event_ids(dir: &Path) -> Vec<String> {
    let v = json(dir, &["events", "--limit", "100", "--output", "json"]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect()
}

fn deliveries(dir: &Path) -> Vec<Value> {
    let v = json(
        dir,
        &["deliveries", "list", "--limit", "100", "--output", "json"],
    );
    v["items"].as_array().unwrap().clone()
}

/// `e1`, then the key of each event before it, after `prefix`: what each pass's id became
/// (the idempotency key `shop:…`, or on NATS the message id `again:shop:…`, which names the
/// route too).
fn chain(first: &str, passes: u32, prefix: &str) -> Vec<String> {
    let mut ids = vec![first.to_owned()];
    for _ in 1..passes {
        ids.push(format!("{prefix}{}", ids.last().unwrap()));
    }
    ids
}

/// Source `shop`, its route `again` to `route_url`, and its consumer `loop` (`broker` the
/// consumer's own settings) keyed by the message id; `check` is asked first, then `consume`
/// (on `flag`) and `relay` start as an operator starts them.
fn start_the_loop(d: &Path, route_url: &str, broker: &str, flag: [&str; 2]) -> (Running, Running) {
    std::fs::write(
        d.join("oncebox.toml"),
        format!(
            "[sources.shop]\nsignature = \"none\"\n\n\
             [routes.again]\nsources = [\"shop\"]\nurl = \"{route_url}\"\n\n\
             [consumers.loop]\nsource = \"shop\"\nkey = \"message-id\"\n{broker}\n"
        ),
    )
    .unwrap();
    warned_of_the_loop(d);
    assert!(oncebox(d, &["migrate"]).status.success());
    let consume = Running::start(d, &["consume", flag[0], flag[1]]);
    (consume, Running::start(d, &["relay"]))
}

/// `check` sees this loop in the configuration alone and says so before anything runs.
fn warned_of_the_loop(dir: &Path) {
    let out = oncebox(dir, &["check"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("routes.again: it publishes into what consumers.loop reads for source shop"),
        "{said}"
    );
}

#[test]
fn a_route_posting_into_its_own_gateway_is_stopped_at_the_hop_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        d.join("oncebox.toml"),
        format!(
            "listen = \"127.0.0.1:{port}\"\n\n[sources.shop]\nsignature = \"none\"\n\n\
             [routes.back]\nsources = [\"shop\"]\n\
             url = \"http://127.0.0.1:{port}/v1/sources/shop/events\"\n"
        ),
    )
    .unwrap();
    let server = serve_with(d, &[]);
    let url = format!("{}/v1/sources/shop/events", server.1);
    oncebox_testkit::run(async move {
        let sent = reqwest::Client::new()
            .post(url)
            .header("idempotency-key", "e1")
            .header("content-type", "application/json")
            .body(r#"{"n":1}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 202);
    });

    // Done when a delivery is dead: the one the gateway refused.
    let deadline = Instant::now() + PATIENCE;
    let found = loop {
        let found = deliveries(d);
        if found.iter().any(|x| x["state"] == "dead") {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no delivery refused; {} events: {found:?}",
            event_ids(d).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    server.stop();

    // The event from outside and 15 passes, each under the key the one before it sent.
    assert_eq!(event_ids(d), chain("e1", MAX_HOPS, "shop:"));
    let states: Vec<&str> = found.iter().map(|x| x["state"].as_str().unwrap()).collect();
    let delivered = states.iter().filter(|s| **s == "delivered").count();
    assert_eq!(
        (states.len(), delivered),
        (MAX_HOPS as usize, MAX_HOPS as usize - 1),
        "{found:?}"
    );
    let dead = found.iter().find(|x| x["state"] == "dead").unwrap();
    assert_eq!(dead["last_status"], 400, "{dead}");
    assert_eq!(dead["hops"], MAX_HOPS, "{dead}");
    assert_eq!(dead["attempts"], 1, "refused for good at once: {dead}");
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn start(dir: &Path, args: &[&str]) -> Running {
        let log = std::fs::File::create(dir.join(format!("{}.log", args[0]))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(args)
            .current_dir(dir)
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_AMQP_URL")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Running(child)
    }

    fn stop(mut self, dir: &Path, name: &str) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        assert!(status.success(), "{name}: {status}; log: {log}");
    }
}

/// One more look for the quarantined copy: failing past the deadline, saying how far the loop
/// got.
async fn poll_again(d: &Path, deadline: Instant) {
    let events = event_ids(d).len();
    assert!(
        Instant::now() < deadline,
        "nothing quarantined; {events} events"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Stops both processes once the copy is quarantined: the event from outside and 15 passes are
/// stored, each under the key the one before it sent.
fn stopped_after_the_limit(d: &Path, relay: Running, consume: Running, prefix: &str) {
    relay.stop(d, "relay");
    consume.stop(d, "consume");
    // Each process apart says what `check` says of the loop.
    for name in ["relay", "consume"] {
        let log = std::fs::read_to_string(d.join(format!("{name}.log"))).unwrap();
        assert!(
            log.contains("it publishes into what consumers.loop reads"),
            "{name}: {log}"
        );
    }
    assert_eq!(event_ids(d), chain("e1", MAX_HOPS, prefix));
}

/// The loop the guard was built for: a route publishing into the stream its own source's
/// consumer reads. `oncebox consume` and `oncebox relay` run as an operator runs them.
#[test]
fn a_route_publishing_into_its_own_consumers_stream_is_stopped_at_the_hop_limit() {
    let Some(url) = oncebox_testkit::service_url("ONCEBOX_NATS_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (name, subject) = (format!("OBL_{tag}"), format!("obl.{tag}"));
        let (qname, quarantine) = (format!("OBLQ_{tag}"), format!("oblq.{tag}"));
        let js = jetstream::new(async_nats::connect(&url).await.expect("NATS"));
        for (n, s) in [
            (&name, format!("{subject}.>")),
            (&qname, quarantine.clone()),
        ] {
            let config = stream::Config {
                name: n.clone(),
                subjects: vec![s],
                ..Default::default()
            };
            js.create_stream(config).await.expect("stream");
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", "e1");
        js.publish_with_headers(format!("{subject}.in"), headers, r#"{"n":1}"#.into())
            .await
            .expect("publish")
            .await
            .expect("stored");

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (consume, relay) = start_the_loop(
            d,
            &format!("{url}?subject={subject}.again"),
            &format!(
                "stream = \"{name}\"\nsubject = \"{subject}.>\"\nquarantine = \"{quarantine}\""
            ),
            ["--nats", &url],
        );

        // Done when the pass past the limit reached the quarantine.
        let mut held = js.get_stream(&qname).await.expect("quarantine stream");
        let deadline = Instant::now() + PATIENCE;
        while held.info().await.expect("info").state.messages == 0 {
            poll_again(d, deadline).await;
        }
        stopped_after_the_limit(d, relay, consume, "again:shop:");
        let copy = held
            .get_last_raw_message_by_subject(&quarantine)
            .await
            .expect("the quarantined copy");
        let header = |name: &str| copy.headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(header("Oncebox-Reason").as_deref(), Some("hop-limit"));
        assert_eq!(
            header("Oncebox-Hops"),
            Some(MAX_HOPS.to_string()),
            "{:?}",
            copy.headers
        );
        // The message from outside and one from each of the 16 deliveries, and no more.
        let mut stream = js.get_stream(&name).await.unwrap();
        let stored = stream.info().await.unwrap().state.messages;
        assert_eq!(stored, u64::from(MAX_HOPS) + 1);
        assert_eq!(held.info().await.unwrap().state.messages, 1);
        for n in [&name, &qname] {
            let _ = js.delete_stream(n).await;
        }
    });
}

/// The same loop on RabbitMQ, as the gateway's users first met it: a route publishing through
/// the default exchange into the queue its own source's consumer reads.
#[test]
fn a_route_publishing_into_its_own_consumers_queue_is_stopped_at_the_hop_limit() {
    use lapin::options::{
        BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
        QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, ExchangeKind};

    let Some(url) = oncebox_testkit::service_url("ONCEBOX_AMQP_URL") else {
        return;
    };
    oncebox_testkit::run(async move {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (queue, held, exchange) = (
            format!("obl.{tag}"),
            format!("oblq.{tag}"),
            format!("oblq.x.{tag}"),
        );
        let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ");
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        // Gone a minute after the test, however it ends.
        let mut expiring = FieldTable::default();
        expiring.insert("x-expires".into(), AMQPValue::LongInt(60_000));
        for q in [&queue, &held] {
            let declare = QueueDeclareOptions::default();
            ch.queue_declare(q.as_str().into(), declare, expiring.clone())
                .await
                .unwrap();
        }
        let auto_delete = ExchangeDeclareOptions {
            auto_delete: true,
            ..ExchangeDeclareOptions::default()
        };
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Fanout,
            auto_delete,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let bind = QueueBindOptions::default();
        ch.queue_bind(
            held.as_str().into(),
            exchange.as_str().into(),
            "".into(),
            bind,
            FieldTable::default(),
        )
        .await
        .unwrap();
        let first = BasicProperties::default().with_message_id("e1".into());
        let publish = BasicPublishOptions::default();
        let body = br#"{"n":1}"#;
        ch.basic_publish("".into(), queue.as_str().into(), publish, body, first)
            .await
            .unwrap()
            .await
            .unwrap();

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (consume, relay) = start_the_loop(
            d,
            &format!("{url}?exchange=&routing_key={queue}"),
            &format!("queue = \"{queue}\"\nquarantine = \"{exchange}\""),
            ["--amqp", &url],
        );

        // Done when the pass past the limit reached the quarantine.
        let deadline = Instant::now() + PATIENCE;
        let copy = loop {
            let get = BasicGetOptions { no_ack: true };
            if let Some(m) = ch.basic_get(held.as_str().into(), get).await.unwrap() {
                break m.delivery;
            }
            poll_again(d, deadline).await;
        };
        stopped_after_the_limit(d, relay, consume, "shop:");
        let headers = copy.properties.headers().clone().unwrap_or_default();
        let header = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(header("x-oncebox-reason"), "hop-limit");
        assert_eq!(header("oncebox-hops"), MAX_HOPS.to_string());
        // Nothing else is left to go round.
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        for q in [&queue, &held] {
            let left = ch
                .queue_declare(q.as_str().into(), passive, FieldTable::default())
                .await
                .unwrap();
            assert_eq!(left.message_count(), 0, "{q}");
        }
        let _ = conn.close(200, "done".into()).await;
    });
}
