//! Small synchronisation helpers shared by the queue objects.

use std::ops::DerefMut;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

/// The lock of the objects every message passes through (a completion
/// queue, a receive side's matcher, a provider's per-message state).
/// It has no poisoning, which [`lock`] ignores anyway: checking whether
/// the thread panics on every lock and unlock of a `std` mutex was about
/// 70 instructions of a shm ping-pong round trip.
pub type FastMutex<T> = parking_lot::Mutex<T>;

/// The guard of a [`FastMutex`].
pub type FastGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

/// What [`lock`] locks: a `std` mutex or a [`FastMutex`], directly or
/// through a reference or an `Arc`.
pub trait Lock {
    /// What it guards.
    type Target: ?Sized;

    /// The guard that holds it.
    type Guard<'a>: DerefMut<Target = Self::Target>
    where
        Self: 'a;

    /// Blocks until it holds the lock.
    fn lock_now(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Lock for Mutex<T> {
    type Target = T;
    type Guard<'a>
        = MutexGuard<'a, T>
    where
        Self: 'a;

    #[inline]
    fn lock_now(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: ?Sized> Lock for FastMutex<T> {
    type Target = T;
    type Guard<'a>
        = FastGuard<'a, T>
    where
        Self: 'a;

    #[inline(always)]
    fn lock_now(&self) -> FastGuard<'_, T> {
        self.lock()
    }
}

impl<M: Lock + ?Sized> Lock for Arc<M> {
    type Target = M::Target;
    type Guard<'a>
        = M::Guard<'a>
    where
        Self: 'a;

    #[inline(always)]
    fn lock_now(&self) -> M::Guard<'_> {
        (**self).lock_now()
    }
}

impl<M: Lock + ?Sized> Lock for &M {
    type Target = M::Target;
    type Guard<'a>
        = M::Guard<'a>
    where
        Self: 'a;

    #[inline(always)]
    fn lock_now(&self) -> M::Guard<'_> {
        (**self).lock_now()
    }
}

/// Locks a mutex, recovering the data if another thread panicked while
/// holding it: every queue object keeps its invariants between statements,
/// so the data is still consistent, and a poisoned lock must not turn one
/// failure into a cascade of panics.
#[inline(always)]
pub fn lock<M: Lock + ?Sized>(m: &M) -> M::Guard<'_> {
    m.lock_now()
}

/// The wakers of one wake-up. One or two (the usual reader of a queue)
/// live inline: waking a reader allocates nothing.
pub type Wakers = smallvec::SmallVec<[Waker; 2]>;

/// A set of wakers waiting for the same condition.
#[derive(Debug, Default)]
pub struct WakerSet {
    wakers: Wakers,
}

impl WakerSet {
    /// Registers `w` unless an equivalent waker is already present.
    pub fn register(&mut self, w: &Waker) {
        if !self.wakers.iter().any(|x| x.will_wake(w)) {
            self.wakers.push(w.clone());
        }
    }

    /// Takes every waker out, to be woken after the lock is released.
    pub fn take(&mut self) -> Wakers {
        std::mem::take(&mut self.wakers)
    }

    /// True when nobody waits.
    pub fn is_empty(&self) -> bool {
        self.wakers.is_empty()
    }
}

/// Wakes every waker of a batch.
pub fn wake_all(ws: impl IntoIterator<Item = Waker>) {
    for w in ws {
        w.wake();
    }
}

/// How many objects a queue is bound to: closing a bound queue is
/// `Busy`. Each binding holds a [`Bound`], which counts while it lives.
#[derive(Debug, Default, Clone)]
pub struct BindCount(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl BindCount {
    /// One more binding, released when the guard drops.
    pub fn hold(&self) -> Bound {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Bound(self.0.clone())
    }

    /// Bindings alive now.
    pub fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// One binding of a queue (see [`BindCount`]).
#[derive(Debug)]
pub struct Bound(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Bound {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}
