//! Every synchronisation primitive the crate uses, imported from one place so that a model
//! checker or a different lock implementation can be swapped in here alone.

pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Weak};

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
