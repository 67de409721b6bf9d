//! Optional TLS on tcp connections (`docs/design.md`, "TLS on tcp"): TLS
//! 1.3 only, both sides presenting a certificate and checking the other's
//! against the configured CA, through rustls with the ring provider.
//!
//! The handshake runs right after the TCP connect, before any Weft frame
//! (`handshake.rs`); the Weft handshakes (Hello, identity check, key
//! proof, connection request) then run inside the session, and the
//! established connection reads and writes through it (`session.rs`).
//!
//! What is checked of a peer's certificate: that it chains to the CA, is
//! within its validity and allows its use (client or server
//! authentication). Not its names: peers are addressed by IP and port,
//! every endpoint is both client and server, and who may connect is
//! decided by the CA (one CA per job or cluster), as authorization keys
//! decide it by the key.

mod handshake;
mod session;

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{
    AlertDescription, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};
use weft_core::tls::TlsFiles;
use weft_core::{Error, Result};

pub use handshake::{accept, connect, HsStream};
pub use session::{ReactorRead, Session};

/// A domain's loaded TLS configuration, shared by its endpoints.
pub struct TlsContext {
    files: TlsFiles,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsContext")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl TlsContext {
    /// What an object opened with `attr` (its `domain_attr.tls`) runs:
    /// the attribute, else the `FI_TCP_TLS_*` variables as they are now;
    /// `None` for plain TCP.
    ///
    /// # Errors
    ///
    /// As [`TlsContext::load`]; `Inval` for a partial environment.
    pub fn resolve(attr: Option<&TlsFiles>) -> Result<Option<Arc<TlsContext>>> {
        match TlsFiles::resolve(attr)? {
            Some(f) => Ok(Some(Arc::new(TlsContext::load(&f)?))),
            None => Ok(None),
        }
    }

    /// Reads and checks the three files.
    ///
    /// # Errors
    ///
    /// `NoEnt` for a missing file (`Access` for one that may not be
    /// read), `Inval` for a file without a PEM item of its kind or one
    /// that does not parse, and for a key that is not the certificate's.
    pub fn load(files: &TlsFiles) -> Result<TlsContext> {
        let _span = tracing::debug_span!("tls_load", cert = %files.cert.display()).entered();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(pem_error)?;
        let mut roots = RootCertStore::empty();
        for ca in certs(&files.ca)? {
            roots.add(ca).map_err(|_| Error::Inval)?;
        }
        let roots = Arc::new(roots);
        // A key that is not the certificate's would only show when a peer
        // refuses the handshake; here it is the caller's error at once.
        CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(|e| {
            tracing::debug!(error = %e, "TLS key and certificate do not match");
            Error::Inval
        })?;
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|_| Error::Inval)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(CaVerifier {
                roots: roots.clone(),
                algs: provider.signature_verification_algorithms,
            }))
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|_| Error::Inval)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|_| Error::Inval)?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|_| Error::Inval)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|_| Error::Inval)?;
        Ok(TlsContext {
            files: files.clone(),
            client: Arc::new(tune_client(client)),
            server: Arc::new(tune_server(server)),
        })
    }

    /// The files it was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

/// Connections are long-lived and made once per peer: resuming a session
/// would save little and keep tickets in memory, so none are kept.
fn tune_client(mut c: ClientConfig) -> ClientConfig {
    c.resumption = rustls::client::Resumption::disabled();
    c.enable_sni = false;
    c
}

fn tune_server(mut s: ServerConfig) -> ServerConfig {
    s.send_tls13_tickets = 0;
    s.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    s
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let v = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if v.is_empty() {
        return Err(Error::Inval);
    }
    Ok(v)
}

fn pem_error(e: rustls::pki_types::pem::Error) -> Error {
    match e {
        rustls::pki_types::pem::Error::Io(io) => Error::from_io(&io),
        _ => Error::Inval,
    }
}

/// Checks a server's certificate against the CA alone (see the module
/// comment for why not its name); signatures as rustls' own verifier.
#[derive(Debug)]
struct CaVerifier {
    roots: Arc<RootCertStore>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for CaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        None
    }
}

/// What a failed TLS session is called: `KeyRejected` when a certificate
/// was refused (ours by the peer, or the peer's by us), as a wrong
/// authorization key is; `NoProtoOpt` when the peer does not speak TLS
/// (a plain Weft endpoint says so with a `protocol_version` alert) or
/// sends what is not TLS; `Io` for anything else.
pub fn tls_error(e: &rustls::Error) -> Error {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(_) | E::NoCertificatesPresented => Error::KeyRejected,
        E::AlertReceived(a) => match a {
            AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::CertificateRequired
            | AlertDescription::DecryptError
            | AlertDescription::HandshakeFailure => Error::KeyRejected,
            AlertDescription::ProtocolVersion => Error::NoProtoOpt,
            _ => Error::Io,
        },
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::PeerIncompatible(_) => Error::NoProtoOpt,
        _ => Error::Io,
    }
}

#[cfg(test)]
pub(crate) mod tests;
