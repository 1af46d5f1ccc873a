//! A webhook consumer that credits accounts exactly once, whatever the delivery does.
//!
//! ```text
//! cargo run --release --features serde --example webhook_consumer [-- SEED]
//! ```
//!
//! A payment provider delivers `payment.succeeded` events at least once: the same event may
//! arrive several times, out of order, and on several workers at once. Each event credits an
//! account in a ledger that is NOT idempotent (every credit that reaches it adds). Four worker
//! threads take deliveries from a shared queue and run each through an `IdempotentFn` keyed by
//! the event id, on a store file in a temporary directory:
//!
//! - a duplicate of an event another worker is crediting right now waits for that credit and
//!   gets its stored result (or, past the wait bound, goes back on the queue);
//! - the ledger fails some first attempts with a 503 before doing anything: the key is
//!   released and the delivery goes back on the queue, so the retry really credits;
//! - events for a closed account are refused, and the refusal is stored and replayed;
//! - halfway through, the consumer restarts on the same store file.
//!
//! At the end every account's balance must be the sum of its distinct events; the example
//! panics otherwise. The shuffle, the duplicates and the 503s come from a seeded PRNG.

use idemdb::{CallOutcome, Failure, IdempotentFn, Scope, Stats, Store};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const EVENTS: u64 = 400;
const ACCOUNTS: [&str; 4] = ["acct_ada", "acct_bob", "acct_cy", "acct_closed"];
const WORKERS: usize = 4;

/// What the provider sends, and what the fingerprint covers.
#[derive(Debug, Clone, serde::Serialize)]
struct Event {
    id: String,
    account: &'static str,
    cents: i64,
}

/// What a credit returns; stored, and replayed to every duplicate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Credited {
    account: String,
    balance_after: i64,
}

/// A tiny xorshift PRNG: the example's randomness, reproducible from a seed.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        usize::try_from(x % u64::try_from(n).expect("n fits u64")).expect("below n")
    }
}

#[derive(Default)]
struct Counts {
    deliveries: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    requeued_in_progress: AtomicU64,
    released_and_retried: AtomicU64,
    refused: AtomicU64,
}

/// The downstream ledger: not idempotent, and flaky on the first attempt of some events.
struct Ledger {
    balances: Mutex<BTreeMap<&'static str, i64>>,
    credits: AtomicU64,
    flaky: Mutex<HashSet<String>>,
}

impl Ledger {
    fn credit(&self, event: &Event) -> Result<Credited, Failure<String>> {
        if self.flaky.lock().unwrap().remove(&event.id) {
            return Err(Failure::Transient("ledger: 503, nothing written".into()));
        }
        if event.account == "acct_closed" {
            return Err(Failure::Deterministic(format!(
                "{} is closed",
                event.account
            )));
        }
        // The downstream call takes a moment: long enough for duplicates to meet it.
        std::thread::sleep(Duration::from_micros(300));
        let mut balances = self.balances.lock().unwrap();
        let balance = balances.entry(event.account).or_insert(0);
        *balance += event.cents;
        self.credits.fetch_add(1, Ordering::SeqCst);
        Ok(Credited {
            account: event.account.to_owned(),
            balance_after: *balance,
        })
    }
}

/// Runs the queue dry on `WORKERS` threads; deliveries that must be retried go back on it.
fn consume(
    store: Store,
    queue: &Mutex<VecDeque<Event>>,
    ledger: &Ledger,
    counts: &Counts,
) -> Stats {
    let credit = IdempotentFn::builder(store, Scope::new("provider_a", "payment.succeeded"))
        .wait_for_in_flight(Duration::from_millis(20))
        .build();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let Some(event) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                counts.deliveries.fetch_add(1, Ordering::Relaxed);
                let out = credit
                    .call_json(&event.id, &event, |_attempt| ledger.credit(&event))
                    .expect("the store works");
                let counter = match out {
                    CallOutcome::Executed { result: Ok(_), .. } => &counts.executed,
                    CallOutcome::Executed { result: Err(_), .. } => &counts.refused,
                    CallOutcome::Replayed { .. } => &counts.replayed,
                    CallOutcome::Released { .. } => &counts.released_and_retried,
                    CallOutcome::InProgress { .. } => &counts.requeued_in_progress,
                    other => panic!("unexpected for event {}: {other:?}", event.id),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if matches!(
                    out,
                    CallOutcome::Released { .. } | CallOutcome::InProgress { .. }
                ) {
                    // Not acknowledged: the provider delivers it again.
                    queue.lock().unwrap().push_back(event);
                }
            });
        }
    });
    credit.store().stats()
}

