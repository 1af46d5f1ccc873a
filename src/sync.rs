//! Every synchronisation primitive the crate uses, imported from one place so that a model
//! checker or a different lock implementation can be swapped in here alone.

pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
#[cfg(any(feature = "postgres", feature = "metrics"))]
pub(crate) use std::sync::atomic::AtomicI64;
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Once, OnceLock, Weak};

/// A waker that unparks the calling thread: what a thread that parks between polls (or
/// looks) hands to whatever should wake it.
pub(crate) fn thread_waker() -> std::task::Waker {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    std::task::Waker::from(Arc::new(Unpark(std::thread::current())))
}

/// Aligns its content to 128 bytes, so two values never share a cache line (nor the adjacent
/// line that x86 prefetches in pairs). Used for lock stripes, where false sharing would make
/// uncontended stripes contend.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
