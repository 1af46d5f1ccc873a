//! `StoreBuilder::import_new` from outside: killed at random moments, and raced by a second
//! process importing to the same path. The path must hold every record of the export or none,
//! and of two importers exactly one makes it.
//!
//! The importers are child processes: this test binary run again as `import_child` with
//! `IDEMDB_IMPORT_CHILD=<export file>:<store path>` set.

use idemdb::{Claim, Error, Fingerprint, Response, Scope, Store};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const CHILD_ENV: &str = "IDEMDB_IMPORT_CHILD";
/// Records in the export: enough that an import takes a while to kill it in the middle of.
const RECORDS: usize = 4000;

fn scope() -> Scope {
    Scope::new("acme", "POST /v1/charges")
}

fn key(i: usize) -> String {
    format!("k{i:05}")
}

/// Exports a store of [`RECORDS`] completed claims with 1 KiB bodies to `dir/export.jsonl`.
fn export(dir: &Path) -> PathBuf {
    let store = Store::open(dir.join("source.idem")).unwrap();
    for i in 0..RECORDS {
        let Claim::Acquired(t) = store
            .claim(&scope(), &key(i), Fingerprint::of(b"x"))
            .unwrap()
        else {
            panic!("new")
        };
        store
            .complete(t, Response::new(201, format!("{i:05}").repeat(200)))
            .unwrap();
    }
    let path = dir.join("export.jsonl");
    store.export(std::fs::File::create(&path).unwrap()).unwrap();
    path
}

/// The child: imports the export into the store path, and says how it ended.
#[test]
#[ignore = "a child process of the tests of this file, run by them"]
fn import_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        eprintln!("import_child is a child process of tests/import.rs, run by its tests ({CHILD_ENV} is not set): nothing to do alone");
        return;
    };
    let (export, store) = spec.split_once('|').expect("<export>|<store>");
    let input = BufReader::new(std::fs::File::open(export).unwrap());
    match Store::builder().import_new(store, input) {
        Ok((_, n)) => println!("IMPORTED {n}"),
        Err(Error::InvalidImport { line: 0, reason }) => println!("REFUSED {reason}"),
        Err(e) => println!("FAILED {e}"),
    }
}

fn spawn(export: &Path, store: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "import_child", "--nocapture"])
        .env(
            CHILD_ENV,
            format!("{}|{}", export.display(), store.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn said(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("IMPORTED") || l.starts_with("REFUSED") || l.starts_with("FAILED"))
        .unwrap_or("(nothing)")
        .to_owned()
}

/// The store at `path` holds every exported record, each replaying its response.
fn holds_every_record(path: &Path) {
    let store = Store::open(path).unwrap();
    assert_eq!(store.record_count().unwrap(), RECORDS as u64);
    for i in (0..RECORDS).step_by(97) {
        match store
            .claim(&scope(), &key(i), Fingerprint::of(b"x"))
            .unwrap()
        {
            Claim::Replay(r) => assert_eq!(r.body(), format!("{i:05}").repeat(200).as_bytes()),
            other => panic!("{}: {other:?}", key(i)),
        }
    }
}

/// An import killed (SIGKILL) at any moment leaves the path holding every record, or nothing:
/// the records are written under a temporary name and linked into place whole.
#[test]
fn an_import_killed_at_any_moment_leaves_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let export = export(dir.path());
    // How long a whole import takes here, to kill within it.
    let started = Instant::now();
    assert!(said(spawn(&export, &dir.path().join("timed.idem"))).starts_with("IMPORTED"));
    let whole = started.elapsed();
    let (mut nothing, mut everything) = (0, 0);
    for round in 0..16u32 {
        let path = dir.path().join(format!("killed-{round}.idem"));
        let mut child = spawn(&export, &path);
        std::thread::sleep(whole * round / 16);
        let _ = child.kill();
        let _ = child.wait();
        if path.exists() {
            holds_every_record(&path);
            everything += 1;
        } else {
            nothing += 1;
        }
    }
    eprintln!("16 imports killed: {nothing} left nothing, {everything} left every record");
}

/// Two processes importing to one path at once: exactly one makes it, the other is refused
/// (nothing of its own is left at the path), and the store holds every record once.
#[test]
fn of_two_imports_racing_to_one_path_exactly_one_makes_it() {
    let dir = tempfile::tempdir().unwrap();
    let export = export(dir.path());
    for round in 0..4 {
        let path = dir.path().join(format!("raced-{round}.idem"));
        let (a, b) = (spawn(&export, &path), spawn(&export, &path));
        let mut answers = [said(a), said(b)];
        answers.sort();
        assert!(
            answers[0].starts_with("IMPORTED") && answers[1].starts_with("REFUSED"),
            "round {round}: {answers:?}"
        );
        holds_every_record(&path);
    }
}
