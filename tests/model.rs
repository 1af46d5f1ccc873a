//! Model-based test of the store: proptest generates sequences of operations (claim, complete,
//! release, extend, reap, purge, clock advances, reopen, get) mixed with crash and fault steps
//! (power loss with a chosen crash image, the power cut part way through the next operations,
//! a failing write or fsync), each sequence runs against a real `Store` on a simulated disk
//! (`idemdb::simulation::SimDisk`) and against a plain reference model, and every outcome is
//! compared exactly.
//!
//! The model is deliberately naive: a `BTreeMap` from (tenant, endpoint, key) to the record as
//! the documented semantics describe it, a clock in milliseconds, and the tickets the test holds.
//! Nothing in it mirrors the store's index, stripes, commit pipeline or on-disk format.
//!
//! Crashes and faults, as the model sees them:
//! - every acknowledged operation was fsynced, so a crash is a reopen: claims in progress become
//!   orphans, held tickets are stale, and nothing else changes, whatever the crash image;
//! - an operation that returned an I/O error may or may not have landed (its batch is one redb
//!   transaction: all of it or none). The model keeps both states, the one before the failed
//!   batch and the one after it, and after the crash adopts whichever the store shows (every
//!   key's `get` and the record count must match one of them exactly);
//! - after a failed commit the store is fail-stop for writes: every call answers
//!   `Error::Halted` until the store is reopened, except claims whose answer only reads a key
//!   whose writes all became durable (a replay, in progress, a mismatch), which must be what the
//!   reopened store will answer, whichever way the failed batch went.
//!
//! Cases default to [`DEFAULT_CASES`] per stale policy; `PROPTEST_CASES` or `IDEMDB_MODEL_CASES`
//! raise it, and `IDEMDB_MODEL_STEPS` changes the longest sequence. Each property prints how
//! many cases, steps, crashes and faults it ran (`cargo test --test model -- --nocapture`).

use idemdb::simulation::{mix, CrashImage, SimDisk};
use idemdb::{
    Claim, Entry, EntryState, Error, Fingerprint, ManualClock, Resolution, Response, Scope,
    StaleClaim, StalePolicy, Store, Takeover, Ticket,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{FileFailurePersistence, TestCaseError, TestRunner};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const LEASE_MS: u64 = 60_000;
const TTL_MS: u64 = 3_600_000;
const RETRY_AFTER_MS: u64 = 5_000;
/// Small, so that some completions are refused. Generated responses are either far below it
/// (at most ~150 encoded bytes) or far above it (a body of 400 bytes or more), so the test does
/// not depend on the exact encoded size.
const MAX_RESPONSE: usize = 256;
/// `ManualClock::new()`: 2026-01-01T00:00:00Z.
const T0_MS: u64 = 1_767_225_600_000;

const DEFAULT_CASES: u32 = 128;
const DEFAULT_STEPS: usize = 60;

// Names that are prefixes of one another, so an ambiguous key encoding would show.
const TENANTS: [&str; 2] = ["acme", "acme2"];
const ENDPOINTS: [&str; 2] = ["POST /v1/payments", "POST /v1/payments/refund"];
const KEYS: [&str; 3] = ["k", "k1", "7c9e6679-7425-40de-944b"];

/// (tenant, endpoint, key), each an index into the tables above.
type Key = (u8, u8, u8);

fn scope_of(k: Key) -> Scope {
    Scope::new(TENANTS[usize::from(k.0)], ENDPOINTS[usize::from(k.1)])
}

fn name_of(k: Key) -> &'static str {
    KEYS[usize::from(k.2)]
}

fn key_of(scope: &Scope, key: &str) -> Option<Key> {
    let pos = |table: &[&str], s: &str| {
        table
            .iter()
            .position(|t| *t == s)
            .and_then(|i| u8::try_from(i).ok())
    };
    Some((
        pos(&TENANTS, scope.tenant())?,
        pos(&ENDPOINTS, scope.endpoint())?,
        pos(&KEYS, key)?,
    ))
}

fn all_keys() -> impl Iterator<Item = Key> {
    (0..2u8).flat_map(|t| (0..2u8).flat_map(move |e| (0..3u8).map(move |k| (t, e, k))))
}

fn fp(i: u8) -> Fingerprint {
    Fingerprint::of(if i == 0 { b"request-a" } else { b"request-b" })
}

fn fp_index(f: Fingerprint) -> Option<u8> {
    (0..2u8).find(|&i| fp(i) == f)
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn ms_of(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).expect("after the epoch");
    u64::try_from(d.as_millis()).expect("fits")
}

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

fn ok<T>(r: idemdb::Result<T>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| fail(format!("{what}: unexpected error: {e:?}")))
}

// ------------------------------------------------------------------------------------------
// Operations
// ------------------------------------------------------------------------------------------

/// A response as generated; `pad` bytes of 0xAB are appended to the body (0, or enough to go
/// over [`MAX_RESPONSE`]), which keeps shrunk failures readable.
#[derive(Debug, Clone)]
struct Resp {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    pad: usize,
}

impl Resp {
    fn build(&self) -> Response {
        let mut body = self.body.clone();
        body.resize(body.len() + self.pad, 0xAB);
        let mut r = Response::new(self.status, body);
        for (n, v) in &self.headers {
            r = r.with_header(n.clone(), v.clone());
        }
        r
    }

    fn oversize(&self) -> bool {
        self.pad > 0
    }
}

/// Picks one of the tickets the test holds: the `n % len`-th.
#[derive(Debug, Clone, Copy)]
struct Pick(u16);

impl Pick {
    fn index(&self, len: usize) -> usize {
        usize::from(self.0) % len
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    any::<u16>().prop_map(Pick)
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: Key,
        fp: u8,
    },
    Complete {
        ticket: Pick,
        response: Resp,
    },
    Release {
        ticket: Pick,
    },
    Extend {
        ticket: Pick,
        ms: u64,
    },
    /// Forget a ticket without finishing it, as a crashed handler would.
    DropTicket {
        ticket: Pick,
    },
    /// The resolver's decision for each stale claim is a function of `seed` and the claim's
    /// fence, so it does not depend on the order the store offers claims in. Before deciding,
    /// the resolver's n-th call runs `interleave[n]` (the API lets a resolver use the store):
    /// claims, completions, releases, extensions, gets, purges and small clock advances made
    /// while a reap is under way.
    Reap {
        seed: u64,
        interleave: Vec<Op>,
    },
    Purge,
    /// Only inside a resolver: extend (`how % 3 == 0`), complete (1) or release (2) the ticket
    /// of the very claim being offered, if the test holds it. The reap must then leave that
    /// claim alone.
    TouchOffered {
        how: u8,
    },
    Advance {
        ms: u64,
    },
    /// Drop the store and open the file again, with the clock stepped back by
    /// `clock_back_ms` (a restart on a machine whose clock was corrected). After a fault was
    /// injected, the disk is mended first: the fault is cleared and the file is every write
    /// the OS accepted (a restart, not a power loss).
    Reopen {
        clock_back_ms: u64,
    },
    Get {
        key: Key,
    },
    /// A power loss: the disk is copied as it is at this instant (no clean close), the store is
    /// dropped, the copy keeps `image` of the writes not yet synced, redb's integrity check
    /// must find nothing to repair, and the store is opened on it again.
    Crash {
        image: CrashImage,
    },
    /// Cuts the power after `after_events` more writes and syncs, runs `ops` (which may fail
    /// once the power is off; the window ends after the first operation that finds it off),
    /// then crashes with `image`.
    PowerCut {
        after_events: u64,
        ops: Vec<Op>,
        image: CrashImage,
    },
    /// The write `after` writes from now fails (with `forever`, every write after it too: a
    /// full disk). The operation whose commit meets it fails, and the store halts.
    FailWrite {
        after: u64,
        forever: bool,
    },
    /// The fsync `after` fsyncs from now fails (with `forever`, every one after it too).
    FailSync {
        after: u64,
        forever: bool,
    },
}

#[derive(Debug, Clone)]
struct Case {
    stripes: usize,
    ops: Vec<Op>,
}

fn key_strategy() -> impl Strategy<Value = Key> {
    (0..2u8, 0..2u8, 0..3u8)
}

fn resp_strategy() -> impl Strategy<Value = Resp> {
    let header = (
        prop::sample::select(vec!["content-type", "set-cookie", "x-request-id", "X-Dup"]),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(n, v)| (n.to_string(), v));
    (
        prop_oneof![
            Just(200u16),
            Just(201u16),
            Just(422u16),
            Just(500u16),
            any::<u16>()
        ],
        prop::collection::vec(header, 0..3),
        prop::collection::vec(any::<u8>(), 0..32),
        prop_oneof![9 => Just(0usize), 1 => 400usize..600],
    )
        .prop_map(|(status, headers, body, pad)| Resp {
            status,
            headers,
            body,
            pad,
        })
}

fn claim_strategy() -> impl Strategy<Value = Op> {
    (key_strategy(), prop_oneof![4 => Just(0u8), 1 => Just(1u8)])
        .prop_map(|(key, fp)| Op::Claim { key, fp })
}

