//! TLS to the database, with rustls (no OpenSSL): libpq's `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey`, read from the connection string (which tokio-postgres would refuse: it knows
//! only `disable`, `prefer` and `require`, and no certificate files) or set on the builder.
//!
//! What each mode checks, as libpq does:
//!
//! | mode | TLS | the server's certificate |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it, else plain | not checked |
//! | `require` | always | not checked; with `sslrootcert`, its chain (as `verify-ca`) |
//! | `verify-ca` | always | signed by a root in `sslrootcert` |
//! | `verify-full` | always | signed by a root in `sslrootcert`, and naming the host connected to |
//!
//! `sslrootcert=system` takes the platform's roots, and then only `verify-full` is allowed (as
//! in libpq 16: any CA could otherwise vouch for any host).

use super::url::invalid;
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// How a connection to the database uses TLS: libpq's `sslmode` (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it, else a plain connection; the certificate is not checked.
    /// It keeps a passive listener from reading the traffic when the server offers TLS, and
    /// protects against nothing else: whoever sits between can offer no TLS, or their own
    /// certificate.
    Prefer,
    /// Always TLS; the certificate is not checked (unless a root certificate is given: then as
    /// [`SslMode::VerifyCa`]). Against a passive listener only.
    Require,
    /// Always TLS, and the server's certificate must be signed by a root certificate given
    /// (`sslrootcert`). Any server holding a certificate from that CA is accepted.
    VerifyCa,
    /// Always TLS, signed by a given root, and naming the host connected to. The only mode that
    /// stops a party between the store and the database from reading or changing the traffic.
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(invalid(format!(
                    "sslmode={other}: expected disable, prefer, require, verify-ca or verify-full \
                     (allow is not offered)"
                )))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The TLS settings of a store: from the connection string, then the builder's (which win).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) mode: Option<SslMode>,
    /// A PEM file of root certificates, or `system`.
    pub(crate) root_cert: Option<PathBuf>,
    /// The client's certificate (PEM, with its chain) and private key (PEM).
    pub(crate) client_cert: Option<(PathBuf, PathBuf)>,
}

impl Settings {
    /// `self` with what `over` sets replacing it.
    pub(crate) fn overridden_by(self, over: &Settings) -> Settings {
        Settings {
            mode: over.mode.or(self.mode),
            root_cert: over.root_cert.clone().or(self.root_cert),
            client_cert: over.client_cert.clone().or(self.client_cert),
        }
    }
}

/// How connections are made: plain, or with TLS as the settings say.
#[derive(Debug, Clone)]
pub(crate) enum Connector {
    Plain,
    Rustls(MakeRustls),
}

/// The `system` root store name, as libpq spells it.
const SYSTEM: &str = "system";

impl Connector {
    /// Applies `settings` to `pg` (its `ssl_mode`) and builds the connector, reading the
    /// certificate files now: a missing or unreadable file fails the connect, before any
    /// connection is tried.
    ///
    /// # Errors
    /// [`Error::Tls`] naming the file or the setting that cannot be used.
    pub(crate) fn new(settings: &Settings, pg: &mut tokio_postgres::Config) -> Result<Connector> {
        let system = settings
            .root_cert
            .as_deref()
            .is_some_and(|p| p == Path::new(SYSTEM));
        let mode = settings.mode.unwrap_or(if system {
            SslMode::VerifyFull
        } else {
            SslMode::Prefer
        });
        if system && mode != SslMode::VerifyFull {
            return Err(Error::Tls {
                reason: format!(
                    "sslrootcert=system needs sslmode=verify-full (it was {}): with the \
                     platform's roots, any public CA could vouch for any host",
                    mode.name()
                ),
            });
        }
        pg.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        // ring, not aws-lc-rs: no C library build of its size, at the price of rustls 0.23.48's
        // deprecation (ring offers no post-quantum key exchange: a recorded session could be
        // decrypted by a future quantum computer, which aws-lc-rs's hybrid exchange prevents).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = || webpki(root_store(settings.root_cert.as_deref(), mode)?, &provider);
        let lenient = |chain| -> Arc<dyn ServerCertVerifier> {
            Arc::new(Lenient {
                chain,
                provider: Arc::clone(&provider),
            })
        };
        let verifier: Arc<dyn ServerCertVerifier> = match mode {
            SslMode::Disable => return Ok(Connector::Plain),
            SslMode::Prefer => lenient(None),
            SslMode::Require if settings.root_cert.is_none() => lenient(None),
            SslMode::Require | SslMode::VerifyCa => lenient(Some(chain()?)),
            SslMode::VerifyFull => chain()?,
        };
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(format!("the TLS versions: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &settings.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates(cert, "sslcert")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    tls(format!(
                        "sslkey {}: no private key could be read: {e}",
                        key.display()
                    ))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    tls(format!(
                        "sslcert and sslkey do not make a client identity: {e}"
                    ))
                })?
            }
        };
        Ok(Connector::Rustls(MakeRustls {
            config: Arc::new(config),
        }))
    }

    /// Connects, and runs the connection on the current runtime until the client is dropped.
    ///
    /// # Errors
    /// [`Error::Tls`] for a handshake that failed (a certificate that does not verify, a host it
    /// does not name); otherwise as the driver's error ([`Error::Database`]).
    pub(crate) async fn connect(
        &self,
        pg: &tokio_postgres::Config,
        notices: Option<mpsc::UnboundedSender<String>>,
    ) -> Result<tokio_postgres::Client> {
        let failed = |e: tokio_postgres::Error| match handshake_failure(&e) {
            Some(reason) => Error::Tls { reason },
            None => super::rows::db_error(e),
        };
        match self {
            Connector::Plain => run(pg, tokio_postgres::NoTls, notices).await,
            Connector::Rustls(make) => run(pg, make.clone(), notices).await,
        }
        .map_err(failed)
    }
}

