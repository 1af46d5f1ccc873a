//! Opening a damaged or hostile file. The input picks a small valid store image (made once per
//! process by workloads from tests/crash_model) or raw bytes, rewrites its contents through
//! redb (well-formed files with hostile values: checksummed records that lie, odd `meta`
//! values, stray `expiry` entries, missing tables), then damages its bytes (bit flips, 8-byte
//! overwrites, misdirected or lost pages, truncation). The store is opened on a simulated disk;
//! the open must return `Ok` or a typed `Err`, never panic or hang. An opened store is then
//! exercised, and must agree with itself:
//!
//! - `get` and `claim` read the same record: a completed entry replays byte for byte, an entry
//!   claimed with another fingerprint is a mismatch, an orphan is in progress until its lease
//!   runs out and then taken over with a fence above its own;
//! - `reap` keeping everything and `purge_expired` change no live entry;
//! - a fresh key claimed and completed reads back;
//! - on a well-formed file, what the store answered before it was closed, it answers after a
//!   reopen (or, on a file with hostile records, refuses it with `Error::Corrupted`).
//!
//! Byte-damaged images are opened with `PageCheck::Verify`, the others with the default. redb
//! 4.6 trusts its pages without it and panics on some byte damage; idemdb turns those panics
//! into `Error::Corrupted`. Here a panic raised inside redb unwinds
//! (libfuzzer-sys's hook would abort at once): if idemdb contains it, fine; if it escapes
//! idemdb, or a second panic during the unwinding aborts the process, that is a crash.
//! `IDEMDB_FUZZ_LENIENT=1` instead runs byte-damaged images through redb's own integrity check
//! first (which repairs what it can, its panics tolerated) and opens only those it accepts: to
//! fuzz idemdb's own logic past known containment gaps. See `fuzz/README.md`.

#![no_main]

#[path = "../../tests/crash_model/mod.rs"]
mod crash_model;

use arbitrary::{Arbitrary, Unstructured};
use crash_model::{fingerprint, key, response, run_on, scope, workload, Id, Stop};
use crash_model::{ENDPOINTS, KEYS, TENANTS};
use idemdb::simulation::{CrashImage, SimDisk};
use idemdb::{
    Claim, Clock, Entry, EntryState, Fingerprint, ManualClock, PageCheck, Resolution, Store,
};
use libfuzzer_sys::fuzz_target;
use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PAGE: usize = 4096;
/// Writes and edits beyond these are ignored.
const MAX_WRITES: usize = 16;
const MAX_EDITS: usize = 32;
/// Raw images are cut to this length.
const MAX_RAW: usize = 64 << 10;

// The store's tables, as docs/format.md specifies them; `expiry` is format 3's, which an
// open of a format-3 file drops (a later format ignores it).
const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
const EXPIRY: TableDefinition<u128, &[u8]> = TableDefinition::new("expiry");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The time the seed workloads run at (`ManualClock::new()`), in ms.
fn base_ms() -> u64 {
    ms(ManualClock::new().now())
}

fn ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

/// A store file and its journal.
type Pair = (Vec<u8>, Vec<u8>);

fn pair(disk: &SimDisk) -> Pair {
    (disk.image(), disk.journal_image())
}

/// The valid images the fuzzer starts from, made once per process, each with its journal.
fn seeds() -> &'static [Pair] {
    static SEEDS: OnceLock<Vec<Pair>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut out = Vec::new();
        // A new, empty store.
        let disk = SimDisk::new();
        let (_, stop) = run_on(&disk, ManualClock::new(), &[]);
        assert!(matches!(stop, Stop::Done), "{stop:?}");
        out.push(pair(&disk));
        // Small workloads: in-progress, completed (some over a page), released, reaped records.
        for (seed, len) in [(1, 12), (2, 40), (3, 120)] {
            let disk = SimDisk::new();
            let (_, stop) = run_on(&disk, ManualClock::new(), &workload(seed, len));
            assert!(matches!(stop, Stop::Done), "{stop:?}");
            out.push(pair(&disk));
        }
        // A file a power loss left mid-commit, torn: redb recovers it on open.
        let created = SimDisk::new();
        drop(run_on(&created, ManualClock::new(), &[]));
        let steps = workload(4, 40);
        let dry = created.fork();
        drop(run_on(&dry, ManualClock::new(), &steps));
        let disk = created.fork();
        disk.cut_power_after((dry.events() - created.events()) / 2);
        drop(run_on(&disk, ManualClock::new(), &steps));
        disk.crash(CrashImage::Torn(4));
        out.push(pair(&disk));
        out
    })
}

