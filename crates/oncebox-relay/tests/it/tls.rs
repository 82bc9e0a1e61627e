//! HTTPS receivers: one whose certificate comes from an authority the test makes (the route
//! trusts it or not), counting the requests that reached it and the handshakes it refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use oncebox_testkit::run;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use oncebox_core::delivery::DeliveryState;

use crate::{World, route};

/// A running HTTPS receiver for `localhost`.
struct Https {
    addr: SocketAddr,
    /// The PEM certificate of the authority that signed the receiver's.
    ca_pem: Vec<u8>,
    /// Requests that reached the handler, with their idempotency keys.
    keys: Arc<std::sync::Mutex<Vec<String>>>,
    /// Connections whose TLS handshake failed, and a wake-up for each.
    refused: Arc<AtomicU32>,
    refusing: Arc<Notify>,
}

async fn https_receiver() -> Https {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "oncebox test authority");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let refused = Arc::new(AtomicU32::new(0));
    let seen = keys.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap| async move {
            let key = headers["idempotency-key"].to_str().unwrap_or("").to_owned();
            seen.lock().unwrap().push(key);
            StatusCode::OK
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refusing = Arc::new(Notify::new());
    let (failed, told) = (refused.clone(), refusing.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            let (failed, told) = (failed.clone(), told.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    failed.fetch_add(1, Ordering::SeqCst);
                    told.notify_one();
                    return;
                };
                let service = TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Https {
        addr,
        ca_pem: ca_cert.pem().into_bytes(),
        keys,
        refused,
        refusing,
    }
}

#[test]
fn an_https_route_is_delivered_over_tls_to_a_receiver_whose_authority_it_trusts() {
    run(async {
        let w = World::new();
        let rx = https_receiver().await;
        w.accept("evt_t", &["hooks"]).await;
        let mut secure = route("hooks", rx.addr, false);
        secure.url = format!("https://localhost:{}/hook", rx.addr.port());
        secure.ca_pem = Some(rx.ca_pem.clone());
        let out = w.relay(vec![secure]).run_once().await.unwrap();
        assert_eq!(out.delivered, 1, "{out:?}");
        assert_eq!(*rx.keys.lock().unwrap(), ["shop:evt_t"]);
        assert_eq!(rx.refused.load(Ordering::SeqCst), 0);
        assert_eq!(w.delivery("evt_t").await.state, DeliveryState::Delivered);
    });
}

#[test]
fn an_https_receiver_whose_certificate_is_not_trusted_never_gets_the_request() {
    run(async {
        let w = World::new();
        let rx = https_receiver().await;
        w.accept("evt_u", &["hooks"]).await;
        let mut secure = route("hooks", rx.addr, false);
        secure.url = format!("https://localhost:{}/hook", rx.addr.port());
        secure.timeout = Duration::from_secs(5);
        let out = w.relay(vec![secure]).run_once().await.unwrap();
        // A handshake refused: nothing was sent, so the attempt is retried, not uncertain.
        assert_eq!((out.retrying, out.uncertain), (1, 0), "{out:?}");
        // The receiver saw the handshake fail (it may learn so after the relay moved on).
        let told = tokio::time::timeout(Duration::from_secs(30), rx.refusing.notified());
        told.await.expect("the receiver saw a handshake");
        assert_eq!(rx.refused.load(Ordering::SeqCst), 1);
        assert!(rx.keys.lock().unwrap().is_empty());
        let d = w.delivery("evt_u").await;
        assert_eq!((d.state, d.attempts), (DeliveryState::Retrying, 1));
    });
}