fn extend_strategy() -> impl Strategy<Value = Op> {
    let ms = prop_oneof![
        2 => Just(0u64),
        4 => 1u64..=5_000,
        4 => 30_000u64..=180_000,
        1 => Just(u64::MAX),
    ];
    (pick(), ms).prop_map(|(ticket, ms)| Op::Extend { ticket, ms })
}

/// What a resolver may do in the middle of a reap. No reopen (the reaping store is open), no
/// nested reap, and no clock advance long enough to expire a record the reap just completed
/// (its expiry entry is committed only when the reap ends, so a purge in between could not
/// see it: not a contract worth pinning).
fn interleaved_op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => claim_strategy(),
        6 => any::<u8>().prop_map(|how| Op::TouchOffered { how }),
        2 => (pick(), resp_strategy())
            .prop_map(|(ticket, response)| Op::Complete { ticket, response }),
        1 => pick().prop_map(|ticket| Op::Release { ticket }),
        1 => extend_strategy(),
        1 => Just(Op::Purge),
        2 => (1u64..=70_000).prop_map(|ms| Op::Advance { ms }),
        1 => key_strategy().prop_map(|key| Op::Get { key }),
    ]
}

fn advance_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => 1u64..=2_000,
        3 => 20_000u64..=70_000,
        1 => Just(LEASE_MS),
        1 => Just(TTL_MS),
        1 => 3_000_000u64..=4 * 3_600_000,
    ]
    .prop_map(|ms| Op::Advance { ms })
}

fn image_strategy() -> impl Strategy<Value = CrashImage> {
    prop_oneof![
        1 => Just(CrashImage::Durable),
        1 => Just(CrashImage::All),
        1 => any::<u64>().prop_map(CrashImage::Subset),
        1 => any::<u64>().prop_map(CrashImage::Torn),
    ]
}

/// What runs while the power is about to go: everything but reopens, crashes, faults and
/// resolvers that call the store (a read refused for want of power does not halt the store,
/// so what a resolver's later calls answer would depend on which read it was).
fn power_window_op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => claim_strategy(),
        4 => (pick(), resp_strategy())
            .prop_map(|(ticket, response)| Op::Complete { ticket, response }),
        2 => pick().prop_map(|ticket| Op::Release { ticket }),
        2 => extend_strategy(),
        2 => any::<u64>().prop_map(|seed| Op::Reap { seed, interleave: Vec::new() }),
        1 => Just(Op::Purge),
        1 => advance_strategy(),
        1 => key_strategy().prop_map(|key| Op::Get { key }),
    ]
}

/// The crash and fault steps.
fn crash_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => image_strategy().prop_map(|image| Op::Crash { image }),
        3 => (
            0u64..=24,
            prop::collection::vec(power_window_op_strategy(), 1..=4),
            image_strategy(),
        )
            .prop_map(|(after_events, ops, image)| Op::PowerCut {
                after_events,
                ops,
                image,
            }),
        2 => (0u64..=12, any::<bool>())
            .prop_map(|(after, forever)| Op::FailWrite { after, forever }),
        2 => (0u64..=2, any::<bool>())
            .prop_map(|(after, forever)| Op::FailSync { after, forever }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let interleave = prop_oneof![
        1 => Just(Vec::new()),
        1 => prop::collection::vec(interleaved_op_strategy(), 1..4),
    ];
    prop_oneof![
        8 => claim_strategy(),
        4 => (pick(), resp_strategy())
            .prop_map(|(ticket, response)| Op::Complete { ticket, response }),
        2 => pick().prop_map(|ticket| Op::Release { ticket }),
        2 => extend_strategy(),
        1 => pick().prop_map(|ticket| Op::DropTicket { ticket }),
        2 => (any::<u64>(), interleave)
            .prop_map(|(seed, interleave)| Op::Reap { seed, interleave }),
        2 => Just(Op::Purge),
        4 => advance_strategy(),
        1 => prop_oneof![4 => Just(0u64), 1 => 1u64..=2 * 3_600_000]
            .prop_map(|clock_back_ms| Op::Reopen { clock_back_ms }),
        1 => key_strategy().prop_map(|key| Op::Get { key }),
        3 => crash_strategy(),
    ]
}

fn max_steps() -> usize {
    std::env::var("IDEMDB_MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_STEPS)
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(vec![1usize, 4, 64]),
        prop::collection::vec(op_strategy(), 1..=max_steps()),
    )
        .prop_map(|(stripes, ops)| Case { stripes, ops })
}

fn config() -> ProptestConfig {
    let mut config = ProptestConfig {
        source_file: Some(file!()),
        // Next to this file, as tests/model.proptest-regressions.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    if let Some(n) = std::env::var("IDEMDB_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        config.cases = n;
    }
    config
}

// ------------------------------------------------------------------------------------------
// Reaper decisions
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Release,
    Complete,
    Keep,
    /// The resolver claims the key itself, with the stale claim's fingerprint or the other
    /// one, then releases or completes. A takeover by that claim must make the reap leave the
    /// key alone.
    Meddle {
        other_fp: bool,
        then_complete: bool,
    },
    /// Complete with a response over the limit: the reap stops with `ResponseTooLarge`,
    /// keeping what it resolved before.
    TooLarge,
}