/// Where the image comes from.
#[derive(Arbitrary, Debug)]
enum Source {
    /// One of [`seeds`].
    Seed(u8),
    /// These bytes.
    Raw(Vec<u8>),
}

/// A fence, relative to what the file holds where that helps.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum FenceChoice {
    /// The fence of the n-th record in the file (or 1 if there is none).
    Existing(u8),
    /// Just above the highest record's fence.
    Above(u8),
    /// The top of the range, where `+ 1` overflows.
    Top(u8),
    Exact(u64),
}

/// A time, relative to the seed workloads' clock where that helps.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum TimeChoice {
    /// Seconds from the seed workloads' start (negative: before it).
    Near(i32),
    Exact(u64),
}

impl TimeChoice {
    fn ms(self) -> u64 {
        match self {
            TimeChoice::Near(secs) => base_ms().saturating_add_signed(i64::from(secs) * 1000),
            TimeChoice::Exact(ms) => ms,
        }
    }
}

/// A scoped key: one the exercise looks up, or any bytes.
#[derive(Arbitrary, Debug, Clone)]
enum KeyChoice {
    Workload(u8),
    Raw(Vec<u8>),
}

impl KeyChoice {
    fn bytes(&self) -> Vec<u8> {
        match self {
            KeyChoice::Workload(n) => {
                let n = usize::from(*n);
                let id = (
                    n % TENANTS.len(),
                    (n / TENANTS.len()) % ENDPOINTS.len(),
                    (n / (TENANTS.len() * ENDPOINTS.len())) % (KEYS + 2),
                );
                scoped(id)
            }
            KeyChoice::Raw(bytes) => bytes.clone(),
        }
    }
}

/// The scoped-key encoding of docs/format.md.
fn scoped(id: Id) -> Vec<u8> {
    let (t, e, k) = (
        TENANTS[id.0].as_bytes(),
        ENDPOINTS[id.1].as_bytes(),
        key(id),
    );
    let mut out = vec![u8::try_from(t.len()).unwrap()];
    out.extend_from_slice(t);
    out.extend_from_slice(&u16::try_from(e.len()).unwrap().to_be_bytes());
    out.extend_from_slice(e);
    out.extend_from_slice(k.as_bytes());
    out
}

#[derive(Arbitrary, Debug, Clone)]
enum StateChoice {
    InProgress {
        lease_until: TimeChoice,
    },
    Completed {
        completed_at: TimeChoice,
        expires_at: TimeChoice,
        status: u16,
        headers: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    },
}

/// A well-formed record (format 1, valid checksum) with values the input chooses.
#[derive(Arbitrary, Debug, Clone)]
struct RecordChoice {
    key: KeyChoice,
    /// The fence the body names; `None`: the fence it is stored at.
    fence: Option<FenceChoice>,
    variant: bool,
    claimed_at: TimeChoice,
    state: StateChoice,
}

/// A change made through redb: the file stays well-formed, its contents become hostile.
#[derive(Arbitrary, Debug, Clone)]
enum Write {
    Meta {
        name: MetaName,
        value: u64,
    },
    DeleteMeta {
        name: MetaName,
    },
    /// Stores a well-formed, checksummed record.
    Record {
        at: FenceChoice,
        record: RecordChoice,
    },
    /// Stores these bytes as a record, with a valid checksum appended when `seal`.
    Raw {
        at: FenceChoice,
        bytes: Vec<u8>,
        seal: bool,
    },
    /// Flips bits in a stored record and, when `seal`, fixes its checksum.
    Damage {
        nth: u8,
        at: u16,
        mask: u8,
        seal: bool,
    },
    /// Moves a stored record to another fence.
    Move {
        nth: u8,
        to: FenceChoice,
    },
    Delete {
        nth: u8,
    },
    Expiry {
        expires_at: TimeChoice,
        fence: FenceChoice,
        key: KeyChoice,
    },
    DeleteExpiry {
        nth: u8,
    },
    DropTable {
        which: u8,
    },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MetaName {
    Format,
    FenceReserved,
    StoreId,
    JournalEpoch,
    JournalBytes,
    JournalHeader,
    Other,
}

impl MetaName {
    fn name(self) -> &'static str {
        match self {
            MetaName::Format => "format_version",
            MetaName::FenceReserved => "fence_reserved",
            MetaName::StoreId => "store_id",
            MetaName::JournalEpoch => "journal_epoch",
            MetaName::JournalBytes => "journal_bytes",
            MetaName::JournalHeader => "journal_header_epoch",
            MetaName::Other => "something_else",
        }
    }
}

