//! The engine's own thread: a single-threaded tokio runtime that owns the connections, takes
//! jobs from a queue any thread (with or without a runtime of its own) can feed, and turns the
//! jobs that queued up meanwhile into batches (group commit).
//!
//! One batch runs on one connection; up to `pool_size` batches run at once. A batch is taken
//! from the queue only once a connection is free, and a second one while another runs only
//! when enough jobs wait for it ([`MIN_CONCURRENT_BATCH`]), so while the connections are busy
//! the queue grows into the next batch: the busier the database, the larger the batches.

use super::batches::run_sorted;
use super::pool::{Conn, Pool};
use super::rows::{ClaimRow, Target};
use crate::error::Result;
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use futures_channel::oneshot;
use std::future::Future;
use std::pin::Pin;
use tokio::sync::mpsc;

/// The fewest jobs that start a batch while another batch runs. Fewer wait for the running
/// batches to end (more join them meanwhile): every statement costs the server a fixed share of
/// CPU, so small batches side by side spend it several times where one batch would spend it
/// once. A lone job with nothing running starts at once. Measured with `compare/` (100,000
/// keys, 4 processes of 16 callers, claim + complete): from 1 (any free connection starts a
/// batch) to 16, the CPU per request fell from about 350 to about 210 µs and requests/s rose
/// from about 5,000 to 7,900; with 64 callers in one process claims stayed at about 21,000/s.
const MIN_CONCURRENT_BATCH: usize = 16;

/// How long jobs wait for a running batch to end before they start one of their own anyway:
/// a statement stuck behind a row lock (another session's open transaction) delays the rest
/// of the store by this much, not until the lock goes. Under load a batch takes a few
/// milliseconds.
const MAX_WAIT_FOR_RUNNING: std::time::Duration = std::time::Duration::from_millis(10);

/// A reply channel for one job.
pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// A key's columns.
pub(crate) type Fenced = (Target, i64);