/// Connects with `tls`, and runs the connection on the current runtime until the client is
/// dropped, sending the payload of each notification it receives to `notices` (if given;
/// `notices` closes when the connection ends).
async fn run<T>(
    pg: &tokio_postgres::Config,
    tls: T,
    notices: Option<mpsc::UnboundedSender<String>>,
) -> std::result::Result<tokio_postgres::Client, tokio_postgres::Error>
where
    T: MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = pg.connect(tls).await?;
    tokio::spawn(async move {
        let Some(notices) = notices else {
            let _ = connection.await;
            return;
        };
        while let Some(Ok(message)) =
            futures_util::future::poll_fn(|cx| connection.poll_message(cx)).await
        {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                if notices.send(n.payload().to_owned()).is_err() {
                    return;
                }
            }
        }
    });
    Ok(client)
}

fn tls(reason: String) -> Error {
    Error::Tls { reason }
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let read = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| tls(format!("{what} {}: cannot be read: {e}", path.display())))?;
    if read.is_empty() {
        return Err(tls(format!(
            "{what} {}: holds no PEM certificate",
            path.display()
        )));
    }
    Ok(read)
}

/// The roots a verifying mode trusts: `path` (a PEM file, or `system`), or libpq's default
/// `~/.postgresql/root.crt`.
fn root_store(path: Option<&Path>, mode: SslMode) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    if path == Some(Path::new(SYSTEM)) {
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            return Err(tls(format!(
                "sslrootcert=system: the platform has no root certificates to offer ({} errors)",
                found.errors.len()
            )));
        }
        return Ok(roots);
    }
    let default =
        std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt"));
    let path = match (path, &default) {
        (Some(path), _) => path.to_owned(),
        (None, Some(default)) if default.exists() => default.clone(),
        _ => {
            return Err(tls(format!(
                "sslmode={} needs root certificates to check the server's against: set \
                 sslrootcert (a PEM file, or system), or put them in ~/.postgresql/root.crt",
                mode.name()
            )))
        }
    };
    for cert in certificates(&path, "sslrootcert")? {
        roots
            .add(cert)
            .map_err(|e| tls(format!("sslrootcert {}: {e}", path.display())))?;
    }
    Ok(roots)
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| tls(format!("the root certificates cannot verify anything: {e}")))
}

/// Why a connection's TLS handshake failed, in words that say what did not match; `None` if it
/// did not fail in the handshake.
fn handshake_failure(e: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(rustls) = s.downcast_ref::<rustls::Error>() {
            return Some(describe(rustls));
        }
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if let Some(rustls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(describe(rustls));
            }
        }
        source = s.source();
    }
    None
}

fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected,
            presented,
        }) => format!(
            "the server's certificate does not name the host connected to: expected {}, the \
             certificate names {}",
            expected.to_str(),
            if presented.is_empty() {
                "no host".to_owned()
            } else {
                presented.join(", ")
            }
        ),
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
            "the server's certificate does not name the host connected to".into()
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the server's certificate is not signed by any root in sslrootcert (unknown issuer)"
                .into()
        }
        rustls::Error::InvalidCertificate(other) => {
            format!("the server's certificate was refused: {other:?}")
        }
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// The checks short of `verify-full`: with no chain, any certificate is accepted (`prefer`,
/// `require`); with one, the chain is verified and the names ignored (`verify-ca`). The
/// handshake's signatures are checked against the certificate either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// tokio-postgres's TLS hook, with rustls.
#[derive(Debug, Clone)]
pub(crate) struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            config: Arc::clone(&self.config),
            name,
        })
    }
}

pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await
                .map(RustlsStream)
        })
    }
}

pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding is not offered (tokio-postgres then uses plain SCRAM).
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_modes_need_roots_and_system_roots_need_verify_full() {
        let mut pg = tokio_postgres::Config::new();
        let missing = Settings {
            mode: Some(SslMode::VerifyFull),
            root_cert: Some(PathBuf::from("/nonexistent/root.pem")),
            client_cert: None,
        };
        match Connector::new(&missing, &mut pg) {
            Err(Error::Tls { reason }) => {
                assert!(reason.contains("/nonexistent/root.pem"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let weak_system = Settings {
            mode: Some(SslMode::Require),
            root_cert: Some(PathBuf::from("system")),
            client_cert: None,
        };
        match Connector::new(&weak_system, &mut pg) {
            Err(Error::Tls { reason }) => assert!(reason.contains("verify-full"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Connector::new(&Settings::default(), &mut pg),
            Ok(Connector::Rustls(_))
        ));
        assert_eq!(pg.get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
    }
}