/// Byte damage. Offsets and pages are taken modulo the image's size.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Edit {
    /// Flips the bits of `mask` in the byte at `at`.
    Xor { at: u32, mask: u8 },
    /// Overwrites 8 bytes (little endian) at `at`.
    Put64 { at: u32, value: u64 },
    /// Copies page `from` over page `to` (a misdirected write).
    CopyPage { from: u16, to: u16 },
    /// Zeroes a page (a lost write on a fresh page).
    ZeroPage { page: u16 },
    /// Cuts the file.
    Truncate { len: u32 },
    /// Grows the file with zeros.
    Grow { by: u16 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    source: Source,
    writes: Vec<Write>,
    edits: Vec<Edit>,
    /// Seconds past the time the seed workloads ran at: leases and TTLs run out.
    advance: u32,
    /// Chooses what the reap resolver decides.
    resolve: u8,
}

/// CRC-32 (IEEE, reflected), as docs/format.md specifies the record checksum.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn seal(mut payload: Vec<u8>) -> Vec<u8> {
    let crc = crc32(&payload);
    payload.extend_from_slice(&crc.to_le_bytes());
    payload
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Encodes a record as docs/format.md lays it out, checksum included.
fn encode(record: &RecordChoice, fence: u64, key: &[u8]) -> Vec<u8> {
    let mut out = vec![1];
    let key = &key[..key.len().min(usize::from(u16::MAX))];
    out.extend_from_slice(&u16::try_from(key.len()).unwrap().to_le_bytes());
    out.extend_from_slice(key);
    put_u64(&mut out, fence);
    out.extend_from_slice(fingerprint(record.variant).as_bytes());
    put_u64(&mut out, record.claimed_at.ms());
    match &record.state {
        StateChoice::InProgress { lease_until } => {
            out.extend_from_slice(&0u32.to_le_bytes());
            put_u64(&mut out, lease_until.ms());
        }
        StateChoice::Completed {
            completed_at,
            expires_at,
            status,
            headers,
            body,
        } => {
            out.extend_from_slice(&1u32.to_le_bytes());
            put_u64(&mut out, completed_at.ms());
            put_u64(&mut out, expires_at.ms());
            out.extend_from_slice(&status.to_le_bytes());
            put_u64(&mut out, headers.len() as u64);
            for (name, value) in headers {
                put_bytes(&mut out, name.as_bytes());
                put_bytes(&mut out, value);
            }
            put_bytes(&mut out, body);
        }
    }
    seal(out)
}

