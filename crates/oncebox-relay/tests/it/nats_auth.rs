//! A NATS route to a server that requires credentials, named in the route's URL as
//! `user:password@` (percent-encoded) or `token@`: the client does not send a URL's
//! credentials by itself, so every attempt was refused ("authorization violation") until the
//! route's caps parked the delivery dead. Checked on private `nats-server`s, whose settings the
//! test chooses.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::ConnectOptions;
use async_nats::jetstream::stream::{Config, StorageType};
use oncebox_core::delivery::DeliveryState;
use oncebox_testkit::run;

use crate::{World, broker_route, with_query};

/// A `nats-server` of the test's own with JetStream, on a free loopback port; killed on drop.
struct PrivateNats {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivateNats {
    /// `None` (skip) when there is no `nats-server`; a failure under
    /// `ONCEBOX_REQUIRE_SERVICES=1`.
    fn start(auth: &[&str]) -> Option<PrivateNats> {
        let binary = std::env::var_os("ONCEBOX_NATS_SERVER")
            .map(std::path::PathBuf::from)
            .into_iter()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ))
            .map(|p| if p.is_dir() { p.join("nats-server") } else { p })
            .chain([std::path::PathBuf::from("/usr/sbin/nats-server")])
            .find(|p| p.is_file());
        let Some(binary) = binary else {
            let required = std::env::var("ONCEBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "nats-server not found (ONCEBOX_NATS_SERVER, PATH, /usr/sbin) and \
                 ONCEBOX_REQUIRE_SERVICES=1: this test starts its own NATS with credentials"
            );
            eprintln!("SKIPPED: nats-server not found; this test starts its own NATS");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("temp dir");
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path())
            .args(auth)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        Some(PrivateNats {
            child,
            port,
            _dir: dir,
        })
    }

    /// A stream capturing `subject`, made by a client with `auth`, once the server takes it.
    async fn stream(&self, auth: ConnectOptions, subject: &str) -> async_nats::jetstream::Context {
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            // A fresh options value per try: connecting consumes it.
            let options = auth.clone();
            match options
                .connect(format!("nats://127.0.0.1:{}", self.port))
                .await
            {
                Ok(client) => break client,
                // Polled until the server listens: it was just started.
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("the private nats-server never took a client: {e}"),
            }
        };
        let js = async_nats::jetstream::new(client);
        js.create_stream(Config {
            name: "ORDERS".into(),
            subjects: vec![subject.to_owned()],
            storage: StorageType::Memory,
            ..Config::default()
        })
        .await
        .expect("JetStream on the private server");
        js
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Delivers one event to `url` on a route that is not idempotent (an unknown outcome would
/// park it, a refusal retry it) and reads what the stream holds.
async fn delivered_through(url: &str, js: &async_nats::jetstream::Context) {
    delivered_on(broker_route("orders", url, false), js).await;
}

/// As [`delivered_through`], on `route`.
async fn delivered_on(route: oncebox_core::route::Route, js: &async_nats::jetstream::Context) {
    let w = World::new();
    w.accept("evt_1", &["orders"]).await;
    let relay = w.relay(vec![route]);
    let out = relay.run_once().await.unwrap();
    let d = w.delivery("evt_1").await;
    assert_eq!(d.state, DeliveryState::Delivered, "{out:?} {d:?}");
    let mut stream = js.get_stream("ORDERS").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
}

#[test]
fn a_route_url_with_user_and_password_or_a_token_delivers_to_a_server_requiring_them() {
    run(async {
        // A password with characters a URL must encode.
        let Some(nats) = PrivateNats::start(&["--user", "relay", "--pass", "s3/cr:t"]) else {
            return;
        };
        let auth = ConnectOptions::with_user_and_password("relay".into(), "s3/cr:t".into());
        let js = nats.stream(auth, "orders.paid").await;
        let base = format!("nats://relay:s3%2Fcr%3At@127.0.0.1:{}", nats.port);
        delivered_through(&with_query(&base, &[("subject", "orders.paid")]), &js).await;

        let Some(nats) = PrivateNats::start(&["--auth", "tok3n"]) else {
            return;
        };
        let js = nats
            .stream(ConnectOptions::with_token("tok3n".into()), "orders.paid")
            .await;
        let base = format!("nats://tok3n@127.0.0.1:{}", nats.port);
        delivered_through(&with_query(&base, &[("subject", "orders.paid")]), &js).await;
    });
}

/// A route's user may publish to its subject and nothing else: its look at the stream (a
/// request to JetStream's API, which it may not make) goes unanswered, and the message is still
/// published and delivered, the look given up for a minute.
#[test]
fn a_user_allowed_only_to_publish_still_delivers() {
    run(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            r#"authorization {
                 users = [
                   { user: admin, password: admin }
                   { user: pub, password: pub,
                     permissions: { publish: ["orders.>"], subscribe: ["_INBOX.>"] } }
                 ]
               }"#,
        )
        .expect("config");
        let Some(nats) = PrivateNats::start(&["-c", config.to_str().expect("path")]) else {
            return;
        };
        let admin = ConnectOptions::with_user_and_password("admin".into(), "admin".into());
        let js = nats.stream(admin, "orders.paid").await;
        let base = format!("nats://pub:pub@127.0.0.1:{}", nats.port);
        delivered_through(&with_query(&base, &[("subject", "orders.paid")]), &js).await;
    });
}

