//! File size under TTL churn: the bytes of the store file and its journal per live record,
//! after a fresh load and after simulated days of churn with purges. Prints one table.
//!
//! `cargo bench --bench churn` (1 million live records, about 2 minutes and 2 GB of disk), or
//! `IDEMDB_CHURN_KEYS=10000000 cargo bench --bench churn`. `IDEMDB_CHURN_RESPONSE=charge`
//! stores payment API responses instead of the 256-byte ones: each a charge object of 1-4 KB of
//! JSON of its own (`idemdb::simulation::charge`, seeded by the request's number; 2.5 KB on
//! average, so about ten times the disk). `IDEMDB_CHURN_COMPRESS=1` opens the store with
//! `compress_responses(true)`. The store is made anew in
//! `IDEMDB_BENCH_DIR` (or `CARGO_TARGET_TMPDIR`) as `churn-<N>.idem` and deleted at the end.
//!
//! A manual clock drives a 24 h TTL. Day 1 loads N requests (claim, then complete with a
//! 256-byte response, or a charge; keys of 36 characters, the length of a UUID, over 4 tenants) in 96
//! steps of 15 simulated minutes. Days 2 and 3 add N new requests a day the same way, and every
//! step purges what expired, so the store holds about N live records throughout, each written
//! once and deleted a day later: a service at steady state. A row is printed at the end of each
//! day: the live records, the records' own bytes (`Stats::stored_bytes`), the store file and
//! the journal on disk, the file bytes per live record, and the mean wall time of that day's
//! purges (each deletes a step's worth, N/96 records). The last line times a purge that finds
//! nothing due: the pass over the index every purge makes.

use idemdb::simulation::charge;
use idemdb::{Fingerprint, ManualClock, Scope, Store};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[allow(dead_code)] // shared with the other benches, which use all of it
mod common;
use common::SplitMix64;

const RESPONSE_LEN: usize = 256;
const IN_FLIGHT: usize = 8192;
const STEPS_PER_DAY: u64 = 96;
const DAYS: u64 = 3;

