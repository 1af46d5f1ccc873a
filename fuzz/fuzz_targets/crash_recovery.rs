//! Power loss, fuzzed: the input is a short workload, a fault (the power cut after some I/O
//! events, or a write or sync that fails), and how the crash leaves the unsynced writes. The
//! store is created on a fresh simulated disk, the workload runs until the fault stops it, the
//! disk is crashed, and `crash_and_check` (tests/crash_model) reopens it and panics if anything
//! acknowledged is missing or anything unacknowledged appeared. Optionally a second round runs
//! on the recovered disk (from a model of what it holds) and crashes again.

#![no_main]

#[path = "../../tests/crash_model/mod.rs"]
mod crash_model;

use arbitrary::Arbitrary;
use crash_model::{
    crash_and_check_open, old_ticket_is_fenced_off, Id, Model, State, Step, Stop, ENDPOINTS, KEYS,
    TENANTS,
};
use idemdb::simulation::{CrashImage, SimDisk};
use idemdb::{Clock, EntryState, ManualClock, Store};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Steps per round beyond this are ignored, to keep each execution short.
const MAX_STEPS: usize = 64;

/// Response sizes a completion picks from: empty, small, around a page, over a page.
const SIZES: [usize; 8] = [0, 1, 150, 600, 1500, 4000, 5000, 12_000];

/// One workload step, as the fuzzer chooses it; mapped onto [`Step`].
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Claim {
        tenant: u8,
        endpoint: u8,
        key: u8,
        variant: bool,
    },
    /// A `claim_async` future polled once and dropped: the claim is withdrawn.
    AbandonClaim {
        tenant: u8,
        endpoint: u8,
        key: u8,
        variant: bool,
    },
    Complete {
        pick: u8,
        size: u8,
    },
    Release {
        pick: u8,
    },
    Extend {
        pick: u8,
        secs: u8,
    },
    Advance {
        secs: u16,
    },
    Purge,
    Reap {
        seed: u64,
    },
}

impl Op {
    fn step(self) -> Step {
        match self {
            Op::Claim {
                tenant,
                endpoint,
                key,
                variant,
            } => Step::Claim {
                id: (
                    usize::from(tenant) % TENANTS.len(),
                    usize::from(endpoint) % ENDPOINTS.len(),
                    usize::from(key) % KEYS,
                ),
                variant,
            },
            Op::AbandonClaim {
                tenant,
                endpoint,
                key,
                variant,
            } => Step::AbandonClaim {
                id: (
                    usize::from(tenant) % TENANTS.len(),
                    usize::from(endpoint) % ENDPOINTS.len(),
                    usize::from(key) % KEYS,
                ),
                variant,
            },
            Op::Complete { pick, size } => Step::Complete {
                pick: usize::from(pick),
                size: SIZES[usize::from(size) % SIZES.len()],
            },
            Op::Release { pick } => Step::Release {
                pick: usize::from(pick),
            },
            Op::Extend { pick, secs } => Step::Extend {
                pick: usize::from(pick),
                secs: u64::from(secs),
            },
            // Up to 12 minutes: past the lease (60 s) and the TTL (600 s) in one step.
            Op::Advance { secs } => Step::Advance {
                secs: 1 + u64::from(secs) % 720,
            },
            Op::Purge => Step::Purge,
            Op::Reap { seed } => Step::Reap { seed },
        }
    }
}

/// What stops the workload, and when. The fault is armed `at` a point of the run: before the
/// open (0), before step `at - 1`, or after the last step, so that the store's close is
/// covered too; its count then runs from there. A count past the end of the run means no fault.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Fault {
    at: u8,
    kind: FaultKind,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum FaultKind {
    /// The power goes after this many further I/O events (writes, syncs, length changes).
    PowerCut { after: u8 },
    /// A write fails (with `forever`: every write from then on, a full disk).
    FailWrite { after: u8, forever: bool },
    /// A sync fails (with `forever`: every sync from then on).
    FailSync { after: u8, forever: bool },
}

impl FaultKind {
    fn arm(self, disk: &SimDisk) {
        match self {
            FaultKind::PowerCut { after } => disk.cut_power_after(after.into()),
            FaultKind::FailWrite { after, forever } => disk.fail_write_after(after.into(), forever),
            // A commit issues a couple of syncs: small counts reach into the next few commits.
            FaultKind::FailSync { after, forever } => {
                disk.fail_sync_after(u64::from(after % 16), forever)
            }
        }
    }
}

/// Which of the unsynced writes the crash keeps.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Image {
    Durable,
    All,
    Subset(u64),
    Torn(u64),
}