/// Applies `writes` in one redb transaction. Errors (a file redb will not open or write) leave
/// the image as it was.
fn rewrite(disk: &SimDisk, writes: &[Write]) -> Result<(), redb::Error> {
    let db = redb::Builder::new().create_with_backend(disk.backend())?;
    let txn = db.begin_write()?;
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut fences: Vec<u64> = Vec::new();
        for entry in records.iter()? {
            fences.push(entry?.0.value());
        }
        let fence = |c: FenceChoice, fences: &[u64]| -> u64 {
            let high = fences.iter().copied().max().unwrap_or(0);
            match c {
                FenceChoice::Existing(n) if !fences.is_empty() => {
                    fences[usize::from(n) % fences.len()]
                }
                FenceChoice::Existing(_) => 1,
                FenceChoice::Above(n) => high.saturating_add(u64::from(n)),
                FenceChoice::Top(n) => u64::MAX - u64::from(n),
                FenceChoice::Exact(f) => f,
            }
        };
        let nth = |n: u8, fences: &[u64]| -> Option<u64> {
            (!fences.is_empty()).then(|| fences[usize::from(n) % fences.len()])
        };
        for w in writes.iter().take(MAX_WRITES) {
            match w {
                Write::Meta { name, value } => {
                    txn.open_table(META)?.insert(name.name(), *value)?;
                }
                Write::DeleteMeta { name } => {
                    txn.open_table(META)?.remove(name.name())?;
                }
                Write::Record { at, record } => {
                    let at = fence(*at, &fences);
                    let body_fence = record.fence.map_or(at, |c| fence(c, &fences));
                    let value = encode(record, body_fence, &record.key.bytes());
                    records.insert(at, value.as_slice())?;
                    fences.push(at);
                }
                Write::Raw { at, bytes, seal: s } => {
                    let at = fence(*at, &fences);
                    let value = if *s {
                        seal(bytes.clone())
                    } else {
                        bytes.clone()
                    };
                    records.insert(at, value.as_slice())?;
                    fences.push(at);
                }
                Write::Damage {
                    nth: n,
                    at,
                    mask,
                    seal: s,
                } => {
                    let Some(f) = nth(*n, &fences) else { continue };
                    let Some(v) = records.get(f)?.map(|v| v.value().to_vec()) else {
                        continue;
                    };
                    let mut v = v;
                    let body = v.len().saturating_sub(4);
                    if body > 0 {
                        v[usize::from(*at) % body] ^= mask;
                    }
                    if *s && v.len() >= 4 {
                        v.truncate(body);
                        v = seal(v);
                    }
                    records.insert(f, v.as_slice())?;
                }
                Write::Move { nth: n, to } => {
                    let Some(f) = nth(*n, &fences) else { continue };
                    let to = fence(*to, &fences);
                    let Some(v) = records.remove(f)?.map(|v| v.value().to_vec()) else {
                        continue;
                    };
                    records.insert(to, v.as_slice())?;
                    fences.retain(|x| *x != f);
                    fences.push(to);
                }
                Write::Delete { nth: n } => {
                    let Some(f) = nth(*n, &fences) else { continue };
                    records.remove(f)?;
                    fences.retain(|x| *x != f);
                }
                Write::Expiry {
                    expires_at,
                    fence: c,
                    key,
                } => {
                    let k = u128::from(expires_at.ms()) << 64 | u128::from(fence(*c, &fences));
                    txn.open_table(EXPIRY)?.insert(k, key.bytes().as_slice())?;
                }
                Write::DeleteExpiry { nth: n } => {
                    let mut expiry = txn.open_table(EXPIRY)?;
                    let len = usize::try_from(expiry.len()?).unwrap_or(0);
                    if len > 0 {
                        let k = match expiry.iter()?.nth(usize::from(*n) % len) {
                            Some(entry) => Some(entry?.0.value()),
                            None => None,
                        };
                        if let Some(k) = k {
                            expiry.remove(k)?;
                        }
                    }
                }
                Write::DropTable { which } => match which % 3 {
                    // `records` is open in this transaction: clear it instead.
                    0 => {
                        for f in std::mem::take(&mut fences) {
                            records.remove(f)?;
                        }
                    }
                    1 => {
                        txn.delete_table(EXPIRY)?;
                    }
                    _ => {
                        txn.delete_table(META)?;
                    }
                },
            }
        }
    }
    txn.commit()?;
    Ok(())
}

fn pick(n: u32, len: usize) -> usize {
    usize::try_from(n).unwrap_or(0) % len
}