fn decide(seed: u64, fence: u64) -> Decision {
    let h = mix(seed ^ fence.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    match h % 16 {
        0..=3 => Decision::Release,
        4..=7 => Decision::Complete,
        8..=9 => Decision::Keep,
        10..=14 => Decision::Meddle {
            other_fp: (h >> 8).is_multiple_of(4),
            then_complete: (h >> 16) & 1 == 1,
        },
        _ => Decision::TooLarge,
    }
}

fn reaped_response(seed: u64, fence: u64) -> Response {
    let status = 200 + u16::try_from(fence % 3).expect("small");
    Response::new(status, format!("reaped fence {fence}"))
        .with_header("x-reaped-by", format!("seed {}", seed % 1000))
}

fn resolution(seed: u64, fence: u64, d: Decision) -> Resolution {
    match d {
        Decision::Keep => Resolution::Keep,
        Decision::Release
        | Decision::Meddle {
            then_complete: false,
            ..
        } => Resolution::Release,
        Decision::Complete
        | Decision::Meddle {
            then_complete: true,
            ..
        } => Resolution::Complete(reaped_response(seed, fence)),
        Decision::TooLarge => {
            Resolution::Complete(Response::new(200, vec![0x5A; 2 * MAX_RESPONSE]))
        }
    }
}

// ------------------------------------------------------------------------------------------
// The reference model
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum MState {
    InProgress { lease_until: u64, orphan: bool },
    Completed { expires_at: u64, response: Response },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MRecord {
    fence: u64,
    fp: u8,
    claimed_at: u64,
    state: MState,
}

/// What the test knows of a ticket it holds.
#[derive(Debug, Clone)]
struct MTicket {
    key: Key,
    fence: u64,
    fp: u8,
    lease_until: u64,
    /// Which store instance issued it (bumped by every reopen).
    epoch: u64,
}

/// The store's counters since it was opened (all but `commit_batches`, which depends on how
/// operations were grouped into commits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MCounters {
    acquired: u64,
    replays: u64,
    in_progress: u64,
    mismatches: u64,
    completes: u64,
    releases: u64,
    takeovers: u64,
    reaped: u64,
    purged: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Acquired {
        takeover: Option<Takeover>,
    },
    Replay(Response),
    InProgress {
        retry_after: Duration,
        lease_remaining: Duration,
        orphan: bool,
    },
    Mismatch {
        completed: bool,
    },
}

#[derive(Debug, Clone)]
struct Model {
    policy: StalePolicy,
    now: u64,
    epoch: u64,
    records: Records,
    counters: MCounters,
    /// Completions made by the reap under way: not durable until the reap returns, so claims
    /// answer `InProgress` for them (and `get` shows them in progress) meanwhile.
    not_durable: BTreeSet<(Key, u64)>,
}

impl Model {
    fn new(policy: StalePolicy) -> Model {
        Model {
            policy,
            now: T0_MS,
            epoch: 0,
            records: BTreeMap::new(),
            counters: MCounters::default(),
            not_durable: BTreeSet::new(),
        }
    }

    /// The outcome of a claim. Counts non-acquiring outcomes; an acquisition is recorded by
    /// [`Model::acquire`] once the store has told the fence.
    fn claim(&mut self, key: Key, f: u8) -> Expect {
        let now = self.now;
        let e = match self.records.get(&key) {
            None => Expect::Acquired { takeover: None },
            Some(r) => match &r.state {
                MState::Completed { expires_at, .. } if now >= *expires_at => {
                    Expect::Acquired { takeover: None }
                }
                _ if r.fp != f => Expect::Mismatch {
                    completed: matches!(r.state, MState::Completed { .. }),
                },
                MState::Completed { .. } if self.not_durable.contains(&(key, r.fence)) => {
                    Expect::InProgress {
                        retry_after: Duration::from_millis(RETRY_AFTER_MS),
                        lease_remaining: Duration::ZERO,
                        orphan: false,
                    }
                }
                MState::Completed { response, .. } => Expect::Replay(response.clone()),
                MState::InProgress {
                    lease_until,
                    orphan,
                } if now < *lease_until => {
                    let left = Duration::from_millis(lease_until - now);
                    // Nobody is left to finish an orphan: come back when its lease ends.
                    let hint = Duration::from_millis(RETRY_AFTER_MS);
                    Expect::InProgress {
                        retry_after: if *orphan { left } else { hint.min(left) },
                        lease_remaining: left,
                        orphan: *orphan,
                    }
                }
                // A kept stale claim stays what it was: an orphan if its holder is gone.
                MState::InProgress { orphan, .. } if self.policy == StalePolicy::Keep => {
                    Expect::InProgress {
                        retry_after: Duration::from_millis(RETRY_AFTER_MS),
                        lease_remaining: Duration::ZERO,
                        orphan: *orphan,
                    }
                }
                MState::InProgress { orphan, .. } => Expect::Acquired {
                    takeover: Some(Takeover {
                        previous_fence: r.fence,
                        previous_claimed_at: at(r.claimed_at),
                        orphan: *orphan,
                    }),
                },
            },
        };
        match e {
            Expect::Acquired { .. } => {}
            Expect::Replay(_) => self.counters.replays += 1,
            Expect::InProgress { .. } => self.counters.in_progress += 1,
            Expect::Mismatch { .. } => self.counters.mismatches += 1,
        }
        e
    }

    fn acquire(&mut self, key: Key, f: u8, fence: u64, takeover: bool) -> MTicket {
        self.counters.acquired += 1;
        if takeover {
            self.counters.takeovers += 1;
        }
        let lease_until = self.now + LEASE_MS;
        self.records.insert(
            key,
            MRecord {
                fence,
                fp: f,
                claimed_at: self.now,
                state: MState::InProgress {
                    lease_until,
                    orphan: false,
                },
            },
        );
        MTicket {
            key,
            fence,
            fp: f,
            lease_until,
            epoch: self.epoch,
        }
    }

    fn holds(&self, t: &MTicket) -> bool {
        t.epoch == self.epoch
            && self
                .records
                .get(&t.key)
                .is_some_and(|r| r.fence == t.fence && matches!(r.state, MState::InProgress { .. }))
    }

    /// A ticket dropped unspent: its claim, if it still holds one, is an orphan now.
    fn abandon(&mut self, t: &MTicket) {
        if self.holds(t) {
            if let Some(MRecord {
                state: MState::InProgress { orphan, .. },
                ..
            }) = self.records.get_mut(&t.key)
            {
                *orphan = true;
            }
        }
    }

    fn complete(&mut self, key: Key, response: Response) {
        let r = self.records.get_mut(&key).expect("held");
        r.state = MState::Completed {
            expires_at: self.now + TTL_MS,
            response,
        };
    }

    fn get(&self, key: Key) -> Option<Entry> {
        let r = self.records.get(&key)?;
        let state = match &r.state {
            MState::Completed { expires_at, .. } if self.now >= *expires_at => return None,
            MState::Completed { .. } if self.not_durable.contains(&(key, r.fence)) => {
                EntryState::InProgress {
                    lease_deadline: at(self.now),
                    orphan: false,
                }
            }
            MState::Completed {
                expires_at,
                response,
            } => EntryState::Completed {
                expires_at: at(*expires_at),
                response: response.clone(),
            },
            MState::InProgress {
                lease_until,
                orphan,
            } => EntryState::InProgress {
                lease_deadline: at(*lease_until),
                orphan: *orphan,
            },
        };
        Some(Entry {
            fence: r.fence,
            fingerprint: fp(r.fp),
            claimed_at: at(r.claimed_at),
            state,
        })
    }

    /// (key, fence, fingerprint, claimed_at, lease_until, orphan) of every claim a reap offers.
    fn stale(&self) -> Vec<StaleTuple> {
        self.records
            .iter()
            .filter_map(|(k, r)| match r.state {
                MState::InProgress {
                    lease_until,
                    orphan,
                } if orphan || self.now >= lease_until => {
                    Some((*k, r.fence, r.fp, r.claimed_at, lease_until, orphan))
                }
                _ => None,
            })
            .collect()
    }

    fn purge(&mut self) -> usize {
        let now = self.now;
        let before = self.records.len();
        self.records.retain(
            |_, r| !matches!(r.state, MState::Completed { expires_at, .. } if now >= expires_at),
        );
        before - self.records.len()
    }

    fn reopen(&mut self) {
        self.epoch += 1;
        self.counters = MCounters::default();
        self.not_durable.clear();
        orphan_all(&mut self.records);
    }
}

/// What a reopen makes of the records: every claim in progress is an orphan.
fn orphan_all(records: &mut Records) {
    for r in records.values_mut() {
        if let MState::InProgress { orphan, .. } = &mut r.state {
            *orphan = true;
        }
    }
}

type Records = BTreeMap<Key, MRecord>;

/// The fence of a claim whose call failed: the store chose one, but nobody was told which.
/// Only found in the "landed" state of an [`Ambiguity`]; adopting that state replaces it with
/// the fence the store shows.
const UNKNOWN_FENCE: u64 = u64::MAX;

// ------------------------------------------------------------------------------------------
// The harness: real store and model side by side
// ------------------------------------------------------------------------------------------

type StaleTuple = (Key, u64, u8, u64, u64, bool);

/// A reap under way, as the resolver sees it.
struct ReapState {
    seed: u64,
    /// The stale claims when the reap began (sorted).
    snapshot: Vec<StaleTuple>,
    offered: BTreeSet<StaleTuple>,
    /// The resolver's last answer, not yet applied: (key, fence, lease_until, orphan, answer).
    pending: Option<(Key, u64, u64, bool, Resolution)>,
    resolved: usize,
    /// Resolutions queued since the last commit: a call the resolver makes commits them.
    unsynced: usize,
    too_large: bool,
    /// A call the resolver made failed and halted the store: (unsynced, resolved) then.
    halted_at: Option<(usize, usize)>,
    error: Option<TestCaseError>,
}

/// How often each interesting outcome happened, to show the generator reaches them.
type Coverage = BTreeMap<&'static str, u64>;

/// The disk as the harness knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// No fault armed: every call must answer as the model says.
    Normal,
    /// A failing write or fsync, or a power cut, is armed: a call that commits (or, once the
    /// power is off, one that reads the disk) may fail; a call that succeeds must answer as the
    /// model says.
    Armed,
    /// A call failed. `surely`: it failed in its commit, so until the store is reopened every
    /// call must answer `Error::Halted` (fail-stop). Otherwise a read may have failed for want
    /// of power, which halts nothing; the power window ends there, and nothing is compared
    /// until the crash.
    Failed { surely: bool },
}

/// A failed call's batch may or may not be in the file: the records as of the last commit
/// that succeeded (`before`), or with the failed batch applied (`after`).
#[derive(Debug)]
struct Ambiguity {
    what: String,
    before: Records,
    after: Records,
}

/// Where the store lives.
enum Backing {
    Sim(SimDisk),
    /// A real file, for the scripted example (no crash or fault steps).
    File {
        path: PathBuf,
        _dir: tempfile::TempDir,
    },
}

struct Harness {
    // Field order is drop order: the store closes before its directory is removed.
    store: Option<Store>,
    tickets: Vec<(Ticket, MTicket)>,
    model: Model,
    clock: ManualClock,
    policy: StalePolicy,
    stripes: usize,
    /// The highest fence any `Acquired` ticket carried, over every store instance (and the
    /// fence of a failed claim that turned out to have landed).
    last_fence: u64,
    /// Inside a resolver: the (key, fence) of the claim it is deciding on.
    offering: Option<(Key, u64)>,
    cov: Coverage,
    health: Health,
    /// In a power window: the I/O event count at which the power goes.
    power_off_at: Option<u64>,
    /// The records as of the last commit known to have succeeded: what the file holds if the
    /// batch being written now fails. Every call returns only once its batch is durable, so
    /// this is the model before each step, except in a reap, whose resolutions are queued
    /// until it ends (or until a call its resolver makes commits them).
    durable: Records,
    ambiguity: Option<Ambiguity>,
    /// A reap is under way: the calls its resolver makes are steps too.
    reaping: bool,
    backing: Backing,
}

fn temp_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("idemdb-model-")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("idemdb-model-")
        .tempdir()
        .expect("temp dir")
}

fn is_crash_or_fault(op: &Op) -> bool {
    matches!(
        op,
        Op::Crash { .. } | Op::PowerCut { .. } | Op::FailWrite { .. } | Op::FailSync { .. }
    )
}

impl Harness {
    fn new(policy: StalePolicy, stripes: usize, on_file: bool) -> Result<Harness, TestCaseError> {
        let backing = if on_file {
            let dir = temp_dir();
            Backing::File {
                path: dir.path().join("model.idem"),
                _dir: dir,
            }
        } else {
            Backing::Sim(SimDisk::new())
        };
        let mut h = Harness {
            store: None,
            tickets: Vec::new(),
            model: Model::new(policy),
            clock: ManualClock::new(),
            policy,
            stripes,
            last_fence: 0,
            offering: None,
            cov: Coverage::new(),
            health: Health::Normal,
            power_off_at: None,
            durable: Records::new(),
            ambiguity: None,
            reaping: false,
            backing,
        };
        prop_assert_eq!(ms_of(idemdb::Clock::now(&h.clock)), T0_MS);
        h.store = Some(h.open()?);
        Ok(h)
    }