fn main() {
    let seed = std::env::args()
        .nth(1)
        .map_or(42, |s| s.parse().expect("SEED is a number"));
    let mut rng = XorShift(seed | 1);
    let events: Vec<Event> = (0..EVENTS)
        .map(|i| Event {
            id: format!("evt_{i:04}"),
            account: ACCOUNTS[rng.below(ACCOUNTS.len())],
            cents: i64::try_from(100 + rng.below(9_900)).expect("small"),
        })
        .collect();
    // Each event delivered one to four times, shuffled (Fisher-Yates).
    let mut deliveries: Vec<Event> = events
        .iter()
        .flat_map(|e| std::iter::repeat_n(e.clone(), 1 + rng.below(4)))
        .collect();
    for i in (1..deliveries.len()).rev() {
        deliveries.swap(i, rng.below(i + 1));
    }
    let ledger = Ledger {
        balances: Mutex::new(BTreeMap::new()),
        credits: AtomicU64::new(0),
        flaky: Mutex::new(
            events
                .iter()
                .filter(|_| rng.below(10) == 0)
                .map(|e| e.id.clone())
                .collect(),
        ),
    };
    let flaky = ledger.flaky.lock().unwrap().len();
    let counts = Counts::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("webhooks.idem");
    let second_half = deliveries.split_off(deliveries.len() / 2);
    let mut waits = 0;
    for (life, half) in [deliveries, second_half].into_iter().enumerate() {
        // A restart between the halves: the second life opens the same file.
        let store = Store::open(&path).expect("open the store");
        let queue = Mutex::new(VecDeque::from(half));
        let stats = consume(store, &queue, &ledger, &counts);
        println!(
            "life {}: {} claims acquired, {} replays, {} found in progress",
            life + 1,
            stats.acquired,
            stats.replays,
            stats.in_progress
        );
        waits += stats.in_progress;
    }

    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!("seed {seed}: {EVENTS} distinct events, {flaky} of them hit a 503 first");
    println!("  deliveries               {}", n(&counts.deliveries));
    println!("  executed (credited)      {}", n(&counts.executed));
    println!("  refused (stored)         {}", n(&counts.refused));
    println!("  replayed                 {}", n(&counts.replayed));
    println!("  in-progress waits        {waits}");
    println!(
        "  requeued past the wait   {}",
        n(&counts.requeued_in_progress)
    );
    println!(
        "  released and retried     {}",
        n(&counts.released_and_retried)
    );

    let mut expected: BTreeMap<&str, i64> = BTreeMap::new();
    let mut creditable = 0;
    for e in events.iter().filter(|e| e.account != "acct_closed") {
        *expected.entry(e.account).or_insert(0) += e.cents;
        creditable += 1;
    }
    let balances = ledger.balances.lock().unwrap().clone();
    println!("  balances                 {balances:?}");
    assert_eq!(
        balances, expected,
        "every distinct event credited exactly once"
    );
    assert_eq!(n(&ledger.credits), creditable, "one ledger write per event");
    assert_eq!(n(&counts.executed), creditable);
    assert_eq!(n(&counts.refused), EVENTS - creditable);
    assert_eq!(
        u64::try_from(flaky).expect("fits"),
        n(&counts.released_and_retried)
    );
    println!("exactly once: every balance is the sum of its distinct events");
}
