//! A real full filesystem (a size-limited tmpfs; mounting it needs root, so these tests are
//! ignored by default and `.ci/run` runs them), filled by the store itself with 4 KiB
//! responses past 3,000 completions, then by another writer to the last block:
//!
//! - while the store fills it, claims of new keys are refused with `DiskFull` before anything
//!   fails, and everything that only reads keeps answering (replays, in progress, mismatch);
//! - when another writer takes the rest, a checkpoint fails with ENOSPC and the store halts;
//!   its heal releases the reserve, replays the journal into it, and serves again, with
//!   nothing freed;
//! - three endings, each checking every acknowledged completion byte for byte: a restart with
//!   nothing freed; space freed and claims succeeding in place, without a restart; a restart
//!   after that.

use idemdb::{Claim, Error, Fingerprint, Response, Scope, Store, Ticket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The journal of the stores here: the reserve is three of them.
const JOURNAL: u64 = MIB;

fn scope() -> Scope {
    Scope::new("tenant", "POST /v1/payments")
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"pay 5000")
}

/// A 4 KiB response naming its key.
fn body(key: &str) -> Response {
    let mut bytes = format!("{key}:").into_bytes();
    bytes.resize(4096, b'.');
    Response::new(201, bytes)
}

fn open(path: &Path) -> Store {
    Store::builder()
        .journal_size(JOURNAL)
        .heal_after(Some(Duration::from_millis(50)))
        .open(path)
        .unwrap()
}

/// Every acknowledged completion replays, byte for byte.
fn replays_every_one(store: &Store, acknowledged: &[String], when: &str) {
    for key in acknowledged {
        match store.claim(&scope(), key, fp()) {
            Ok(Claim::Replay(r)) => assert_eq!(r, body(key), "{when}: {key}"),
            other => panic!("{when}: {key}, acknowledged, answered {other:?}"),
        }
    }
}

fn refused_for_space(store: &Store, key: &str, when: &str) {
    match store.claim(&scope(), key, fp()) {
        Err(Error::DiskFull { available, needed }) => {
            assert!(
                available < needed,
                "{when}: {available} free, {needed} needed"
            );
        }
        other => panic!("{when}: a new key on a full disk answered {other:?}"),
    }
    assert!(
        store.stats().disk_full,
        "{when}: stats say the disk is not full"
    );
}

/// Claims and completes `key`.
fn pay(store: &Store, key: &str) -> idemdb::Result<()> {
    match store.claim(&scope(), key, fp())? {
        Claim::Acquired(t) => store.complete(t, body(key)),
        other => panic!("{key}: {other:?}"),
    }
}