    fn open(&self) -> Result<Store, TestCaseError> {
        let builder = Store::builder()
            .lease(Duration::from_millis(LEASE_MS))
            .ttl(Duration::from_millis(TTL_MS))
            .retry_after(Duration::from_millis(RETRY_AFTER_MS))
            .max_response_bytes(MAX_RESPONSE)
            .stale_policy(self.policy)
            .stripes(self.stripes)
            .clock(self.clock.clone());
        let store = match &self.backing {
            Backing::Sim(disk) => builder.open_simulated(disk),
            Backing::File { path, .. } => builder.open(path),
        };
        ok(store, "open")
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    fn disk(&self) -> Result<SimDisk, TestCaseError> {
        match &self.backing {
            Backing::Sim(disk) => Ok(disk.clone()),
            Backing::File { .. } => Err(fail("crash and fault steps need the simulated disk")),
        }
    }

    fn hit(&mut self, what: &'static str) {
        *self.cov.entry(what).or_default() += 1;
    }

    fn halted(&self) -> bool {
        matches!(self.health, Health::Failed { .. })
    }

    fn power_is_off(&self) -> bool {
        match (&self.backing, self.power_off_at) {
            (Backing::Sim(disk), Some(at)) => disk.events() >= at,
            _ => false,
        }
    }

    /// A fault was injected: calls may fail from now on (unless one already did).
    fn arm(&mut self) {
        if self.health == Health::Normal {
            self.health = Health::Armed;
        }
    }

    /// With a fault armed, a call may find the store halted though no call failed: redb
    /// applies a batch after its callers were answered (the journal holds it), and that write
    /// may fail. The refusal changes nothing, and from then on every call answers `Halted`, as
    /// after a failed commit; what was answered is durable.
    fn halted_after_an_answer(&mut self, e: &Error) -> bool {
        if self.health == Health::Armed && matches!(e, Error::Halted { .. }) {
            self.hit("halted by a failed apply after the answer");
            self.health = Health::Failed { surely: true };
            true
        } else {
            false
        }
    }

    /// After a call failed in its commit, every call answers `Error::Halted`.
    fn expect_halted<T: std::fmt::Debug>(
        &mut self,
        what: &str,
        r: idemdb::Result<T>,
    ) -> Result<(), TestCaseError> {
        match (self.health, r) {
            (Health::Failed { surely: true }, Err(Error::Halted { .. })) => {
                self.hit("halted: call refused");
                Ok(())
            }
            (Health::Failed { surely: true }, other) => Err(fail(format!(
                "{what} on a store whose commit failed answered {other:?}, not Halted"
            ))),
            // The power is off and it was perhaps a read that failed: anything goes until the
            // crash that follows.
            _ => Ok(()),
        }
    }

    /// A call failed with `e`. Allowed only with a fault armed, and only as an I/O error.
    /// From now on the file holds either what it held after the last successful commit or that
    /// plus the failed batch, which is `landed`; the crash or reopen that follows tells which.
    /// `in_commit`: the call can only have failed in its commit (not in a read of the disk).
    fn faulted(
        &mut self,
        what: String,
        e: &Error,
        landed: Records,
        in_commit: bool,
    ) -> Result<(), TestCaseError> {
        if self.halted_after_an_answer(e) {
            return Ok(());
        }
        if self.health != Health::Armed {
            return Err(fail(format!("{what}: unexpected error {e:?}")));
        }
        if !matches!(e, Error::Io(_) | Error::Storage(_)) {
            return Err(fail(format!(
                "{what}: with a fault injected, failed with {e:?} rather than the I/O error"
            )));
        }
        let power = self.power_off_at.is_some();
        if power {
            prop_assert!(
                self.power_is_off(),
                "{} failed with the power still on: {:?}",
                what,
                e
            );
        }
        self.hit(if power {
            "call failed: power off"
        } else {
            "call failed: injected fault"
        });
        self.ambiguity = Some(Ambiguity {
            what,
            before: self.durable.clone(),
            after: landed,
        });
        // A failing write or fsync touches commits only; a power cut fails reads too.
        self.health = Health::Failed {
            surely: in_commit || !power,
        };
        Ok(())
    }

    /// Compares the store's answer to a claim of `key` with fingerprint `f` with the model's,
    /// and records an acquisition in both.
    fn check_claim(&mut self, key: Key, f: u8, real: Claim) -> Result<(), TestCaseError> {
        let reclaim_expired = matches!(
            self.model.records.get(&key),
            Some(MRecord { state: MState::Completed { expires_at, .. }, .. })
                if self.model.now >= *expires_at
        );
        let not_durable = self
            .model
            .records
            .get(&key)
            .is_some_and(|r| self.model.not_durable.contains(&(key, r.fence)));
        let expected = self.model.claim(key, f);
        match (expected, real) {
            (Expect::Acquired { takeover }, Claim::Acquired(ticket)) => {
                prop_assert!(
                    ticket.fence() > self.last_fence,
                    "fence {} is not above the last fence issued, {}",
                    ticket.fence(),
                    self.last_fence
                );
                self.last_fence = ticket.fence();
                prop_assert_eq!(ticket.takeover(), takeover.as_ref());
                prop_assert_eq!(ticket.fingerprint(), fp(f));
                prop_assert_eq!(ticket.lease_deadline(), at(self.model.now + LEASE_MS));
                self.hit(match &takeover {
                    None if reclaim_expired => "acquired after expiry",
                    None => "acquired",
                    Some(t) if t.orphan => "takeover of orphan",
                    Some(_) => "takeover",
                });
                let mt = self
                    .model
                    .acquire(key, f, ticket.fence(), takeover.is_some());
                self.tickets.push((ticket, mt));
            }
            (Expect::Replay(want), Claim::Replay(got)) => {
                prop_assert_eq!(got, want);
                self.hit("replay");
            }
            (
                Expect::InProgress {
                    retry_after,
                    lease_remaining,
                    orphan,
                },
                Claim::InProgress {
                    retry_after: got_retry,
                    lease_remaining: got_left,
                    orphan: got_orphan,
                },
            ) => {
                prop_assert_eq!(got_retry, retry_after, "retry_after");
                prop_assert_eq!(got_left, lease_remaining, "lease_remaining");
                prop_assert_eq!(got_orphan, orphan, "orphan");
                self.hit(if not_durable {
                    "in progress, completion not yet durable"
                } else if lease_remaining.is_zero() {
                    "in progress, stale kept"
                } else {
                    "in progress"
                });
            }
            (Expect::Mismatch { completed }, Claim::Mismatch { completed: got }) => {
                prop_assert_eq!(got, completed, "mismatch.completed");
                self.hit(if completed {
                    "mismatch completed"
                } else {
                    "mismatch in progress"
                });
            }
            (e, r) => {
                return Err(fail(format!(
                    "claim {key:?} fp{f}: the model expected {e:?}, the store answered {r:?}"
                )))
            }
        }
        Ok(())
    }

    /// Checks whatever a claim of `key` with fingerprint `f` returned.
    fn claimed(&mut self, key: Key, f: u8, r: idemdb::Result<Claim>) -> Result<(), TestCaseError> {
        if self.halted() {
            return match r {
                Ok(claim) => self.answered_while_halted(key, f, claim),
                r => self.expect_halted("claim", r),
            };
        }
        let e = match r {
            Ok(claim) => return self.check_claim(key, f, claim),
            Err(e) => e,
        };
        if self.halted_after_an_answer(&e) {
            return Ok(());
        }
        // Only an answer that writes (an acquisition) or, with the power off, one that reads
        // the disk (a replay) can fail.
        let mut m = self.model.clone();
        let (may_fail, in_commit) = match m.claim(key, f) {
            Expect::Acquired { takeover } => {
                m.acquire(key, f, UNKNOWN_FENCE, takeover.is_some());
                (true, true)
            }
            Expect::Replay(_) => (self.power_is_off(), false),
            _ => (false, false),
        };
        if !may_fail {
            return Err(fail(format!(
                "claim {key:?} fp{f}: unexpected error {e:?} for a claim that writes nothing"
            )));
        }
        self.faulted(format!("claim {key:?} fp{f}"), &e, m.records, in_commit)
    }

    /// A claim a halted store answered: it writes nothing, and it is what a restart will
    /// answer, whichever way the failed batch went (the store answers only from keys whose
    /// writes all became durable; any other is `Halted`).
    fn answered_while_halted(&mut self, key: Key, f: u8, real: Claim) -> Result<(), TestCaseError> {
        if self.health != (Health::Failed { surely: true }) {
            // The power is off: nothing is compared until the crash that follows.
            return Ok(());
        }
        let outcomes = match &self.ambiguity {
            Some(a) => vec![a.before.clone(), a.after.clone()],
            None => vec![self.model.records.clone()],
        };
        let mut counted = self.model.counters;
        for records in outcomes {
            let mut model = self.model.clone();
            model.records = records;
            let expected = model.claim(key, f);
            // The store counts the answer; so does the model, once.
            counted = model.counters;
            let agrees = match (&expected, &real) {
                (Expect::Replay(want), Claim::Replay(got)) => want == got,
                (
                    Expect::InProgress {
                        retry_after,
                        lease_remaining,
                        ..
                    },
                    Claim::InProgress {
                        retry_after: r,
                        lease_remaining: l,
                        ..
                    },
                    // Whether a holder is still alive is the process's to know, not the
                    // disk's: a claim whose ticket was dropped (a call that failed) is an
                    // orphan, whose retry hint is its lease, as after a restart.
                ) => l == lease_remaining && (r == retry_after || r == lease_remaining),
                (Expect::Mismatch { completed }, Claim::Mismatch { completed: c }) => {
                    c == completed
                }
                _ => false,
            };
            prop_assert!(
                agrees,
                "claim {:?} fp{} on a halted store answered {:?}; after a restart it would be {:?}",
                key,
                f,
                real,
                expected
            );
        }
        self.model.counters = counted;
        self.hit(match real {
            Claim::Replay(_) => "answered while halted: replay",
            Claim::InProgress { .. } => "answered while halted: in progress",
            _ => "answered while halted: mismatch",
        });
        Ok(())
    }

    fn take_ticket(&mut self, i: &Pick) -> Option<(Ticket, MTicket)> {
        if self.tickets.is_empty() {
            None
        } else {
            let i = i.index(self.tickets.len());
            Some(self.tickets.remove(i))
        }
    }

    fn ticket_at(&self, i: &Pick) -> Option<usize> {
        (!self.tickets.is_empty()).then(|| i.index(self.tickets.len()))
    }

    fn complete_at(&mut self, i: usize, response: &Resp) -> Result<(), TestCaseError> {
        let (t, mt) = self.tickets.remove(i);
        let resp = response.build();
        let holds = self.model.holds(&mt);
        let oversize = response.oversize();
        let r = self.store().complete(t, resp.clone());
        if self.halted() {
            return self.expect_halted("complete", r);
        }
        match r {
            Ok(()) => {
                prop_assert!(
                    holds && !oversize,
                    "complete succeeded (holds {holds}, oversize {oversize})"
                );
                self.model.complete(mt.key, resp);
                self.model.counters.completes += 1;
                self.hit("complete");
            }
            // When both apply, either error is a fair answer.
            Err(Error::ResponseTooLarge {
                size,
                limit,
                ticket,
            }) => {
                prop_assert!(oversize, "ResponseTooLarge for {size} bytes");
                prop_assert_eq!(limit, MAX_RESPONSE);
                prop_assert!(size > limit);
                // The ticket comes back, still holding the claim if it did.
                let t = ticket.ok_or_else(|| fail("ResponseTooLarge without the ticket"))?;
                prop_assert_eq!(t.fence(), mt.fence);
                prop_assert_eq!(t.lease_deadline(), at(mt.lease_until));
                self.tickets.push((*t, mt));
                self.hit("complete too large");
            }
            Err(Error::LeaseLost { fence }) => {
                prop_assert!(!holds, "LeaseLost for a ticket that holds its claim");
                prop_assert_eq!(fence, mt.fence);
                self.hit("complete lease lost");
            }
            Err(e) if holds && !oversize => {
                let mut m = self.model.clone();
                m.complete(mt.key, resp);
                let what = format!("complete {:?} fence {}", mt.key, mt.fence);
                self.faulted(what, &e, m.records, true)?;
            }
            Err(e) => return Err(fail(format!("complete: unexpected {e:?}"))),
        }
        Ok(())
    }

    fn release_at(&mut self, i: usize) -> Result<(), TestCaseError> {
        let (t, mt) = self.tickets.remove(i);
        let holds = self.model.holds(&mt);
        let r = self.store().release(t);
        if self.halted() {
            return self.expect_halted("release", r);
        }
        match r {
            Ok(()) => {
                prop_assert!(holds, "release succeeded for a lost ticket");
                self.model.records.remove(&mt.key);
                self.model.counters.releases += 1;
                self.hit("release");
            }
            Err(Error::LeaseLost { fence }) => {
                prop_assert!(!holds, "LeaseLost for a ticket that holds its claim");
                prop_assert_eq!(fence, mt.fence);
                self.hit("release lease lost");
            }
            Err(e) if holds => {
                let mut landed = self.model.records.clone();
                landed.remove(&mt.key);
                let what = format!("release {:?} fence {}", mt.key, mt.fence);
                self.faulted(what, &e, landed, true)?;
            }
            Err(e) => return Err(fail(format!("release: unexpected {e:?}"))),
        }
        Ok(())
    }

    fn extend_at(&mut self, i: usize, ms: u64) -> Result<(), TestCaseError> {
        let holds = self.model.holds(&self.tickets[i].1);
        let res = self
            .store()
            .extend(&self.tickets[i].0, Duration::from_millis(ms));
        let lease_until = self.model.now.saturating_add(ms);
        let (key, fence) = (self.tickets[i].1.key, self.tickets[i].1.fence);
        let extended = MState::InProgress {
            lease_until,
            orphan: false,
        };
        if self.halted() {
            self.expect_halted("extend", res)?;
        } else {
            match res {
                Ok(()) => {
                    prop_assert!(holds, "extend succeeded for a lost ticket");
                    self.tickets[i].1.lease_until = lease_until;
                    self.model.records.get_mut(&key).expect("held").state = extended;
                    self.hit("extend");
                }
                Err(Error::LeaseLost { fence: got }) => {
                    prop_assert!(!holds, "LeaseLost for a ticket that holds its claim");
                    prop_assert_eq!(got, fence);
                    self.hit("extend lease lost");
                }
                Err(e) if holds => {
                    let mut landed = self.model.records.clone();
                    landed.get_mut(&key).expect("held").state = extended;
                    let what = format!("extend {key:?} fence {fence} by {ms} ms");
                    self.faulted(what, &e, landed, true)?;
                }
                Err(e) => return Err(fail(format!("extend: unexpected {e:?}"))),
            }
        }
        let (t, mt) = &self.tickets[i];
        prop_assert_eq!(t.lease_deadline(), at(mt.lease_until));
        prop_assert_eq!(t.fingerprint(), fp(mt.fp));
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        if !self.reaping && !self.halted() {
            // Every call so far returned only once its batch was durable.
            self.durable.clone_from(&self.model.records);
        }
        match op {
            Op::Claim { key, fp: f } => {
                let r = self.store().claim(&scope_of(*key), name_of(*key), fp(*f));
                self.claimed(*key, *f, r)?;
            }
            Op::Complete { ticket, response } => {
                if let Some(i) = self.ticket_at(ticket) {
                    self.complete_at(i, response)?;
                }
            }
            Op::Release { ticket } => {
                if let Some(i) = self.ticket_at(ticket) {
                    self.release_at(i)?;
                }
            }
            Op::Extend { ticket, ms } => {
                if let Some(i) = self.ticket_at(ticket) {
                    self.extend_at(i, *ms)?;
                }
            }
            Op::TouchOffered { how } => {
                // The ticket (if the test holds it) of the claim the resolver is deciding on.
                let held = self.offering.and_then(|(key, fence)| {
                    self.tickets
                        .iter()
                        .position(|(_, mt)| mt.key == key && mt.fence == fence)
                });
                if let Some(i) = held {
                    self.hit("resolver touched the claim offered");
                    match how % 3 {
                        0 => self.extend_at(i, 30_000)?,
                        1 => self.complete_at(
                            i,
                            &Resp {
                                status: 200,
                                headers: Vec::new(),
                                body: b"finished while reaped".to_vec(),
                                pad: 0,
                            },
                        )?,
                        _ => self.release_at(i)?,
                    }
                }
            }
            Op::DropTicket { ticket } => {
                if let Some((t, mt)) = self.take_ticket(ticket) {
                    drop(t);
                    self.model.abandon(&mt);
                }
            }
            Op::Reap { seed, interleave } => self.reap(*seed, interleave)?,
            Op::Purge => {
                let r = self.store().purge_expired();
                if self.halted() {
                    self.expect_halted("purge", r)?;
                } else {
                    match r {
                        Ok(got) => {
                            let want = self.model.purge();
                            prop_assert_eq!(got, want, "purged");
                            self.model.counters.purged += u64::try_from(want).expect("small");
                            if want > 0 {
                                self.hit("purge");
                            }
                        }
                        Err(e) => {
                            let mut m = self.model.clone();
                            // A purge reads the index, then commits if anything expired.
                            if m.purge() == 0 && !self.power_is_off() {
                                return Err(fail(format!(
                                    "purge with nothing to purge: unexpected {e:?}"
                                )));
                            }
                            self.faulted("purge".into(), &e, m.records, false)?;
                        }
                    }
                }
            }
            Op::Advance { ms } => {
                self.clock.advance(Duration::from_millis(*ms));
                self.model.now += ms;
            }
            Op::Reopen { clock_back_ms } => {
                drop(self.store.take());
                if self.health != Health::Normal {
                    // A restart after the disk was mended (space freed, the faulty path
                    // replaced): the file is every write the OS accepted.
                    let disk = self.disk()?;
                    disk.crash(CrashImage::All);
                    self.check_integrity(CrashImage::All)?;
                }
                if *clock_back_ms > 0 {
                    self.model.now -= clock_back_ms;
                    self.clock = ManualClock::at(at(self.model.now));
                }
                self.store = Some(self.open()?);
                self.reopened()?;
            }
            Op::Get { key } => {
                let r = self.store().get(&scope_of(*key), name_of(*key));
                if self.halted() {
                    self.expect_halted("get", r)?;
                } else {
                    match r {
                        Ok(got) => prop_assert_eq!(got, self.model.get(*key), "get {:?}", key),
                        Err(Error::Io(_) | Error::Storage(_)) if self.power_is_off() => {
                            self.hit("get failed: power off");
                        }
                        Err(e) if self.halted_after_an_answer(&e) => {}
                        Err(e) => return Err(fail(format!("get {key:?}: unexpected {e:?}"))),
                    }
                }
            }
            Op::Crash { image } => {
                self.hit("crash");
                self.crash(*image)?;
            }
            Op::PowerCut {
                after_events,
                ops,
                image,
            } => self.power_cut(*after_events, ops, *image)?,
            Op::FailWrite { after, forever } => {
                self.disk()?.fail_write_after(*after, *forever);
                self.arm();
                self.hit("write fault armed");
            }
            Op::FailSync { after, forever } => {
                self.disk()?.fail_sync_after(*after, *forever);
                self.arm();
                self.hit("fsync fault armed");
            }
        }
        self.check_all()
    }

    /// A power loss now: the disk is copied before the store can close (the close's writes go
    /// to the discarded original), the copy keeps `image` of its unsynced writes, and the store
    /// is opened on it.
    fn crash(&mut self, image: CrashImage) -> Result<(), TestCaseError> {
        let disk = self.disk()?.fork();
        drop(self.store.take());
        disk.crash(image);
        self.backing = Backing::Sim(disk);
        self.check_integrity(image)?;
        self.store = Some(self.open()?);
        self.reopened()
    }

    fn check_integrity(&self, image: CrashImage) -> Result<(), TestCaseError> {
        match self.disk()?.redb_integrity() {
            Ok(true) => Ok(()),
            other => Err(fail(format!(
                "after a crash ({image:?}), redb's integrity check says {other:?}"
            ))),
        }
    }

    /// Cuts the power `after_events` I/O events from now, runs `ops` until one finds the power
    /// off (or fails), and crashes.
    fn power_cut(
        &mut self,
        after_events: u64,
        ops: &[Op],
        image: CrashImage,
    ) -> Result<(), TestCaseError> {
        let disk = self.disk()?;
        self.power_off_at = Some(disk.events() + after_events);
        disk.cut_power_after(after_events);
        self.arm();
        self.hit("power cut");
        for (i, op) in ops.iter().enumerate() {
            self.hit("power cut: call");
            self.step(op)
                .map_err(|e| fail(format!("power window op {i} {op:?}: {e}")))?;
            if self.power_is_off() || self.halted() {
                break;
            }
        }
        if self.power_is_off() {
            self.hit("power cut: the power went");
        }
        self.crash(image)
    }

    /// The store was opened again (after a crash or not): the model reopens too, and the
    /// ambiguity a failed call left is settled by what the store shows.
    fn reopened(&mut self) -> Result<(), TestCaseError> {
        self.health = Health::Normal;
        self.power_off_at = None;
        self.model.reopen();
        if let Some(amb) = self.ambiguity.take() {
            self.settle(amb)?;
        }
        if !self.model.stale().is_empty() {
            self.hit("reopen with orphans");
        }
        Ok(())
    }

    /// Adopts whichever of the two states the reopened store shows; it must show one of them
    /// exactly (every key's `get`, and the record count).
    fn settle(&mut self, amb: Ambiguity) -> Result<(), TestCaseError> {
        let store = self.store().clone();
        let mut shown = Vec::new();
        for key in all_keys() {
            let got = ok(
                store.get(&scope_of(key), name_of(key)),
                "get after reopening",
            )?;
            shown.push((key, got));
        }
        let live = store.record_count().unwrap();
        let Ambiguity {
            what,
            before,
            after,
        } = amb;
        let mut fits = Vec::new();
        for (landed, mut records) in [(false, before.clone()), (true, after.clone())] {
            orphan_all(&mut records);
            if let Some(adopted) = self.fit(records, &shown, live) {
                fits.push((landed, adopted));
            }
        }
        let (landed, adopted) = match fits.as_slice() {
            [] => {
                return Err(fail(format!(
                    "{what} failed; reopened, the store shows {shown:?} ({live} records), \
                     neither the state before that batch, {before:?}, nor after it, {after:?}"
                )))
            }
            [one] => one.clone(),
            [a, b] if a.1 == b.1 => {
                self.hit("failed call changed nothing");
                a.clone()
            }
            [_, _, ..] => {
                return Err(fail(format!(
                    "{what} failed; the store's answers do not tell whether it landed: \
                     {before:?} or {after:?}"
                )))
            }
        };
        self.hit(if landed {
            "failed batch landed"
        } else {
            "failed batch did not land"
        });
        if landed && after.values().any(|r| r.fence == UNKNOWN_FENCE) {
            self.hit("failed claim landed with a fence nobody was told");
        }
        let high = adopted.values().map(|r| r.fence).max().unwrap_or(0);
        self.last_fence = self.last_fence.max(high);
        self.model.records = adopted;
        Ok(())
    }

    /// `records`, with the fence of a failed claim filled in, if the store shows exactly them.
    fn fit(
        &self,
        mut records: Records,
        shown: &[(Key, Option<Entry>)],
        live: u64,
    ) -> Option<Records> {
        if live != u64::try_from(records.len()).expect("small") {
            return None;
        }
        for (key, got) in shown {
            if let Some(r) = records.get_mut(key) {
                if r.fence == UNKNOWN_FENCE {
                    // Never handed out, but above every fence that was.
                    let f = got.as_ref()?.fence;
                    if f <= self.last_fence {
                        return None;
                    }
                    r.fence = f;
                }
            }
        }
        let mut view = self.model.clone();
        view.records = records;
        shown
            .iter()
            .all(|(key, got)| view.get(*key) == *got)
            .then_some(view.records)
    }

    /// Runs a reap whose resolver checks, interleaves and decides as it goes; the model follows
    /// call by call, since the store applies each decision before it calls the resolver again.
    fn reap(&mut self, seed: u64, interleave: &[Op]) -> Result<(), TestCaseError> {
        let store = self.store().clone();
        let halted_before = self.halted();
        let mut st = ReapState {
            seed,
            snapshot: self.model.stale(),
            offered: BTreeSet::new(),
            pending: None,
            resolved: 0,
            unsynced: 0,
            too_large: false,
            halted_at: None,
            error: None,
        };
        self.reaping = true;
        let result = store.reap(|c| {
            if st.error.is_some() {
                return Resolution::Keep;
            }
            self.resolver_call(&mut st, c, interleave)
                .unwrap_or_else(|e| {
                    st.error = Some(e);
                    Resolution::Keep
                })
        });
        self.reaping = false;
        drop(store);
        if let Some(e) = st.error {
            return Err(e);
        }
        if halted_before {
            prop_assert!(st.offered.is_empty(), "a halted store ran a resolver");
            return self.expect_halted("reap", result);
        }
        if st.halted_at.is_none()
            && matches!(result, Err(Error::Halted { .. }))
            && self.halted_after_an_answer(result.as_ref().expect_err("matched"))
        {
            // A call the resolver made was answered, then its redb apply failed and halted
            // the store, which refused the next resolution the reap queued.
            st.pending = None;
            st.halted_at = Some((st.unsynced, st.resolved));
        }
        if let Some((unsynced, resolved)) = st.halted_at {
            // A call the resolver made failed in its commit, which carried the resolutions the
            // reap had queued since the last commit. The store halted, so the reap fails; but
            // if none of its resolutions went down with that commit (and it queues no more,
            // which the halted store refuses), it may end as if nothing happened, counting
            // the resolutions an earlier commit made durable.
            // A reap that returns (not halted) has waited for its resolutions and let its
            // completions replay: they are durable, as after a reap the store did not halt
            // under. The model kept them "not durable" here, and expected a later claim to be
            // answered in progress where the store rightly replayed (the cause of the rare
            // `model_takeover` failures, "answered Replay(reaped fence N); after a restart it
            // would be InProgress"; the case is kept in tests/model.proptest-regressions).
            match result {
                Err(Error::Halted { .. }) => {}
                Ok(n) if unsynced == 0 && n == resolved => {
                    self.model.counters.reaped += u64::try_from(n).expect("small");
                    self.model.not_durable.clear();
                }
                Err(Error::ResponseTooLarge { .. }) if unsynced == 0 && st.too_large => {
                    self.model.counters.reaped += u64::try_from(resolved).expect("small");
                    self.model.not_durable.clear();
                }
                other => {
                    return Err(fail(format!(
                        "reap whose resolver's call failed ({unsynced} of its {resolved} \
                         resolutions not yet committed then) answered {other:?}"
                    )))
                }
            }
            self.hit("reap halted by a call its resolver made");
            return Ok(());
        }
        self.apply_decision(&mut st);
        match result {
            Err(Error::ResponseTooLarge { .. }) | Ok(_) => {}
            // The read of the stale claims' records failed (a dead disk) before any resolver
            // ran: nothing changed, and a failed read does not halt the store.
            Err(Error::Io(_)) if st.offered.is_empty() && st.resolved == 0 => {
                self.hit("reap's read failed");
                return Ok(());
            }
            Err(e) => {
                prop_assert!(
                    st.resolved > 0,
                    "reap failed with nothing to commit: {:?}",
                    e
                );
                let landed = self.model.records.clone();
                return self.faulted(format!("reap (seed {seed})"), &e, landed, true);
            }
        }
        self.model.not_durable.clear();
        self.model.counters.reaped += u64::try_from(st.resolved).expect("small");
        if st.too_large {
            self.hit("reap stopped by a response too large");
            match result {
                Err(Error::ResponseTooLarge {
                    size,
                    limit,
                    ticket,
                }) => {
                    prop_assert_eq!(limit, MAX_RESPONSE);
                    prop_assert!(size > limit);
                    prop_assert!(ticket.is_none(), "a reap has no ticket to hand back");
                }
                other => {
                    return Err(fail(format!(
                        "reap should stop with ResponseTooLarge, got {other:?}"
                    )))
                }
            }
        } else {
            let got = ok(result, "reap")?;
            let offered: Vec<_> = st.offered.into_iter().collect();
            prop_assert_eq!(
                &offered,
                &st.snapshot,
                "stale claims offered to the resolver"
            );
            prop_assert_eq!(got, st.resolved, "reap count");
        }
        Ok(())
    }

    fn resolver_call(
        &mut self,
        st: &mut ReapState,
        c: &StaleClaim,
        interleave: &[Op],
    ) -> Result<Resolution, TestCaseError> {
        if self.halted() {
            // The store could not queue the previous decision.
            st.pending = None;
        }
        // The previous decision has been applied by now.
        self.apply_decision(st);
        let was_halted = self.halted();
        self.check_all()?;
        if !was_halted && self.halted() {
            // A read found the store halted by a redb apply that failed after the resolver's
            // last call was answered: the reap queues nothing from now on.
            st.halted_at = Some((st.unsynced, st.resolved));
        }
        if !self.model.not_durable.is_empty() {
            self.hit("resolver saw a completion not yet durable");
        }
        let key = key_of(&c.scope, &c.key)
            .ok_or_else(|| fail(format!("reap offered an unknown key {c:?}")))?;
        let f = fp_index(c.fingerprint)
            .ok_or_else(|| fail(format!("reap offered an unknown fingerprint {c:?}")))?;
        let lease_until = ms_of(c.lease_deadline);
        let offered = (key, c.fence, f, ms_of(c.claimed_at), lease_until, c.orphan);
        // Each claim that was stale when the reap began, as it was then, once.
        prop_assert!(
            st.snapshot.contains(&offered),
            "reap offered {:?}, not among the stale claims {:?}",
            offered,
            st.snapshot
        );
        prop_assert!(
            st.offered.insert(offered),
            "reap offered {:?} twice",
            offered
        );
        if let Some(op) = interleave.get(st.offered.len() - 1) {
            self.offering = Some((key, c.fence));
            let r = self.resolver_step(st, |h| h.step(op));
            self.offering = None;
            r.map_err(|e| fail(format!("inside the resolver, {op:?}: {e}")))?;
        }
        let d = decide(st.seed, c.fence);
        if let Decision::Meddle { other_fp, .. } = d {
            let f = if other_fp { 1 - f } else { f };
            self.resolver_step(st, |h| {
                let claim = h.store().claim(&c.scope, &c.key, fp(f));
                h.claimed(key, f, claim)
            })
            .map_err(|e| fail(format!("claim inside the resolver: {e}")))?;
        }
        if d == Decision::TooLarge {
            st.too_large = true;
        }
        let res = resolution(st.seed, c.fence, d);
        st.pending = Some((key, c.fence, lease_until, c.orphan, res.clone()));
        Ok(res)
    }

    /// A call the resolver makes. If it commits, its batch carries the resolutions the reap
    /// queued before it, which are then durable, even if the store halts after that batch's
    /// sync (its redb apply failing); if it fails before any sync, they went down with it.
    fn resolver_step(
        &mut self,
        st: &mut ReapState,
        call: impl FnOnce(&mut Harness) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        let was_halted = self.halted();
        let batches = self.store().stats().commit_batches;
        call(self)?;
        if was_halted {
            return Ok(());
        }
        let committed = self.store().stats().commit_batches > batches;
        if self.halted() {
            // A batch of the call became durable before the store halted (its redb apply
            // failed after its journal sync): the reap's resolutions queued before the call
            // were in it, or in an earlier one, so they are durable.
            if committed {
                st.unsynced = 0;
            }
            st.halted_at = Some((st.unsynced, st.resolved));
        } else if committed {
            self.durable.clone_from(&self.model.records);
            st.unsynced = 0;
        }
        Ok(())
    }

    /// What the store does with the resolver's last answer: apply it if the claim is still as
    /// the resolver saw it.
    fn apply_decision(&mut self, st: &mut ReapState) {
        let Some((key, fence, lease_until, orphan, res)) = st.pending.take() else {
            return;
        };
        if res == Resolution::Keep || st.too_large {
            return;
        }
        let unchanged = self.model.records.get(&key).is_some_and(|r| {
            r.fence == fence
                && r.state
                    == MState::InProgress {
                        lease_until,
                        orphan,
                    }
        });
        if !unchanged {
            self.hit("reap skipped a changed claim");
            return;
        }
        match res {
            Resolution::Release => {
                self.model.records.remove(&key);
            }
            Resolution::Complete(response) => {
                self.model.complete(key, response);
                self.model.not_durable.insert((key, fence));
            }
            Resolution::Keep => unreachable!(),
        }
        st.resolved += 1;
        st.unsynced += 1;
        self.hit(if orphan {
            "reap resolved orphan"
        } else {
            "reap resolved"
        });
    }

    /// Every key reads as the model says (or, once a commit failed, every read is refused),
    /// and the counters agree.
    fn check_all(&mut self) -> Result<(), TestCaseError> {
        let store = self.store().clone();
        let power_off = self.power_is_off();
        for key in all_keys() {
            let got = store.get(&scope_of(key), name_of(key));
            match (self.health, got) {
                (Health::Failed { surely: false }, _) => {}
                (Health::Failed { surely: true }, Err(Error::Halted { .. })) => {}
                (Health::Failed { surely: true }, other) => {
                    return Err(fail(format!(
                        "get {key:?} on a store whose commit failed answered {other:?}, \
                         not Halted"
                    )))
                }
                (_, Ok(got)) => prop_assert_eq!(got, self.model.get(key), "get {:?}", key),
                // Reads need power.
                (_, Err(Error::Io(_) | Error::Storage(_))) if power_off => {}
                (_, Err(e)) if self.halted_after_an_answer(&e) => {}
                (_, Err(e)) => return Err(fail(format!("get {key:?}: unexpected {e:?}"))),
            }
        }
        let s = store.stats();
        let c = self.model.counters;
        let got = MCounters {
            acquired: s.acquired,
            replays: s.replays,
            in_progress: s.in_progress,
            mismatches: s.mismatches,
            completes: s.completes,
            releases: s.releases,
            takeovers: s.takeovers,
            reaped: s.reaped,
            purged: s.purged,
        };
        prop_assert_eq!(got, c, "stats");
        let count = |r: &Records| u64::try_from(r.len()).expect("small");
        match &self.ambiguity {
            Some(amb) => prop_assert!(
                s.live_records == Some(count(&amb.before))
                    || s.live_records == Some(count(&amb.after)),
                "stats.live_records {:?} after {} failed: neither {} nor {}",
                s.live_records,
                amb.what,
                count(&amb.before),
                count(&amb.after)
            ),
            None => prop_assert_eq!(
                s.live_records,
                Some(count(&self.model.records)),
                "stats.live_records"
            ),
        }
        Ok(())
    }
}

fn run(policy: StalePolicy, case: &Case) -> Result<Coverage, TestCaseError> {
    run_on(policy, case, false)
}

/// Runs `case` on a simulated disk, or on a file (`on_file`; no crash or fault steps then).
fn run_on(policy: StalePolicy, case: &Case, on_file: bool) -> Result<Coverage, TestCaseError> {
    let mut h = Harness::new(policy, case.stripes, on_file)?;
    h.check_all()?;
    for (i, op) in case.ops.iter().enumerate() {
        h.hit("step");
        if is_crash_or_fault(op) {
            h.hit("crash or fault step");
        }
        h.step(op)
            .map_err(|e| fail(format!("step {i} {op:?}: {e}")))?;
    }
    // Whatever happened, a reopen finds it all again.
    h.step(&Op::Reopen { clock_back_ms: 0 })
        .map_err(|e| fail(format!("final reopen: {e}")))?;
    Ok(h.cov)
}

/// Runs the generated cases for one stale policy, then prints what they did.
fn model_cases(policy: StalePolicy) {
    let totals = std::sync::Mutex::new(Coverage::new());
    let mut runner = TestRunner::new(config());
    let result = runner.run(&case_strategy(), |case| {
        let cov = run(policy, &case)?;
        let mut t = totals.lock().expect("not poisoned");
        *t.entry("cases").or_default() += 1;
        for (k, v) in cov {
            *t.entry(k).or_default() += v;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{policy:?}: {e}");
    }
    let t = totals.into_inner().expect("not poisoned");
    let n = |k: &str| t.get(k).copied().unwrap_or(0);
    println!(
        "model {policy:?}: {} cases, {} steps, {} of them crash or fault steps ({} crashes, \
         {} power cuts of which {} cut a call short, {} write and {} fsync faults armed); \
         {} calls failed, {} calls refused as halted, {} failed batches landed and {} did not \
         ({} changed nothing)",
        n("cases"),
        n("step"),
        n("crash or fault step"),
        n("crash"),
        n("power cut"),
        n("power cut: the power went"),
        n("write fault armed"),
        n("fsync fault armed"),
        n("call failed: power off") + n("call failed: injected fault"),
        n("halted: call refused"),
        n("failed batch landed"),
        n("failed batch did not land"),
        n("failed call changed nothing"),
    );
}

#[test]
fn model_takeover() {
    model_cases(StalePolicy::TakeOver);
}

#[test]
fn model_keep() {
    model_cases(StalePolicy::Keep);
}

/// A hand-written sequence through the same harness, as a readable example of what the model
/// checks: a claim, a duplicate, a mismatch, a stale lease, a reopen that orphans the claim,
/// the stale holder's refused completion, a reap, a replay, expiry and purge.
#[test]
fn scripted_lifecycle() {
    let k = (0, 0, 0);
    let other = (1, 1, 2);
    let ticket = Pick(0);
    let ops = vec![
        Op::Claim { key: k, fp: 0 },     // acquired, fence 1
        Op::Claim { key: k, fp: 0 },     // in progress
        Op::Claim { key: k, fp: 1 },     // mismatch (in progress)
        Op::Claim { key: other, fp: 1 }, // acquired
        Op::Advance { ms: LEASE_MS },    // both leases ran out
        Op::Claim { key: k, fp: 0 },     // taken over, or kept in progress
        Op::Reopen { clock_back_ms: 0 }, // every claim in progress is an orphan now
        Op::Complete {
            ticket,
            response: Resp {
                status: 201,
                headers: vec![("content-type".into(), b"text/plain".to_vec())],
                body: b"late".to_vec(),
                pad: 0,
            },
        }, // lease lost: the ticket is from before the reopen
        Op::Reap {
            seed: 0,
            interleave: vec![Op::Get { key: k }],
        },
        Op::Claim { key: k, fp: 0 },
        Op::Claim { key: other, fp: 1 },
        Op::Advance { ms: TTL_MS },
        Op::Claim { key: other, fp: 0 }, // whatever it was, it expired or is stale
        Op::Purge,
        Op::Release { ticket },
    ];
    for (policy, on_file) in [
        (StalePolicy::TakeOver, false),
        (StalePolicy::Keep, false),
        (StalePolicy::TakeOver, true),
        (StalePolicy::Keep, true),
    ] {
        let case = Case {
            stripes: 4,
            ops: ops.clone(),
        };
        let cov = run_on(policy, &case, on_file)
            .unwrap_or_else(|e| panic!("{policy:?}, on a file {on_file}: {e}"));
        for what in [
            "acquired",
            "in progress",
            "mismatch in progress",
            "complete lease lost",
        ] {
            assert!(
                cov.contains_key(what),
                "{policy:?}: no {what:?} in {cov:#?}"
            );
        }
        if policy == StalePolicy::TakeOver {
            assert!(cov.contains_key("takeover"), "{cov:#?}");
        } else {
            assert!(cov.contains_key("in progress, stale kept"), "{cov:#?}");
        }
    }
}

/// Hand-written fault sequences through the same harness. A completion's commit fails; every
/// call after it answers `Halted`; then a restart (the OS kept every write it accepted) or a
/// power loss shows whether the batch landed: an fsync that failed after the commit's pages
/// were written lands on a restart but not on a power loss that keeps only what was synced; a
/// write that failed lands nowhere. Last, the power goes in the middle of a claim.
#[test]
fn scripted_faults() {
    let k = (0, 0, 0);
    let done = Resp {
        status: 201,
        headers: Vec::new(),
        body: b"done".to_vec(),
        pad: 0,
    };
    let restart = Op::Reopen { clock_back_ms: 0 };
    let cases = [
        (
            Op::FailSync {
                after: 0,
                forever: false,
            },
            restart.clone(),
            "failed batch landed",
        ),
        (
            Op::FailSync {
                after: 0,
                forever: true,
            },
            Op::Crash {
                image: CrashImage::Durable,
            },
            "failed batch did not land",
        ),
        (
            Op::FailWrite {
                after: 0,
                forever: false,
            },
            restart.clone(),
            "failed batch did not land",
        ),
        (
            // A disk that stays failed: the journal write fails, and so does every write after
            // it, up to a power loss that tears what was written.
            Op::FailWrite {
                after: 0,
                forever: true,
            },
            Op::Crash {
                image: CrashImage::Torn(7),
            },
            "failed batch did not land",
        ),
    ];
    for policy in [StalePolicy::TakeOver, StalePolicy::Keep] {
        for (fault, end, outcome) in &cases {
            let ops = vec![
                Op::Claim { key: k, fp: 0 },
                fault.clone(),
                // Fails in its commit: the store halts.
                Op::Complete {
                    ticket: Pick(0),
                    response: done.clone(),
                },
                Op::Get { key: k },
                Op::Claim {
                    key: (1, 1, 1),
                    fp: 0,
                },
                Op::Purge,
                end.clone(),
                // A replay if the completion landed, else an orphan in progress.
                Op::Claim { key: k, fp: 0 },
                // A fence above every fence handed out.
                Op::Claim {
                    key: (1, 0, 2),
                    fp: 1,
                },
            ];
            let case = Case { stripes: 4, ops };
            let cov = run(policy, &case)
                .unwrap_or_else(|e| panic!("{policy:?}, {fault:?} then {end:?}: {e}"));
            let n = |what: &str| cov.get(what).copied().unwrap_or(0);
            assert_eq!(n("call failed: injected fault"), 1, "{cov:#?}");
            assert_eq!(n(outcome), 1, "{fault:?} then {end:?}: {cov:#?}");
            // The get, the claim and the purge (the checks' reads in between are not counted).
            assert_eq!(n("halted: call refused"), 3, "{cov:#?}");
            assert_eq!(n("replay") + n("in progress"), 1, "{cov:#?}");
        }
        let ops = vec![
            Op::Claim { key: k, fp: 0 },
            Op::PowerCut {
                after_events: 1,
                ops: vec![
                    // Its commit finds the power gone part way: after the journal write,
                    // before its fdatasync.
                    Op::Claim {
                        key: (0, 1, 1),
                        fp: 1,
                    },
                    // Never runs: the window ends with the first call that found it off.
                    Op::Get { key: k },
                ],
                image: CrashImage::All,
            },
            Op::Claim {
                key: (0, 1, 1),
                fp: 1,
            },
        ];
        let cov = run(policy, &Case { stripes: 1, ops }).unwrap_or_else(|e| panic!("{e}"));
        let n = |what: &str| cov.get(what).copied().unwrap_or(0);
        assert_eq!(n("call failed: power off"), 1, "{cov:#?}");
        assert_eq!(n("power cut: call"), 1, "{cov:#?}");
        assert_eq!(
            n("failed batch landed") + n("failed batch did not land"),
            1,
            "{cov:#?}"
        );
    }
}

/// The generator reaches every interesting outcome: a deterministic sample of cases, tallied.
#[test]
fn generator_covers_the_interesting_outcomes() {
    for policy in [StalePolicy::TakeOver, StalePolicy::Keep] {
        let mut runner = TestRunner::deterministic();
        let strategy = case_strategy();
        let mut total = Coverage::new();
        for _ in 0..96 {
            let case = strategy.new_tree(&mut runner).expect("generate").current();
            let cov = run(policy, &case).unwrap_or_else(|e| panic!("{e}\n{case:#?}"));
            for (k, v) in cov {
                *total.entry(k).or_default() += v;
            }
        }
        println!("{policy:?}: {total:#?}");
        let mut needed = vec![
            "acquired",
            "acquired after expiry",
            "replay",
            "in progress",
            "mismatch completed",
            "mismatch in progress",
            "complete",
            "complete too large",
            "complete lease lost",
            "release",
            "release lease lost",
            "extend",
            "extend lease lost",
            "purge",
            "reopen with orphans",
            "reap resolved",
            "reap resolved orphan",
            "reap skipped a changed claim",
            "resolver touched the claim offered",
            "reap stopped by a response too large",
            "resolver saw a completion not yet durable",
            "crash",
            "power cut",
            "power cut: the power went",
            "write fault armed",
            "fsync fault armed",
            "call failed: power off",
            "call failed: injected fault",
            "halted: call refused",
            "answered while halted: replay",
            "answered while halted: in progress",
            "answered while halted: mismatch",
            "failed batch landed",
            "failed batch did not land",
            "failed claim landed with a fence nobody was told",
        ];
        match policy {
            StalePolicy::TakeOver => needed.extend([
                "takeover",
                "takeover of orphan",
                "reap skipped a changed claim",
            ]),
            _ => needed.push("in progress, stale kept"),
        }
        for what in needed {
            assert!(
                total.get(what).copied().unwrap_or(0) > 0,
                "{policy:?}: the generator never reached {what:?}: {total:#?}"
            );
        }
    }
}
