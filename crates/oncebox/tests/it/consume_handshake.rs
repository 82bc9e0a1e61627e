//! `oncebox consume` against a RabbitMQ whose first connection is taken and never answered (a
//! broker host gone silently mid-handshake): the handshake is given up after the URL's
//! `connection_timeout`, and the consumer connects again and consumes. lapin has no deadline
//! of its own, and the consumer waited on that first connection for good.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicPublishOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use tokio::net::{TcpListener, TcpStream};

use crate::consume::Consuming;
use crate::support::oncebox;

/// A stand-in in front of the broker at `upstream`: the first connection is held and never
/// answered, later ones pass through. Its address and the count of connections it took.
async fn first_one_silent(upstream: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let taken = Arc::new(AtomicUsize::new(0));
    let count = taken.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut client, _)) = listener.accept().await {
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                held.push(client);
                continue;
            }
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut broker) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                }
            });
        }
    });
    (addr, taken)
}

#[test]
fn a_handshake_never_answered_is_given_up_and_the_consumer_connects_again() {
    oncebox_testkit::run(async {
        let Some(base) = oncebox_testkit::service_url("ONCEBOX_AMQP_URL") else {
            return;
        };
        let broker = reqwest::Url::parse(&base).unwrap();
        let upstream = format!(
            "{}:{}",
            broker.host_str().unwrap(),
            broker.port().unwrap_or(5672)
        );
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let (queue, quarantine) = (
            format!("oncebox-test-q-{tag}"),
            format!("oncebox-test-x-{tag}"),
        );
        let admin = Connection::connect(&base, ConnectionProperties::default())
            .await
            .expect("the test connects to RabbitMQ");
        let channel = admin.create_channel().await.unwrap();
        // A safety net for a failed test that never reaches the deletes.
        let mut expiring = FieldTable::default();
        expiring.insert("x-expires".into(), AMQPValue::LongInt(300_000));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                expiring,
            )
            .await
            .unwrap();
        channel
            .exchange_declare(
                quarantine.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();

        let (stand_in, taken) = first_one_silent(upstream).await;
        let mut url = broker.clone();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(stand_in.rsplit(':').next().unwrap().parse().unwrap()))
            .unwrap();
        url.query_pairs_mut()
            .append_pair("connection_timeout", "1000");
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[sources.shop]\nsignature = \"none\"\n\n[consumers.orders]\nsource = \"shop\"\n\
             queue = \"{queue}\"\nkey = \"message-id\"\nquarantine = \"{quarantine}\"\n"
        );
        std::fs::write(dir.path().join("oncebox.toml"), config).unwrap();
        assert!(oncebox(dir.path(), &["migrate"]).status.success());
        let log = dir.path().join("consume.log");
        let child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(["consume", "--amqp", url.as_str()])
            .current_dir(dir.path())
            .env_remove("ONCEBOX_CONFIG")
            .env_remove("ONCEBOX_NATS_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Killed however the test ends.
        let consuming = Consuming(child);

        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                br#"{"id":"m-1"}"#,
                BasicProperties::default()
                    .with_message_id("m-1".into())
                    .with_content_type("application/json".into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        // Polled until the event is stored (or long past the stand-in's 1 s handshake wait).
        let deadline = Instant::now() + Duration::from_secs(30);
        let stored = loop {
            let out = oncebox(
                dir.path(),
                &["events", "--source", "shop", "--output", "json"],
            );
            let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if listed["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
            {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        drop(consuming);
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        channel
            .exchange_delete(quarantine.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        assert!(stored, "the message was never consumed; log: {said}");
        // The fault happened: the first connection was held, and the consumer came back.
        assert!(taken.load(Ordering::SeqCst) >= 2, "log: {said}");
        assert!(said.contains("no AMQP handshake within 1s"), "log: {said}");
    });
}