fn apply(image: &mut Vec<u8>, edit: Edit) {
    let len = image.len();
    let pages = len / PAGE;
    match edit {
        Edit::Xor { at, mask } if len > 0 => image[pick(at, len)] ^= mask,
        Edit::Put64 { at, value } if len >= 8 => {
            let at = pick(at, len - 7);
            image[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        Edit::CopyPage { from, to } if pages > 0 => {
            let (from, to) = (pick(from.into(), pages), pick(to.into(), pages));
            image.copy_within(from * PAGE..(from + 1) * PAGE, to * PAGE);
        }
        Edit::ZeroPage { page } if pages > 0 => {
            let p = pick(page.into(), pages);
            image[p * PAGE..(p + 1) * PAGE].fill(0);
        }
        Edit::Truncate { len: to } if len > 0 => image.truncate(pick(to, len)),
        Edit::Grow { by } => image.resize(len + usize::from(by), 0),
        _ => {}
    }
}

fn ids() -> impl Iterator<Item = Id> {
    (0..TENANTS.len())
        .flat_map(|t| (0..ENDPOINTS.len()).flat_map(move |e| (0..KEYS).map(move |k| (t, e, k))))
}

fn other(fp: Fingerprint) -> Fingerprint {
    if fp == fingerprint(false) {
        fingerprint(true)
    } else {
        fingerprint(false)
    }
}

/// `get` and `claim` agree about `id`. Errors end the check (a damaged file may fail any read,
/// and a failed write halts the store); only contradicting answers panic.
fn agree(store: &Store, clock: &ManualClock, id: Id) -> idemdb::Result<()> {
    let (scope, key) = (scope(id), key(id));
    let Some(entry) = store.get(&scope, &key)? else {
        return Ok(());
    };
    let now = clock.now();
    match &entry.state {
        EntryState::Completed { response, .. } => {
            match store.claim(&scope, &key, other(entry.fingerprint))? {
                Claim::Mismatch { completed: true } => {}
                c => panic!("{id:?}: completed {entry:?}, another fingerprint got {c:?}"),
            }
            match store.claim(&scope, &key, entry.fingerprint)? {
                Claim::Replay(r) => assert_eq!(&r, response, "{id:?}: replay differs from get"),
                c => panic!("{id:?}: completed {entry:?}, a claim got {c:?}"),
            }
        }
        EntryState::InProgress {
            lease_deadline,
            orphan,
        } => {
            assert!(
                orphan,
                "{id:?}: in progress right after open, not an orphan"
            );
            match store.claim(&scope, &key, other(entry.fingerprint))? {
                Claim::Mismatch { completed: false } => {}
                c => panic!("{id:?}: in progress {entry:?}, another fingerprint got {c:?}"),
            }
            match store.claim(&scope, &key, entry.fingerprint)? {
                Claim::InProgress { .. } if now < *lease_deadline => {}
                Claim::Acquired(t) if now >= *lease_deadline => {
                    let takeover = t.takeover().expect("a takeover says so");
                    assert_eq!(takeover.previous_fence, entry.fence, "{id:?}");
                    assert!(takeover.orphan, "{id:?}");
                    assert!(
                        t.fence() > entry.fence,
                        "{id:?}: took over fence {} with fence {}",
                        entry.fence,
                        t.fence()
                    );
                    let fence = t.fence();
                    let r = response(id, fence, 10);
                    store.complete(t, r.clone())?;
                    match store.claim(&scope, &key, entry.fingerprint)? {
                        Claim::Replay(got) => assert_eq!(got, r, "{id:?}"),
                        c => panic!("{id:?}: completed at fence {fence}, a claim got {c:?}"),
                    }
                }
                c => panic!("{id:?}: in progress {entry:?} at {now:?}, a claim got {c:?}"),
            }
        }
    }
    Ok(())
}

/// Every workload key's entry, orphan flags cleared (a reopen makes every claim an orphan).
fn snapshot(store: &Store) -> idemdb::Result<Vec<(Id, Option<Entry>)>> {
    let mut out = Vec::new();
    for id in ids() {
        let mut entry = store.get(&scope(id), &key(id))?;
        if let Some(Entry {
            state: EntryState::InProgress { orphan, .. },
            ..
        }) = &mut entry
        {
            *orphan = false;
        }
        out.push((id, entry));
    }
    Ok(out)
}

fn exercise(store: &Store, clock: &ManualClock, resolve: u8) -> idemdb::Result<()> {
    for id in ids() {
        agree(store, clock, id)?;
    }
    let before = snapshot(store)?;
    store.reap(|_| Resolution::Keep)?;
    store.purge_expired()?;
    assert_eq!(
        snapshot(store)?,
        before,
        "reap (keep all) or purge changed a live entry"
    );
    store.reap(|stale| match (u64::from(resolve) ^ stale.fence) % 3 {
        0 => Resolution::Keep,
        1 => Resolution::Release,
        _ => Resolution::Complete(idemdb::Response::new(200, "reaped")),
    })?;
    let fresh = (0, 0, KEYS + 1);
    if let Claim::Acquired(t) = store.claim(&scope(fresh), &key(fresh), fingerprint(false))? {
        let r = response(fresh, t.fence(), 100);
        store.complete(t, r.clone())?;
        let got = store.get(&scope(fresh), &key(fresh))?;
        match got.map(|e| e.state) {
            Some(EntryState::Completed { response, .. }) => assert_eq!(response, r),
            other => panic!("a fresh key completed, then get says {other:?}"),
        }
    }
    Ok(())
}

/// Panics raised inside redb. libfuzzer-sys installs a hook that aborts on any panic, before
/// anything can catch it; the hook chained here lets a panic located in redb's source unwind
/// instead (idemdb's open contains them), records it, and reports each location once. Any
/// other panic still aborts at once.
mod redb_panics {
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::sync::{Mutex, Once};

    thread_local! {
        /// The last redb panic: (location, message).
        static LAST: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
    }
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            let abort = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let location = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                let Some(at) = location.as_deref().and_then(|l| l.rsplit_once("/redb-")) else {
                    return abort(info);
                };
                let at = format!("redb-{}", at.1);
                let message = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
                if seen.insert(at.clone()) {
                    eprintln!(
                        "idemdb-fuzz: redb panicked (site #{}) at {at}: {message}",
                        seen.len()
                    );
                }
                LAST.with(|l| *l.borrow_mut() = Some((at, message)));
            }));
        });
    }

    /// Takes the last redb panic recorded on this thread.
    pub fn last() -> Option<(String, String)> {
        LAST.with(|l| l.borrow_mut().take())
    }

    /// Runs `f`; `None` if it panicked inside redb (the panic is swallowed; the input is saved
    /// under `IDEMDB_FUZZ_REDB_PANICS=<dir>` when the location is new to this process).
    pub fn tolerate<T>(data: &[u8], f: impl FnOnce() -> T) -> Option<T> {
        let before = SEEN.lock().unwrap_or_else(|e| e.into_inner()).len();
        let payload = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(t) => return Some(t),
            Err(payload) => payload,
        };
        let Some((at, message)) = last() else {
            std::panic::resume_unwind(payload);
        };
        let n = SEEN.lock().unwrap_or_else(|e| e.into_inner()).len();
        if n > before {
            if let Some(dir) = std::env::var_os("IDEMDB_FUZZ_REDB_PANICS") {
                let dir = std::path::PathBuf::from(dir);
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(dir.join(format!("redb-panic-{n}")), data);
                let _ = std::fs::write(
                    dir.join(format!("redb-panic-{n}.txt")),
                    format!("{at}: {message}\n"),
                );
            }
        }
        None
    }
}