impl Image {
    fn crash_image(self) -> CrashImage {
        match self {
            Image::Durable => CrashImage::Durable,
            Image::All => CrashImage::All,
            Image::Subset(seed) => CrashImage::Subset(seed),
            Image::Torn(seed) => CrashImage::Torn(seed),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Round {
    steps: Vec<Op>,
    fault: Fault,
    image: Image,
}

impl Round {
    fn steps(&self) -> Vec<Step> {
        self.steps
            .iter()
            .take(MAX_STEPS)
            .map(|op| op.step())
            .collect()
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    first: Round,
    /// A second round on the disk the first crash left, crashed again.
    second: Option<Round>,
}

/// The journal of the fuzzed store: a quarter of the simulated disk's default, so that an
/// open's scan of the whole journal costs a quarter as much, and a workload of a few
/// completions fills it (the trace counts the checkpoints it forces).
const JOURNAL_BYTES: u64 = 16 << 10;

/// A freshly created store (created and closed once: creation is atomic on a real disk, so the
/// faults start after it, as in tests/crash.rs).
fn created() -> SimDisk {
    static CREATED: OnceLock<SimDisk> = OnceLock::new();
    CREATED
        .get_or_init(|| {
            let disk = SimDisk::new();
            let store = Store::builder()
                .clock(ManualClock::new())
                .journal_size(JOURNAL_BYTES)
                .open_simulated(&disk)
                .expect("a new store opens");
            drop(store);
            disk
        })
        .fork()
}

fn ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn ids() -> impl Iterator<Item = Id> {
    (0..TENANTS.len())
        .flat_map(|t| (0..ENDPOINTS.len()).flat_map(move |e| (0..KEYS).map(move |k| (t, e, k))))
}

/// What a recovered disk holds, key by key, read through a store whose clock is set far back
/// so nothing reads as expired (expired records still count as on disk). Returns the states
/// and the highest fence found.
fn observe(disk: &SimDisk) -> (BTreeMap<Id, Vec<State>>, u64) {
    let probe = disk.fork();
    let store = Store::builder()
        .clock(ManualClock::at(UNIX_EPOCH + Duration::from_secs(1)))
        .journal_size(JOURNAL_BYTES)
        .open_simulated(&probe)
        .expect("the recovered disk was just checked and reopens");
    let mut keys = BTreeMap::new();
    let mut high = 0;
    for id in ids() {
        let entry = store
            .get(&crash_model::scope(id), &crash_model::key(id))
            .expect("get on a recovered store");
        let state = match entry {
            None => State::Absent,
            Some(e) => {
                high = high.max(e.fence);
                match e.state {
                    EntryState::InProgress { lease_deadline, .. } => State::InProgress {
                        fence: Some(e.fence),
                        lease_until: ms(lease_deadline),
                    },
                    EntryState::Completed {
                        expires_at,
                        response,
                    } => State::Completed {
                        fence: e.fence,
                        response,
                        expires_at: ms(expires_at),
                    },
                }
            }
        };
        keys.insert(id, vec![state]);
    }
    (keys, high)
}

/// A model that starts from what `disk` holds, at time `now`.
fn model_of(keys: &BTreeMap<Id, Vec<State>>, max_fence: u64, now: SystemTime) -> Model {
    let mut model = Model::new(ManualClock::at(now));
    model.keys = keys.clone();
    model.max_fence = max_fence;
    model.journal_bytes = Some(JOURNAL_BYTES);
    model
}

/// Runs `steps` on `disk` with `model`, as `crash_model::run_on` does but from a given model,
/// arming `fault` on the way; stops at the first failed step.
fn run(disk: &SimDisk, model: &mut Model, steps: &[Step], fault: Fault) -> (Stop, u64) {
    let at = usize::from(fault.at) % (steps.len() + 2);
    if at == 0 {
        fault.kind.arm(disk);
    }
    let store = match model.builder().open_simulated(disk) {
        Ok(store) => store,
        Err(e) => return (Stop::Failed(e), 0),
    };
    for (i, step) in steps.iter().enumerate() {
        if i + 1 == at {
            fault.kind.arm(disk);
        }
        if let Stop::Failed(e) = model.run(&store, std::slice::from_ref(step)) {
            return (Stop::Failed(e), store.stats().checkpoints);
        }
    }
    if at == steps.len() + 1 {
        fault.kind.arm(disk);
    }
    let checkpoints = store.stats().checkpoints;
    drop(store);
    (Stop::Done, checkpoints)
}

/// `IDEMDB_FUZZ_TRACE=1` prints one line per round: to see what the inputs reach.
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("IDEMDB_FUZZ_TRACE").is_some_and(|v| v != "0"))
}

/// One round on `start`: the workload with its fault, then a crash checked against the model.
/// Returns the disk as the fault left it (not yet crashed) and the model of what was
/// acknowledged.
fn round(start: &SimDisk, base: &Model, round: &Round) -> (SimDisk, Model) {
    let disk = start.fork();
    let mut model = model_of(&base.keys, base.max_fence, base.clock.now());
    let steps = round.steps();
    let (stop, checkpoints) = run(&disk, &mut model, &steps, round.fault);

    let crashed = disk.fork();
    let unsynced = crashed.unsynced();
    let (checked, store) = crash_and_check_open(&crashed, round.image.crash_image(), &model);
    if trace() {
        let uncertain = model.keys.values().filter(|s| s.len() > 1).count();
        eprintln!(
            "round: {} steps, {:?}, {:?}; {} acknowledged, {uncertain} keys uncertain, \
             {checkpoints} checkpoints of a full journal, {unsynced} unsynced writes at the \
             crash, {checked} keys checked",
            steps.len(),
            round.fault,
            round.image,
            model.acknowledged,
        );
        if let Stop::Failed(e) = &stop {
            eprintln!("  stopped: {e}");
        }
    }
    // In the session that checked the recovery: a reopen of its own would add nothing but a
    // close and an open of the same file (about a third of an execution).
    old_ticket_is_fenced_off(&mut model, &store);
    drop(store);
    (disk, model)
}

fuzz_target!(|input: Input| {
    let start = created();
    let base = Model::new(ManualClock::new());
    let (disk, model) = round(&start, &base, &input.first);
    let Some(second) = &input.second else {
        return;
    };
    // The same crash again (crashes are deterministic), on a fork the checks did not write to.
    let recovered = disk.fork();
    recovered.crash(input.first.image.crash_image());
    let (keys, high) = observe(&recovered);
    let base = model_of(&keys, model.max_fence.max(high), model.clock.now());
    round(&recovered, &base, second);
});