fn main() {
    let n: u64 = std::env::var("IDEMDB_CHURN_KEYS").map_or(1_000_000, |s| {
        s.parse().expect("IDEMDB_CHURN_KEYS: a number")
    });
    let dir = std::env::var_os("IDEMDB_BENCH_DIR")
        .or_else(|| std::env::var_os("CARGO_TARGET_TMPDIR"))
        .map_or_else(std::env::temp_dir, PathBuf::from);
    type Shape = (fn(u64) -> common::Request, &'static str);
    let (request, responses): Shape = match std::env::var("IDEMDB_CHURN_RESPONSE").as_deref() {
        Err(_) | Ok("fixed") => (
            |i| (scope(i), key(i), fingerprint(i), body(i)),
            "256 bytes each (IDEMDB_CHURN_RESPONSE=fixed)",
        ),
        Ok("charge") => (
            |i| (scope(i), key(i), fingerprint(i), charge_body(i)),
            "a 1-4 KB JSON charge each (IDEMDB_CHURN_RESPONSE=charge)",
        ),
        Ok(other) => panic!("IDEMDB_CHURN_RESPONSE: fixed or charge, not {other:?}"),
    };
    let compress = std::env::var("IDEMDB_CHURN_COMPRESS").is_ok_and(|v| v == "1");
    println!(
        "{n} live records, responses: {responses}, {}",
        if compress {
            "compressed (IDEMDB_CHURN_COMPRESS=1)"
        } else {
            "not compressed"
        }
    );
    let path = dir.join(format!("churn-{n}.idem"));
    let journal = common::journal_path(&path);
    remove(&path);
    remove(&journal);
    let clock = ManualClock::new();
    let store = Store::builder()
        .ttl(Duration::from_secs(24 * 3600))
        .clock(clock.clone())
        .compress_responses(compress)
        .open(&path)
        .expect("open");
    let per_step = n.div_ceil(STEPS_PER_DAY);
    let step = Duration::from_secs(24 * 3600 / STEPS_PER_DAY);
    println!(
        "{:<28} {:>12} {:>14} {:>14} {:>12} {:>14} {:>10} {:>8}",
        "after",
        "live",
        "record B/live",
        "store file",
        "journal",
        "file B/live",
        "purge ms",
        "time"
    );
    let started = Instant::now();
    let mut next = 0u64;
    let mut purged = 0usize;
    for day in 1..=DAYS {
        let mut purge_time = Duration::ZERO;
        for _ in 0..STEPS_PER_DAY {
            let from = next;
            next += per_step;
            common::claim_and_complete(&store, from..next, IN_FLIGHT, request);
            clock.advance(step);
            if day > 1 {
                let lap = Instant::now();
                purged += store.purge_expired().expect("purge");
                purge_time += lap.elapsed();
            }
        }
        let stats = store.stats();
        let store_bytes = file_len(&path);
        let journal_bytes = file_len(&journal);
        let live = stats.live_records.unwrap_or_default().max(1);
        let what = if day == 1 {
            "day 1 (fresh load)".to_owned()
        } else {
            format!("day {day} ({purged} purged so far)")
        };
        println!(
            "{:<28} {:>12} {:>14} {:>14} {:>12} {:>14} {:>10.1} {:>7.0}s",
            what,
            live,
            stats.stored_bytes / live,
            store_bytes,
            journal_bytes,
            (store_bytes + journal_bytes) / live,
            purge_time.as_secs_f64() * 1e3 / STEPS_PER_DAY as f64,
            started.elapsed().as_secs_f64()
        );
    }
    let lap = Instant::now();
    let none = store.purge_expired().expect("purge");
    let live = store.record_count().expect("count");
    println!(
        "a purge with nothing due ({none} purged) over {live} live records: {:.1} ms",
        lap.elapsed().as_secs_f64() * 1e3
    );
    drop(store);
    let (store_bytes, journal_bytes) = (file_len(&path), file_len(&journal));
    println!(
        "after a clean close: store file {store_bytes} bytes, journal {journal_bytes} bytes, \
         {} file bytes per live record",
        (store_bytes + journal_bytes) / live.max(1)
    );
    print_layout(&path, live.max(1));
    remove(&path);
    remove(&journal);
}

/// Where the closed file's bytes are, per table, as redb counts them: what limits the bytes per
/// record (leaves' fill, branches, pages neither table holds).
fn print_layout(path: &Path, live: u64) {
    use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
    const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
    const HEADS: TableDefinition<u64, [u8; 48]> = TableDefinition::new("heads");
    let db = redb::Database::open(path).expect("the closed store opens with redb");
    let txn = db.begin_read().expect("read");
    let page = 4096;
    println!(
        "{:<10} {:>12} {:>12} {:>16} {:>10} {:>14}",
        "table", "leaf pages", "branch pages", "stored B/live", "leaf fill", "pages B/live"
    );
    let mut in_tables = 0;
    for (name, stats) in [
        (
            "records",
            txn.open_table(RECORDS).and_then(|t| Ok(t.stats()?)),
        ),
        ("heads", txn.open_table(HEADS).and_then(|t| Ok(t.stats()?))),
    ] {
        let stats = stats.expect("table stats");
        let pages = stats.leaf_pages() + stats.branch_pages();
        in_tables += pages * page;
        println!(
            "{:<10} {:>12} {:>12} {:>16} {:>9.0}% {:>14}",
            name,
            stats.leaf_pages(),
            stats.branch_pages(),
            stats.stored_bytes() / live,
            100.0 * stats.stored_bytes() as f64 / (stats.leaf_pages() * page) as f64,
            pages * page / live
        );
    }
    let file = file_len(path);
    println!(
        "pages of neither table (free, meta, redb's own): {} B/live",
        file.saturating_sub(in_tables) / live
    );
}

fn scope(i: u64) -> Scope {
    Scope::new(format!("tenant_{:02}", i % 4), "POST /v1/payments")
}

/// A UUID-shaped key: 36 characters.
fn key(i: u64) -> String {
    let mut r = SplitMix64::derive(0xc4u64 << 32, i, 0);
    let (a, b) = (r.next_u64(), r.next_u64());
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

fn fingerprint(i: u64) -> Fingerprint {
    Fingerprint::of(format!("amount={}", i % 10_000).as_bytes())
}

fn body(i: u64) -> Vec<u8> {
    let mut b = SplitMix64::new(0xb0d7).ascii(RESPONSE_LEN).into_bytes();
    b[..8].copy_from_slice(&i.to_le_bytes());
    b
}

/// Request `i`'s charge: 1-4 KB of JSON, fixed by `i`.
fn charge_body(i: u64) -> Vec<u8> {
    charge(&mut SplitMix64::derive(0xc4a6, i, 0)).into_bytes()
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing {}: {e}", path.display()),
    }
}