/// `IDEMDB_FUZZ_DEBUG=1` prints each input as the target reads it.
fn debug() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("IDEMDB_FUZZ_DEBUG").is_some_and(|v| v != "0"))
}

/// `IDEMDB_FUZZ_LENIENT=1`: see the top of this file.
fn lenient() -> bool {
    static LENIENT: OnceLock<bool> = OnceLock::new();
    *LENIENT.get_or_init(|| std::env::var_os("IDEMDB_FUZZ_LENIENT").is_some_and(|v| v != "0"))
}

fuzz_target!(|data: &[u8]| {
    redb_panics::install();
    let _ = redb_panics::last();
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    if debug() {
        eprintln!("{input:#?}");
    }
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one(data, &input)));
    if let Err(payload) = run {
        // Only a redb panic unwinds this far (any other aborted in the hook): idemdb let it
        // through.
        let (at, message) = redb_panics::last().unwrap_or_default();
        eprintln!("idemdb-fuzz: a panic in redb escaped idemdb: {at}: {message}");
        drop(payload);
        std::process::abort();
    }
});

fn one(data: &[u8], input: &Input) {
    let seeds = seeds();
    let ((image, journal), valid) = match &input.source {
        Source::Seed(n) => (seeds[usize::from(*n) % seeds.len()].clone(), true),
        Source::Raw(bytes) => (
            (bytes[..bytes.len().min(MAX_RAW)].to_vec(), Vec::new()),
            false,
        ),
    };
    if debug() {
        eprintln!(
            "image: {} bytes, journal {} bytes",
            image.len(),
            journal.len()
        );
    }
    let disk = SimDisk::from_images(image, journal.clone());
    if !input.writes.is_empty() {
        if valid {
            // A valid image: redb must take the writes without panicking.
            let _ = rewrite(&disk, &input.writes);
        } else if lenient() {
            // Raw bytes: the harness's own redb use may panic. (Not done by default: a second
            // panic while unwinding would abort the process and look like idemdb's fault.)
            let _ = redb_panics::tolerate(data, || rewrite(&disk, &input.writes));
        }
    }
    let edits = &input.edits[..input.edits.len().min(MAX_EDITS)];
    let disk = if edits.is_empty() {
        disk
    } else {
        let mut image = disk.image();
        for edit in edits {
            apply(&mut image, *edit);
        }
        SimDisk::from_images(image, journal)
    };
    // What a reopen after a clean close must do. A seed image untouched must reopen and answer as
    // before. A well-formed file (a seed rewritten through redb, or, lenient, one redb's check
    // accepts) may hold hostile records that the open does not read (it reads their heads): the
    // first session can bring one to light (a purge that deletes a head whose record was moved
    // leaves the tables' counts apart, and the heads' rebuild reads every record), so its reopen
    // may refuse with `Error::Corrupted`, and otherwise answers as before. Damaged bytes may
    // surface anywhere later.
    let mut reopen = match (valid && edits.is_empty(), input.writes.is_empty()) {
        (true, true) => Reopen::Answers,
        (true, false) => Reopen::AnswersOrCorrupted,
        (false, _) => Reopen::Typed,
    };
    if lenient() && reopen == Reopen::Typed {
        if !matches!(
            redb_panics::tolerate(data, || disk.redb_integrity()),
            Some(Ok(_))
        ) {
            return;
        }
        reopen = Reopen::AnswersOrCorrupted;
    }
    // Damaged bytes are opened with every page verified: trusted pages (the default) are not
    // proof against them (`PageCheck::Trust`: a damaged page pointer can make redb allocate
    // gigabytes). Files that redb itself wrote are opened as a service opens them.
    let check = if valid && edits.is_empty() {
        PageCheck::default()
    } else {
        PageCheck::Verify
    };
    open_and_exercise(&disk, input, reopen, check);
}