/// A route over TLS (`tls://`) to a private `nats-server` whose certificate a test authority
/// signed: with that authority as the route's own (`ca_file`) it delivers; without it the
/// system's authorities do not know the server's, and nothing is sent.
#[test]
fn a_tls_route_trusting_the_servers_authority_delivers_and_one_without_sends_nothing() {
    run(async {
        let dir = tempfile::tempdir().expect("temp dir");
        if oncebox_testkit::tls::certificates(dir.path()).is_none() {
            return;
        }
        let file = |name: &str| dir.path().join(name).display().to_string();
        let tls = [
            "--tls",
            "--tlscert",
            &file("server.pem"),
            "--tlskey",
            &file("server.key"),
        ];
        let Some(nats) = PrivateNats::start(&tls) else {
            return;
        };
        let admin = ConnectOptions::new().add_root_certificates(dir.path().join("ca.pem"));
        let js = nats.stream(admin, "orders.paid").await;
        let base = format!("tls://127.0.0.1:{}", nats.port);
        let url = with_query(&base, &[("subject", "orders.paid")]);

        let w = World::new();
        w.accept("evt_0", &["orders"]).await;
        let relay = w.relay(vec![broker_route("orders", &url, false)]);
        let out = relay.run_once().await.unwrap();
        let d = w.delivery("evt_0").await;
        assert_eq!(
            (out.retrying, d.state),
            (1, DeliveryState::Retrying),
            "{d:?}"
        );
        let why = d.last_error.unwrap_or_default();
        assert!(why.contains("UnknownIssuer"), "{why}");
        let mut stream = js.get_stream("ORDERS").await.unwrap();
        assert_eq!(stream.info().await.unwrap().state.messages, 0);

        let ca = std::fs::read(dir.path().join("ca.pem")).expect("ca.pem");
        let mut trusting = broker_route("orders", &url, false);
        trusting.ca_pem = Some(ca.clone());
        delivered_on(trusting, &js).await;

        // Against a server that does not speak TLS: `tls://`, and `nats://` with the route's
        // own authorities, send nothing (the credentials never go out in plain text).
        let Some(plain) = PrivateNats::start(&["--user", "relay", "--pass", "s3cret"]) else {
            return;
        };
        let auth = ConnectOptions::with_user_and_password("relay".into(), "s3cret".into());
        let js = plain.stream(auth, "orders.paid").await;
        let at = |scheme: &str| {
            let base = format!("{scheme}://relay:s3cret@127.0.0.1:{}", plain.port);
            with_query(&base, &[("subject", "orders.paid")])
        };
        let mut named = broker_route("orders", &at("nats"), false);
        named.ca_pem = Some(ca);
        for route in [broker_route("orders", &at("tls"), false), named] {
            let w = World::new();
            w.accept("evt_1", &["orders"]).await;
            let out = w.relay(vec![route]).run_once().await.unwrap();
            let d = w.delivery("evt_1").await;
            assert_eq!(
                (out.retrying, d.state),
                (1, DeliveryState::Retrying),
                "{d:?}"
            );
        }
        let mut stream = js.get_stream("ORDERS").await.unwrap();
        assert_eq!(stream.info().await.unwrap().state.messages, 0);
        // The same server takes a plain route: the refusals were the TLS's.
        delivered_through(&at("nats"), &js).await;
    });
}