#[test]
#[ignore = "mounts a tmpfs, so it needs root: .ci/run runs it"]
fn a_store_that_fills_its_disk_refuses_new_keys_survives_a_full_disk_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let _fs = Tmpfs::mount(dir.path(), "48m");
    let path = dir.path().join("payments.idem");
    let other = dir.path().join("other-files");
    write_file(&other, 8 * MIB);
    let store = open(&path);

    // Claims held across the filling, completed once another writer took the last block.
    let mut held: Vec<(String, Ticket)> = (0..400)
        .map(|i| {
            let key = format!("held-{i}");
            match store.claim(&scope(), &key, fp()).unwrap() {
                Claim::Acquired(t) => (key, t),
                other => panic!("{other:?}"),
            }
        })
        .collect();

    // The store fills the disk itself: refused before anything fails.
    let mut acknowledged = Vec::new();
    let refusal = loop {
        let key = format!("pay-{}", acknowledged.len());
        match pay(&store, &key) {
            Ok(()) => acknowledged.push(key),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refusal, Error::DiskFull { .. }),
        "the store filling its disk ended with {refusal:?}, not DiskFull, after {}",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() > 3000,
        "only {} completions fit",
        acknowledged.len()
    );
    let filled = acknowledged.len();
    refused_for_space(&store, "new-while-full", "full");
    // Degraded, not down: what only reads answers.
    assert!(matches!(
        store.claim(&scope(), "held-0", fp()).unwrap(),
        Claim::InProgress { .. }
    ));
    assert!(matches!(
        store
            .claim(&scope(), &acknowledged[0], Fingerprint::of(b"pay 9999"))
            .unwrap(),
        Claim::Mismatch { .. }
    ));
    replays_every_one(&store, &acknowledged, "full, refusing new keys");
    let reserve = std::fs::metadata(reserve_of(&path)).unwrap().len();
    assert_eq!(reserve, 3 * JOURNAL, "the reserve");

    // Another writer takes every block left; completions of held claims go on until a
    // checkpoint needs blocks the disk no longer has, and the store halts.
    let hog = dir.path().join("hog");
    fill(&hog);
    let mut failure = None;
    for (key, ticket) in held.drain(..) {
        match store.complete(ticket, body(&key)) {
            Ok(()) => acknowledged.push(key),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let halted_at = Instant::now();
    let failure = failure.expect("completions filled the journal, yet no checkpoint failed");
    assert!(
        matches!(&failure, Error::Io(e) if e.raw_os_error() == Some(28))
            || matches!(failure, Error::Halted { .. }),
        "a checkpoint on a full disk failed with {failure:?}"
    );
    // It heals with nothing freed: the reserve holds what the journal's replay needs.
    // Meanwhile claims that only read are answered (degraded, not down).
    let (mut replayed_while_halted, mut halted_answers) = (0, 0);
    let healed_after = loop {
        if store.stats().heals >= 1 {
            break halted_at.elapsed();
        }
        let key = &acknowledged[replayed_while_halted % filled];
        match store.claim(&scope(), key, fp()) {
            Ok(Claim::Replay(r)) => {
                assert_eq!(r, body(key), "replayed while halted");
                replayed_while_halted += 1;
            }
            Err(Error::Halted { .. }) => halted_answers += 1,
            other => panic!("while healing: {other:?}"),
        }
        assert!(
            halted_at.elapsed() < Duration::from_secs(20),
            "no heal within 20 s on a full disk"
        );
    };
    assert!(store.stats().heals >= 1);
    assert_eq!(
        std::fs::metadata(reserve_of(&path)).unwrap().len(),
        0,
        "the heal used the reserve"
    );
    replays_every_one(&store, &acknowledged, "healed on a full disk");
    refused_for_space(&store, "new-after-heal", "healed on a full disk");

    // Ending 1: a restart with nothing freed.
    drop(store);
    let started = Instant::now();
    let store = open(&path);
    let reopened_in = started.elapsed();
    replays_every_one(&store, &acknowledged, "restarted on a full disk");
    refused_for_space(&store, "new-after-restart", "restarted on a full disk");

    // Ending 2: space freed; claims succeed in place, without a restart.
    std::fs::remove_file(&hog).unwrap();
    std::fs::remove_file(&other).unwrap();
    let freed = Instant::now();
    let served_again_after = loop {
        match pay(&store, "first-after-freeing") {
            Ok(()) => break freed.elapsed(),
            Err(Error::DiskFull { .. }) => {}
            Err(e) => panic!("after space was freed: {e:?}"),
        }
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "claims still refused 10 s after space was freed"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    acknowledged.push("first-after-freeing".into());
    for i in 0..200 {
        let key = format!("after-freeing-{i}");
        pay(&store, &key).unwrap();
        acknowledged.push(key);
    }
    assert!(!store.stats().disk_full);
    assert_eq!(
        std::fs::metadata(reserve_of(&path)).unwrap().len(),
        3 * JOURNAL,
        "the reserve made anew"
    );
    replays_every_one(&store, &acknowledged, "space freed");

    // Ending 3: a restart after that.
    drop(store);
    let store = open(&path);
    replays_every_one(&store, &acknowledged, "restarted after space was freed");
    pay(&store, "after-the-last-restart").unwrap();

    println!(
        "full disk (48 MiB tmpfs, journal {} MiB, reserve {} MiB): {filled} completions of 4 KiB \
         before DiskFull; {} acknowledged in all, each replayed after every ending; halted by \
         ENOSPC when another writer took the rest, healed {:.0?} later with nothing freed \
         ({replayed_while_halted} replays and {halted_answers} Halted answered meanwhile); restart on the full disk opened in {:.0?}; claims succeeded {:.0?} after space \
         was freed",
        JOURNAL / MIB,
        reserve / MIB,
        acknowledged.len(),
        healed_after,
        reopened_in,
        served_again_after,
    );
}

fn reserve_of(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_os_string();
    name.push("-reserve");
    PathBuf::from(name)
}

/// A tmpfs of a fixed size mounted on a directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount -t tmpfs failed: this test needs root (.ci/run runs it as root)"
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes a file of `bytes` bytes (blocks of its own, on a tmpfs).
fn write_file(path: &Path, bytes: u64) {
    std::fs::write(path, vec![0xa5u8; usize::try_from(bytes).unwrap()]).unwrap();
}

/// Writes `path` until the filesystem refuses (ENOSPC).
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    for chunk in [64 << 10, 4 << 10] {
        let chunk = vec![0xa5u8; chunk];
        loop {
            if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_all()) {
                assert_eq!(e.raw_os_error(), Some(28), "filling: {e}"); // ENOSPC
                break;
            }
        }
    }
}
