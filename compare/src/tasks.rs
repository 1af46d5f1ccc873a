//! One cell whose callers are tokio tasks (`--callers Nt`): N tasks on a multi-thread runtime
//! (one worker thread per CPU, tokio's default), each with its own [`TaskClient`], awaiting the
//! store's async methods as idemdb's HTTP layer and MCP gateway do. The same workload, key
//! streams, window and counters as a cell of caller threads (`runner.rs`), so that the two rows
//! compare.

use crate::measure::Device;
use crate::runner::{sample, sleep_until, Outcome, Recorded, Spec};
use crate::systems::{fail, Result, System, TaskClient};
use crate::workload::{Requests, Rng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Runs one cell of `spec.callers.total()` tasks; the counters are sampled on this thread at
/// the window's edges while the runtime's workers run the tasks. The first task's error stops
/// every task and is returned.
pub fn run(system: &dyn System, spec: Spec, cell: u64, device: Option<&Device>) -> Result<Outcome> {
    let clients: Vec<Box<dyn TaskClient>> = (0..spec.callers.total())
        .map(|_| system.task_client())
        .collect::<Option<_>>()
        .map_or_else(|| fail("no async API for tokio tasks"), Ok)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let abort = Arc::new(AtomicBool::new(false));
    let warm_end = Instant::now() + spec.warmup;
    let end = warm_end + spec.window;
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, client)| {
            let abort = Arc::clone(&abort);
            runtime.spawn(caller(client, spec, cell, t as u64, (warm_end, end), abort))
        })
        .collect();
    sleep_until(warm_end);
    let before = sample(system, device, &[]);
    sleep_until(end);
    let after = sample(system, device, &[]);
    let recorded = runtime.block_on(async {
        let mut all = Recorded::default();
        let mut first_error = None;
        for task in tasks {
            match task.await {
                Ok(Ok(rec)) => all.merge(&rec),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert_with(|| "a caller task panicked".into());
                }
            }
        }
        first_error.map_or(Ok(all), Err)
    })?;
    Ok(Outcome::new(spec.window, recorded, before?, after?))
}

/// One task's loop, as a caller thread's in `runner::drive`: draw a new request outside the
/// timed part, time the operation(s), record it if it ended in the window.
async fn caller(
    mut client: Box<dyn TaskClient>,
    spec: Spec,
    cell: u64,
    stream: u64,
    (warm_end, end): (Instant, Instant),
    abort: Arc<AtomicBool>,
) -> Result<Recorded> {
    let mut requests = Requests::new(Rng::derive(spec.seed, cell, stream));
    let mut rec = Recorded::for_caller(&spec);
    let completes = spec.workload.completes();
    while !abort.load(Ordering::Relaxed) {
        let req = spec.workload.next_request(&mut requests);
        let began = Instant::now();
        if began >= end {
            break;
        }
        let result = async {
            client.claim(&req).await?;
            let claimed = Instant::now();
            if completes {
                client.complete(&req).await?;
            }
            Ok(claimed)
        }
        .await;
        let claimed = match result {
            Ok(claimed) => claimed,
            Err(e) => {
                abort.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        rec.record((began, claimed, Instant::now()), (warm_end, end), completes);
    }
    Ok(rec)
}