/// A task that runs on a pooled connection (reads, reaps, purges).
pub(crate) type Task =
    Box<dyn FnOnce(Result<Arc<Conn>>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Work for the engine's thread.
pub(crate) enum Job {
    Claim {
        target: Target,
        fingerprint: [u8; 32],
        reply: Reply<ClaimRow>,
    },
    Complete {
        fenced: Fenced,
        status: i32,
        headers: Vec<u8>,
        body: Vec<u8>,
        reply: Reply<Option<i64>>,
    },
    /// A release (with a reply) or a withdrawn fresh claim (without).
    Release {
        fenced: Fenced,
        reply: Option<Reply<bool>>,
    },
    /// An extension (with a reply), or a withdrawn takeover whose lease ends now (`by` zero,
    /// `orphan`, no reply).
    Extend {
        fenced: Fenced,
        by: i64,
        orphan: bool,
        reply: Option<Reply<Option<i64>>>,
    },
    /// A ticket dropped unspent: its claim is an orphan now.
    Abandon {
        fenced: Fenced,
    },
    /// Every job queued before it, and what its batch does about it (a withdrawal), lands
    /// before any job queued after it runs: sent when a claim's caller went away before its
    /// reply came, so that the caller's next operation sees the claim withdrawn.
    Barrier,
    Task(Task),
}

/// Settings every claim statement carries.
#[derive(Debug, Clone)]
pub(crate) struct ClaimParams {
    pub(crate) lease_ms: i64,
    pub(crate) take_over: bool,
    pub(crate) owner: String,
    pub(crate) incarnation: i64,
    pub(crate) ttl_ms: i64,
    /// The most records per tenant, if bounded.
    pub(crate) tenant_limit: Option<i64>,
    /// The most bytes of records, if bounded.
    pub(crate) byte_limit: Option<i64>,
}

impl ClaimParams {
    /// Whether claims go through [`super::sql::CLAIM_BOUNDED`].
    pub(crate) fn bounded(&self) -> bool {
        self.tenant_limit.is_some() || self.byte_limit.is_some()
    }
}

/// What the engine's thread shares with the store.
pub(crate) struct Context {
    pub(crate) pool: Pool,
    pub(crate) params: ClaimParams,
    /// The time of a clock injected for tests, in milliseconds; `None`: the database's.
    pub(crate) adjust: Box<dyn Fn() -> Option<i64> + Send + Sync>,
    /// Write statements committed.
    pub(crate) commits: AtomicU64,
    /// The most jobs taken into one batch (so at most that many of one kind share a
    /// statement).
    pub(crate) batch_limit: usize,
    /// Claims withdrawn here because their reply found nobody to receive it.
    pub(crate) withdrawn: AtomicU64,
    /// Jobs sent to the engine's thread whose batch has not ended: while any are, every
    /// operation goes through the queue (see [`super::direct`]).
    pub(crate) queued: AtomicUsize,
    /// The waiters, woken by the batches' completions and releases (see [`super::wakes`]).
    pub(crate) wakes: Arc<super::wakes::Wakes>,
}

/// Runs until every sender of `jobs` is gone, then lets running batches finish.
pub(crate) async fn run(context: Arc<Context>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut running = tokio::task::JoinSet::new();
    // Jobs queued after a barrier, held back from its batch: the next batch starts with them.
    let mut after_barrier: Vec<Job> = Vec::new();
    loop {
        let permit = context.pool.permit().await;
        let mut batch = std::mem::take(&mut after_barrier);
        if batch.is_empty() {
            let Some(first) = jobs.recv().await else {
                break;
            };
            batch.push(first);
        }
        while batch.len() < context.batch_limit {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A second batch at once only when enough work waits for one (see
        // `MIN_CONCURRENT_BATCH`); otherwise the jobs wait for the running batches to end, and
        // more join them meanwhile.
        let enough = MIN_CONCURRENT_BATCH.min(context.batch_limit);
        if !running.is_empty() && batch.len() < enough {
            // One timer for the whole wait, not one per job that joins meanwhile.
            let patience = tokio::time::sleep(MAX_WAIT_FOR_RUNNING);
            tokio::pin!(patience);
            while !running.is_empty() && batch.len() < enough {
                tokio::select! {
                    biased;
                    _ = running.join_next() => {}
                    job = jobs.recv() => match job {
                        Some(job) => batch.push(job),
                        None => break,
                    },
                    () = &mut patience => break,
                }
            }
        }
        // A job nobody waits for (a dropped ticket's orphan mark, a withdrawal) must land
        // before any job queued after it runs, as its caller's next operation expects: such a
        // batch (rare) is run to its end before the next one starts. A barrier also ends its
        // batch: a claim before it is withdrawn only once its statement answered, after the
        // statements of its own batch were sent, so jobs queued after the barrier go to the
        // next batch.
        if let Some(at) = batch.iter().position(|job| matches!(job, Job::Barrier)) {
            after_barrier = batch.split_off(at + 1);
            while running.join_next().await.is_some() {}
        }
        let unawaited = batch.iter().any(|job| {
            matches!(
                job,
                Job::Abandon { .. }
                    | Job::Release { reply: None, .. }
                    | Job::Extend { reply: None, .. }
                    | Job::Barrier
            )
        });
        if unawaited {
            run_batch(&context, batch).await;
            drop(permit);
            continue;
        }
        let context = Arc::clone(&context);
        running.spawn(async move {
            run_batch(&context, batch).await;
            drop(permit);
        });
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// A completion: key and fence, status, encoded headers, body.
pub(super) type CompleteItem = (Fenced, i32, Vec<u8>, Vec<u8>, Reply<Option<i64>>);

/// An extension: key and fence, by (ms), orphan.
pub(super) type ExtendItem = (Fenced, i64, bool, Option<Reply<Option<i64>>>);

/// The jobs of one batch, by kind.
#[derive(Default)]
pub(crate) struct Sorted {
    pub(super) claims: Vec<(Target, [u8; 32], Reply<ClaimRow>)>,
    pub(super) completes: Vec<CompleteItem>,
    pub(super) releases: Vec<(Fenced, Option<Reply<bool>>)>,
    pub(super) extends: Vec<ExtendItem>,
    pub(super) abandons: Vec<Fenced>,
    pub(super) tasks: Vec<Task>,
}

impl Sorted {
    pub(crate) fn of(batch: Vec<Job>) -> Sorted {
        let mut sorted = Sorted::default();
        for job in batch {
            match job {
                Job::Claim {
                    target,
                    fingerprint,
                    reply,
                } => sorted.claims.push((target, fingerprint, reply)),
                Job::Complete {
                    fenced,
                    status,
                    headers,
                    body,
                    reply,
                } => sorted
                    .completes
                    .push((fenced, status, headers, body, reply)),
                Job::Release { fenced, reply } => sorted.releases.push((fenced, reply)),
                Job::Extend {
                    fenced,
                    by,
                    orphan,
                    reply,
                } => sorted.extends.push((fenced, by, orphan, reply)),
                Job::Abandon { fenced } => sorted.abandons.push(fenced),
                Job::Barrier => {}
                Job::Task(task) => sorted.tasks.push(task),
            }
        }
        sorted
    }
}

async fn run_batch(context: &Context, batch: Vec<Job>) {
    let jobs = batch.len();
    let sorted = Sorted::of(batch);
    let conn = context.pool.take().await;
    let given = conn.as_ref().ok().map(Arc::clone);
    run_sorted(context, conn, sorted).await;
    if let Some(conn) = given {
        context.pool.give_back(conn).await;
    }
    context.queued.fetch_sub(jobs, Ordering::Release);
}
