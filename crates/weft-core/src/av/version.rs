//! The change counter of an [`AvTable`](super::AvTable), readable without
//! its lock.
//!
//! Providers cache what they looked up (the last destination of a send,
//! the source of a channel) for as long as the table's version stays the
//! same. Taking the table's lock only to read that number was two lock
//! pairs of every ping-pong round trip; a private table therefore
//! publishes its version in an atomic that a provider reads through an
//! [`AvVersion`] handle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The table's own counter. Changed only under the table's lock, with
/// `Release`, as a change begins (the mutators bump it before they
/// write): a value read without the lock may therefore run ahead of the
/// table it names. It only invalidates what a reader cached; whatever a
/// reader then looks up it reads under the lock, which orders it after
/// the change. A cloned table counts on its own from the value it had.
#[derive(Debug, Default)]
pub(super) struct Counter(Arc<AtomicU64>);

impl Counter {
    /// The current value.
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// One more change.
    pub(super) fn bump(&self) {
        // Only the lock holder writes: a plain load and store suffice.
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(1), Ordering::Release);
    }

    /// A reader's handle on this counter.
    pub(super) fn watch(&self) -> AvVersion {
        AvVersion(self.0.clone())
    }
}

impl Clone for Counter {
    fn clone(&self) -> Counter {
        Counter(Arc::new(AtomicU64::new(self.get())))
    }
}

/// A reader's handle on a private table's version
/// ([`AvTable::version_watch`](super::AvTable::version_watch)): the value
/// [`AvTable::version`](super::AvTable::version) would return under the
/// lock, or a later one.
#[derive(Debug, Clone)]
pub struct AvVersion(Arc<AtomicU64>);

impl AvVersion {
    /// The table's version now.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// The version of `av`, the table `watch` was taken from
/// ([`AvTable::version_watch`](super::AvTable::version_watch)): read
/// without the table's lock when it is private, else under it after
/// catching a named table up with other processes
/// ([`lock_synced`](super::shared::lock_synced)). What a provider checks
/// its cached lookups against: the lock pair was about 25 instructions a
/// send and an arrival.
#[inline(always)]
pub fn version_now(watch: &Option<AvVersion>, av: &std::sync::Mutex<super::AvTable>) -> u64 {
    match watch {
        Some(v) => v.get(),
        None => super::shared::lock_synced(av).version(),
    }
}
