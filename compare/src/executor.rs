//! A minimal executor for the idemdb preload: keeps many futures in flight on one thread, so
//! idemdb's commit pipeline batches their writes into few fsyncs.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The slots woken since the executor last looked.
#[derive(Default)]
struct Ready {
    slots: Mutex<Vec<usize>>,
    signal: Condvar,
}

/// Wakes one slot.
struct SlotWaker {
    slot: usize,
    ready: Arc<Ready>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut slots = self.ready.slots.lock().expect("ready list poisoned");
        slots.push(self.slot);
        self.ready.signal.notify_one();
    }
}

/// Runs `make(0) .. make(total - 1)` to completion with at most `in_flight` of them pending at
/// once, and returns the first error (the remaining futures are dropped).
pub fn run_all<F, E>(total: u64, in_flight: usize, mut make: impl FnMut(u64) -> F) -> Result<(), E>
where
    F: Future<Output = Result<(), E>>,
{
    let ready = Arc::new(Ready::default());
    let wakers: Vec<Waker> = (0..in_flight.max(1))
        .map(|slot| {
            Waker::from(Arc::new(SlotWaker {
                slot,
                ready: Arc::clone(&ready),
            }))
        })
        .collect();
    let mut slots: Vec<Option<Pin<Box<F>>>> = (0..wakers.len()).map(|_| None).collect();
    let mut next = 0u64;
    let mut pending = 0usize;
    let mut to_poll: Vec<usize> = (0..slots.len()).collect();
    loop {
        for slot in to_poll.drain(..) {
            loop {
                if slots[slot].is_none() {
                    if next == total {
                        break;
                    }
                    slots[slot] = Some(Box::pin(make(next)));
                    next += 1;
                    pending += 1;
                }
                let fut = slots[slot].as_mut().expect("slot just filled");
                let mut cx = Context::from_waker(&wakers[slot]);
                match fut.as_mut().poll(&mut cx) {
                    Poll::Pending => break,
                    Poll::Ready(result) => {
                        slots[slot] = None;
                        pending -= 1;
                        result?;
                    }
                }
            }
        }
        if pending == 0 && next == total {
            return Ok(());
        }
        let mut woken = ready.slots.lock().expect("ready list poisoned");
        while woken.is_empty() {
            woken = ready.signal.wait(woken).expect("ready list poisoned");
        }
        std::mem::swap(&mut *woken, &mut to_poll);
        drop(woken);
        // A slot can be woken twice; polling an empty or re-filled slot is harmless, but
        // polling a slot twice in a row is wasted work.
        to_poll.sort_unstable();
        to_poll.dedup();
    }
}

#[cfg(test)]
mod tests {
    use super::run_all;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context, Poll};

    /// Pending once (waking itself from another thread), then ready.
    struct YieldOnce(bool);

    impl Future for YieldOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            let waker = cx.waker().clone();
            std::thread::spawn(move || waker.wake());
            Poll::Pending
        }
    }

    #[test]
    fn runs_every_future_once() {
        let done = AtomicU64::new(0);
        let result: Result<(), ()> = run_all(100, 7, |i| {
            let done = &done;
            async move {
                YieldOnce(false).await;
                done.fetch_add(i + 1, Ordering::Relaxed);
                Ok(())
            }
        });
        assert!(result.is_ok());
        assert_eq!(done.load(Ordering::Relaxed), 5050);
    }

    #[test]
    fn stops_at_the_first_error() {
        let result: Result<(), u64> = run_all(100, 4, |i| async move {
            YieldOnce(false).await;
            if i == 10 {
                Err(i)
            } else {
                Ok(())
            }
        });
        assert_eq!(result, Err(10));
    }
}
