//! `rediss://`: the tier over TLS to a private `redis-server` whose certificate a test CA
//! signed (made with `openssl`), trusted through `Options::root_certificate` and refused
//! without it, the system's roots not knowing that CA. And a namespace whose keys could be
//! another namespace's is refused before anything connects.

use std::net::TcpListener;
use std::time::Duration;

use oncebox_core::{Begun, Response};
use oncebox_redis::{ConnectError, Leases, Options};
use oncebox_testkit::run;

use crate::harness::{Namespace, PrivateRedis, event};

const TTL: Duration = Duration::from_secs(30);

#[test]
fn leases_work_over_tls_with_the_servers_ca_and_not_without() {
    let dir = tempfile::tempdir().unwrap();
    if oncebox_testkit::tls::certificates(dir.path()).is_none() {
        return;
    }
    let tls_port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let Some(server) = PrivateRedis::start_with(vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        file("server.pem"),
        "--tls-key-file".into(),
        file("server.key"),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]) else {
        return;
    };
    run(async move {
        let url = format!("rediss://127.0.0.1:{tls_port}");
        // Cleaned up through the plain port of the same server.
        let ns = Namespace::new(&server.url());
        let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
        let leases = Leases::connect(&url, ns.options().root_certificate(ca))
            .await
            .expect("connected over TLS");
        let e = event("tls-1", 1);
        let Ok(Begun::Leased(lease)) = leases.begin(&e, TTL).await else {
            panic!("a new key is leased");
        };
        leases
            .complete(&lease, &Response::completed("done"))
            .await
            .expect("complete");
        let again = leases.begin(&e, TTL).await;
        assert!(
            matches!(&again, Ok(Begun::Duplicate(r)) if r.body == b"done"),
            "{again:?}"
        );
        // The same server's plain port finds the record the TLS connection wrote.
        let mut plain = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let stored: bool = redis::cmd("EXISTS")
            .arg(ns.record(&e.key))
            .query(&mut plain)
            .unwrap();
        assert!(stored);

        // The system's roots do not know the test CA.
        let untrusted = ns.options().deadline(Duration::from_secs(2));
        let refused = Leases::connect(&url, untrusted).await;
        let why = format!("{refused:?}");
        assert!(
            matches!(refused, Err(ConnectError::Unavailable(_))) && why.contains("UnknownIssuer"),
            "{why}"
        );
    });
}

#[test]
fn a_namespace_whose_keys_could_be_anothers_is_refused() {
    run(async {
        // Refused before connecting: nothing listens on port 1.
        for namespace in ["", "a:k:b", "app:"] {
            let refused = Leases::connect("redis://127.0.0.1:1", Options::new(namespace)).await;
            assert!(
                matches!(&refused, Err(ConnectError::Namespace(n)) if n == namespace),
                "{namespace:?}: {refused:?}"
            );
        }
    });
}
