//! TLS for every outbound HTTPS client.
//!
//! **One crypto provider** (issue 14: one provider linked into the binary). reqwest 0.13 is
//! built with `rustls-no-provider` and rmcp with `reqwest-tls-no-provider`, so the binary does
//! not carry aws-lc-rs; ring is installed as rustls's process-wide default instead. Every entry
//! point that may build an HTTPS client calls [`install`] first (`bin/agentd.rs`,
//! `bin/bench.rs`); building a reqwest client before it panics, which no test can miss.
//!
//! **One root store.** Left to itself, reqwest builds a platform verifier for every client, and
//! on Linux that reads and parses every certificate of the system's store (the bundle and the
//! hashed directory: about 300 files here) each time — at start for each of the daemon's
//! clients, and for every hop of every `web_fetch`, since the SSRF guard pins each hop's
//! addresses in a client of its own. [`client_builder`] hands out builders that share one
//! verifier, kept for the life of the process; it reads the store when it checks its first
//! certificate, not at start-up (`LazyVerifier`).

use std::sync::{Arc, Once, OnceLock};

use rustls::DigitallySignedStruct;
use rustls::SignatureScheme;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Install ring as the process's rustls provider (once; later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err only when a provider is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The shared client configuration: `None` when it cannot be built (no provider installed,
/// no system certificates), in which case builders are reqwest's own and report the problem
/// when they are built, as before.
fn shared() -> Option<&'static Shared> {
    static SHARED: OnceLock<Option<Shared>> = OnceLock::new();
    // Before `install` there is nothing to share yet (test builds, whose reqwest brings its
    // own provider): not remembered, so a later call after `install` still builds it.
    let provider = CryptoProvider::get_default()?;
    SHARED.get_or_init(|| build(provider.clone())).as_ref()
}

struct Shared {
    config: rustls::ClientConfig,
    /// The verifier inside `config` (rustls does not hand it out again).
    #[cfg_attr(not(test), allow(dead_code))]
    verifier: Arc<LazyVerifier>,
}

/// The platform's verifier, built when the first certificate is to be checked: reading and
/// parsing the system's root store (on Linux every file of `/etc/ssl/certs`, a few
/// milliseconds of CPU) is not part of the start-up, and a daemon that only talks to
/// `http://` endpoints (a local model, the benches' fakes) never does it. Handshake signatures
/// are checked with the provider's algorithms directly, as the platform verifier does.
#[derive(Debug)]
struct LazyVerifier {
    provider: Arc<CryptoProvider>,
    platform: OnceLock<Result<rustls_platform_verifier::Verifier, rustls::Error>>,
}

impl LazyVerifier {
    fn platform(&self) -> Result<&rustls_platform_verifier::Verifier, rustls::Error> {
        self.platform
            .get_or_init(|| {
                rustls_platform_verifier::Verifier::new(self.provider.clone()).inspect_err(|e| {
                    tracing::error!(error = %e, "cannot load the system's root certificates: \
                        every HTTPS connection fails until the daemon restarts with a store \
                        (install ca-certificates)");
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl ServerCertVerifier for LazyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.platform()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn build(provider: Arc<CryptoProvider>) -> Option<Shared> {
    let verifier = Arc::new(LazyVerifier {
        provider: provider.clone(),
        platform: OnceLock::new(),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    // What reqwest offers when it builds the configuration itself (a preconfigured one is
    // used as it is): HTTP/1.1 only, since reqwest is built without its `http2` feature (issue
    // 14, binary size: `h2` is not linked). Offering h2 would let a server pick a protocol
    // reqwest cannot speak.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(Shared { config, verifier })
}

/// A reqwest client builder whose TLS uses the process's one root store; reqwest's own
/// builder when that store cannot be built. Every HTTPS client of the daemon starts here.
pub fn client_builder() -> reqwest::ClientBuilder {
    // No automatic decompression, whatever features a dependency turns on (matrix-sdk enables
    // reqwest's `gzip`): our readers count and refuse the bytes the server sent, and
    // `web_fetch` refuses a compressed body rather than inflate it.
    let builder = reqwest::Client::builder().no_gzip();
    match shared() {
        Some(shared) => builder.tls_backend_preconfigured(shared.config.clone()),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_read_at_the_first_certificate() {
        let v = LazyVerifier {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            platform: OnceLock::new(),
        };
        assert!(!v.supported_verify_schemes().is_empty());
        assert!(
            v.platform.get().is_none(),
            "nothing read before a certificate comes"
        );
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let name = ServerName::try_from("example.com").unwrap();
        assert!(
            v.verify_server_cert(&junk, &[], &name, &[], UnixTime::now())
                .is_err()
        );
        assert!(
            matches!(v.platform.get(), Some(Ok(_))),
            "the store, read once"
        );
    }

    #[test]
    fn builders_share_one_verifier_that_still_verifies() {
        install();
        let a = shared().expect("the test machine has system certificates");
        let b = shared().unwrap();
        assert!(std::ptr::eq(a, b), "one configuration per process");
        assert_eq!(a.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        // The shared verifier is the platform's, not a permissive one: a certificate that no
        // system root signed is refused.
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        let name = ServerName::try_from("example.com").unwrap();
        let verdict = a
            .verifier
            .verify_server_cert(&junk, &[], &name, &[], UnixTime::now());
        assert!(verdict.is_err());
        // And reqwest accepts it as its TLS backend.
        client_builder()
            .build()
            .expect("a client on the shared TLS configuration");
    }
}
