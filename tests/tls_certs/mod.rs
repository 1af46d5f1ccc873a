//! The certificates of a throwaway TLS server (`scripts/with-postgres --tls`), made with rcgen:
//! shared by `tests/postgres_tls.rs` and `benches/postgres_tls.rs`.

use std::path::Path;

/// Writes into `dir`: `ca.crt`; `server.crt` and `server.key`, for the name `localhost` only;
/// `client.crt` and `client.key`, whose common name is the role `idemdb_cert`; and
/// `other-ca.crt`, a CA that signed nothing here.
pub(crate) fn make(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert, key)
    };
    let (ca_cert, ca_key) = ca("idemdb test CA");
    let (other_cert, _) = ca("a CA nobody trusts");
    let signed = |names: Vec<String>, common: &str| {
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, common);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
        (cert, key)
    };
    let (server_cert, server_key) = signed(vec!["localhost".into()], "localhost");
    let (client_cert, client_key) = signed(Vec::new(), "idemdb_cert");
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    write("ca.crt", ca_cert.pem());
    write("other-ca.crt", other_cert.pem());
    write("server.crt", server_cert.pem());
    write("server.key", server_key.serialize_pem());
    write("client.crt", client_cert.pem());
    write("client.key", client_key.serialize_pem());
}
