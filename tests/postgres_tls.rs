//! TLS to PostgreSQL, against a real server that speaks nothing else: this test makes its own
//! certificates (a CA, a server certificate naming `localhost` only, a client certificate for
//! the role `idemdb_cert`, and a second CA nobody uses), starts a throwaway server with them
//! through `scripts/with-postgres --tls` (which rejects TCP connections without TLS), and runs
//! its checks in a child process of itself beside that server:
//!
//! - `verify-full` to `localhost` with the right CA serves; with another CA, or to `127.0.0.1`
//!   (which the certificate does not name), it is refused with `Error::Tls` saying what did
//!   not match; `verify-ca` to `127.0.0.1` serves (the chain is all it checks);
//! - `require` and `prefer` serve without checking; `disable` is refused by the server
//!   (`Error::Database`, SQLSTATE 28000), never a panic;
//! - a missing root file is `Error::Tls` naming it, before anything is sent; `require` with a
//!   root file checks the chain; the platform's roots (`sslrootcert=system`) do not vouch for
//!   the test CA;
//! - the role `idemdb_cert` logs in with its client certificate, and is refused without one;
//! - the builder's settings do what the connection string's do.
//!
//! Needs root (the server runs as the `postgres` OS user) and the `postgres` feature.

#![cfg(feature = "postgres")]

use idemdb::{Claim, Error, Fingerprint, Response, Scope, SslMode, Store};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child: the directory of the certificates.
const CERTS_ENV: &str = "IDEMDB_TLS_CERTS";

mod tls_certs;

#[test]
fn tls_connections_verify_what_their_mode_says_and_fail_typed() {
    match std::env::var_os(CERTS_ENV) {
        Some(dir) => checks(Path::new(&dir)),
        None => parent(),
    }
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    tls_certs::make(dir.path());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(root.join("scripts/with-postgres"))
        .arg("--tls")
        .arg(dir.path())
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tls_connections_verify_what_their_mode_says_and_fail_typed",
            "--nocapture",
        ])
        .env(CERTS_ENV, dir.path())
        .status()
        .expect("run scripts/with-postgres");
    assert!(status.success(), "the checks beside the TLS server failed");
}

/// The server's URL with `host` and `extra` parameters, as `key=value` pairs.
fn url(host: &str, extra: &str) -> String {
    let port = std::env::var("IDEMDB_PG_PORT").expect("run under scripts/with-postgres");
    format!("host={host} port={port} user=postgres dbname=idem {extra}")
}

fn path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Connects and makes one claim and its completion, so the connection is known to work.
fn serves(what: &str, connected: idemdb::Result<Store>) {
    let store = connected.unwrap_or_else(|e| panic!("{what}: {e}"));
    let scope = Scope::new("t", what);
    match store.claim(&scope, "k", Fingerprint::of(b"x")).unwrap() {
        Claim::Acquired(t) => store.complete(t, Response::new(200, "ok")).unwrap(),
        Claim::Replay(_) => {}
        other => panic!("{what}: {other:?}"),
    }
    println!("{what}: serves");
}

fn tls_refused(what: &str, connected: idemdb::Result<Store>, says: &str) {
    match connected {
        Err(Error::Tls { reason }) => {
            assert!(reason.contains(says), "{what}: {reason}");
            println!("{what}: refused: {reason}");
        }
        other => panic!(
            "{what}: expected Error::Tls, got {:?}",
            other.map(|_| "a store")
        ),
    }
}

fn connect(url: &str) -> idemdb::Result<Store> {
    Store::builder().schema("tls_checks").connect(url)
}

fn checks(dir: &Path) {
    let ca = path(dir, "ca.crt");
    let root = |file: &Path| format!("sslrootcert='{}'", file.display());
    serves(
        "verify-full, localhost, the right CA",
        connect(&url(
            "localhost",
            &format!("sslmode=verify-full {}", root(&ca)),
        )),
    );
    tls_refused(
        "verify-full, another CA",
        connect(&url(
            "localhost",
            &format!("sslmode=verify-full {}", root(&path(dir, "other-ca.crt"))),
        )),
        "not signed by any root",
    );
    tls_refused(
        "verify-full, a host the certificate does not name",
        connect(&url(
            "127.0.0.1",
            &format!("sslmode=verify-full {}", root(&ca)),
        )),
        "does not name the host",
    );
    serves(
        "verify-ca, a host the certificate does not name",
        connect(&url(
            "127.0.0.1",
            &format!("sslmode=verify-ca {}", root(&ca)),
        )),
    );
    serves(
        "require, unchecked",
        connect(&url("127.0.0.1", "sslmode=require")),
    );
    serves(
        "prefer (the default), unchecked",
        connect(&url("127.0.0.1", "")),
    );
    match connect(&url("127.0.0.1", "sslmode=disable")) {
        Err(Error::Database {
            sqlstate: Some(code),
            reason,
            ..
        }) => {
            assert_eq!(code, "28000", "{reason}");
            println!("disable: refused by the server: {reason}");
        }
        other => panic!("disable: {:?}", other.map(|_| "a store")),
    }
    tls_refused(
        "verify-full, a root file that does not exist",
        connect(&url(
            "localhost",
            &format!("sslmode=verify-full {}", root(&path(dir, "missing.crt"))),
        )),
        "missing.crt",
    );
    let client = format!(
        "sslcert='{}' sslkey='{}'",
        path(dir, "client.crt").display(),
        path(dir, "client.key").display()
    );
    let as_cert_role =
        |extra: &str| url("localhost", extra).replace("user=postgres", "user=idemdb_cert");
    serves(
        "a client certificate, for the role it names",
        Store::builder()
            .schema("tls_cert_role")
            .connect(&as_cert_role(&format!(
                "sslmode=verify-full {} {client}",
                root(&ca)
            ))),
    );
    match Store::builder()
        .schema("tls_cert_role")
        .connect(&as_cert_role(&format!("sslmode=verify-full {}", root(&ca))))
    {
        Err(Error::Database {
            sqlstate: Some(code),
            ..
        }) => assert_eq!(code, "28000"),
        other => panic!(
            "the cert role without a certificate: {:?}",
            other.map(|_| "a store")
        ),
    }
    // The builder's settings, over a URL that names none, or another mode.
    let verify_full = || {
        Store::builder()
            .schema("tls_checks")
            .ssl_mode(SslMode::VerifyFull)
            .ssl_root_cert(&ca)
    };
    serves(
        "verify-full from the builder",
        verify_full().connect(&url("localhost", "")),
    );
    tls_refused(
        "the builder's verify-full over a URL's require, to a host not named",
        verify_full().connect(&url("127.0.0.1", "sslmode=require")),
        "does not name the host",
    );
    // require with a root file checks the chain, as verify-ca (libpq's rule).
    tls_refused(
        "require with a root file, another CA",
        connect(&url(
            "127.0.0.1",
            &format!("sslmode=require {}", root(&path(dir, "other-ca.crt"))),
        )),
        "not signed by any root",
    );
    // The platform's roots do not hold the test CA (or there are none): refused either way.
    tls_refused(
        "verify-full with sslrootcert=system",
        connect(&url("localhost", "sslmode=verify-full sslrootcert=system")),
        "sslrootcert",
    );
}