/// What the reopen of a store that closed cleanly must do (see `one`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reopen {
    /// Open, and answer as before the close.
    Answers,
    /// Refuse with `Error::Corrupted`, or open and answer as before the close for every key
    /// that answered (a key that did not may now: a record the heads did not list).
    AnswersOrCorrupted,
    /// `Ok` or any typed error.
    Typed,
}

fn open_and_exercise(disk: &SimDisk, input: &Input, reopen: Reopen, check: PageCheck) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(input.advance.into()));
    let open = || {
        Store::builder()
            .clock(clock.clone())
            .page_check(check)
            .open_simulated(disk)
    };
    let store = match open() {
        Ok(store) => store,
        Err(e) => {
            if debug() {
                eprintln!("open: {e}");
            }
            return;
        }
    };
    let exercised = exercise(&store, &clock, input.resolve);
    if debug() {
        eprintln!(
            "open: ok; {} records; exercise: {exercised:?}",
            store.record_count().unwrap()
        );
    }
    if exercised.is_err() {
        return;
    }
    let Ok(before) = snapshot(&store) else {
        return;
    };
    drop(store);
    let store = match (open(), reopen) {
        (Ok(store), Reopen::Answers | Reopen::AnswersOrCorrupted) => store,
        (Err(idemdb::Error::Corrupted { .. }), Reopen::AnswersOrCorrupted) | (_, Reopen::Typed) => {
            return
        }
        (Err(e), _) => panic!("a store that just closed cleanly reopens ({reopen:?}): {e:?}"),
    };
    let after = snapshot(&store).expect("a store that just reopened reads");
    if reopen == Reopen::Answers {
        assert_eq!(after, before, "a reopen changed what the store answers");
    } else {
        // A record written with no head is invisible until a rebuild of the heads reads the
        // records (the first session's deletions can part the tables' counts): it may appear.
        // Nothing that answered may change or vanish.
        for ((id, was), (_, is)) in before.iter().zip(&after) {
            if was.is_some() {
                assert_eq!(is, was, "{id:?}: a reopen changed what the store answers");
            }
        }
    }
}
