//! The TLS a NATS route connects with when it names its own authorities (`ca_file`): those
//! certificates alone, as an https route's client trusts them, over ring, the provider the rest
//! of the process uses.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore, crypto};

/// A client configuration trusting exactly the certificates of `pem`.
pub(super) fn trusting(pem: &[u8]) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("the route's authorities: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the route's authorities: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the route's authorities hold no certificate".to_owned());
    }
    let provider = Arc::new(crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
