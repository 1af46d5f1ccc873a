//! The sync bridge: a blocking caller waits for an answer from the engine's thread.

use super::stopped;
use crate::error::Result;
use futures_channel::oneshot;
use std::future::Future;

/// Blocks the calling thread until `rx` answers (see [`blocking`]).
pub(super) fn block<T>(rx: oneshot::Receiver<Result<T>>) -> Result<T> {
    blocking(answer(rx))
}

/// Runs `future` to its end on the calling thread, parked between wake-ups. Inside a
/// multi-threaded tokio runtime the worker thread is handed over first (`block_in_place`), so
/// its other tasks keep running; on a current-thread runtime the thread simply blocks (use the
/// `_async` operations there).
pub(super) fn blocking<F: Future>(future: F) -> F::Output {
    let wait = move || futures_executor::block_on(future);
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

pub(super) async fn answer<T>(rx: oneshot::Receiver<Result<T>>) -> Result<T> {
    rx.await.unwrap_or_else(|oneshot::Canceled| Err(stopped()))
}
