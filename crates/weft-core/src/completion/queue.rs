//! The completion queue's own work: pushing (one at a time or under one
//! lock), taking items and batches, the error entry at the head, closing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::progress::{Progress, ProgressHooks};
use crate::sync::{lock, wake_all};

use super::{
    CqEntry, CqErrEntry, CqFormat, CqInner, CqItem, CqShared, WaitMode, LEND_MAX, LEND_MIN,
};

/// A completion queue locked for one push ([`CqShared::lock_push`]).
pub(crate) struct PushLock<'a> {
    cq: &'a CqShared,
    g: crate::sync::FastGuard<'a, CqInner>,
}

impl PushLock<'_> {
    /// Appends `item` and wakes readers. Always inlined: out of line,
    /// the entry was built on the caller's stack and copied again into
    /// the queue.
    #[inline(always)]
    pub(crate) fn push(self, item: CqItem) {
        let PushLock { cq, mut g } = self;
        g.items.push_back(item);
        // The default formats carry every field: nothing to clear. The
        // others are cleared in the queue: an item changed on its way
        // there is copied once more.
        if !matches!(cq.format, CqFormat::Tagged | CqFormat::Unspec) {
            if let Some(Ok(e)) = g.items.back_mut() {
                e.mask(cq.format);
            }
        }
        cq.len.store(g.items.len() as u64, Ordering::Release);
        // A reader that drives progress itself is usually the one
        // pushing: nobody to wake, nothing to take.
        if !g.readers.is_empty() {
            CqShared::wake_readers(g);
        }
    }
}

impl CqShared {
    /// A new queue. `size` is a hint: the queue never drops an entry, so
    /// it grows past it rather than losing a completion.
    pub fn new(id: u64, format: CqFormat, wait: WaitMode, size: usize) -> Arc<CqShared> {
        let inner = CqInner {
            items: VecDeque::with_capacity(size.min(1 << 16)),
            ..CqInner::default()
        };
        Arc::new(CqShared {
            id,
            format,
            wait,
            inner: crate::sync::FastMutex::new(inner),
            len: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            hooks: ProgressHooks::default(),
            spin_hint: Default::default(),
            bound: crate::sync::BindCount::default(),
        })
    }

    /// The object id (fid) of the queue.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The entry format.
    pub fn format(&self) -> CqFormat {
        self.format
    }

    /// How readers wait.
    pub fn wait_mode(&self) -> WaitMode {
        self.wait
    }

    /// Inline mode: readers of this queue drive `hook` when it is empty.
    pub fn add_progress(&self, hook: &Arc<dyn Progress>) {
        self.hooks.add(hook);
    }

    /// Drives the bound endpoints once if the queue is empty and any are
    /// registered (manual progress, as `fi_cq_read` does it).
    fn progress_if_empty(&self) {
        if self.len.load(Ordering::Acquire) == 0 && !self.hooks.is_empty() {
            self.hooks.drive();
        }
    }

    /// Appends an item and wakes readers.
    #[inline(always)]
    pub fn push(&self, item: CqItem) {
        self.lock_push().push(item);
    }

    /// The queue, locked for one [`push`](PushLock::push). A caller
    /// whose entry is large takes the lock first and hands the entry
    /// over after: an entry moved into a callee ahead of the lock's
    /// atomic operation was copied onto the stack there (the compiler
    /// does not carry its bytes across the operation) and copied again
    /// into the queue, 112 bytes twice a round trip.
    #[inline(always)]
    pub(crate) fn lock_push(&self) -> PushLock<'_> {
        PushLock {
            cq: self,
            g: lock(&self.inner),
        }
    }

    /// Wakes the readers registered in `g`, after letting the lock go.
    /// Kept out of [`PushLock::push`] so that the push inlines.
    #[cold]
    #[inline(never)]
    fn wake_readers(mut g: crate::sync::FastGuard<'_, CqInner>) {
        let wakers = g.readers.take();
        drop(g);
        wake_all(wakers);
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire) as usize
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `fi_cq_read` of up to `max` successful entries. An error entry at
    /// the head gives `Err(Avail)` (read it with [`CqShared::read_err`]);
    /// an empty queue gives `Err(Again)`.
    pub fn read(&self, max: usize) -> Result<Vec<CqEntry>> {
        self.progress_if_empty();
        let mut g = lock(&self.inner);
        let mut out = Vec::new();
        while out.len() < max {
            match g.items.front() {
                Some(Ok(_)) => {
                    if let Some(Ok(e)) = self.pop_front(&mut g) {
                        out.push(e);
                    }
                }
                Some(Err(_)) if out.is_empty() => return Err(Error::Avail),
                _ => break,
            }
        }
        if out.is_empty() {
            Err(Error::Again)
        } else {
            Ok(out)
        }
    }

    /// `fi_cq_readerr`: the error entry at the head, or `Err(Again)`.
    pub fn read_err(&self) -> Result<CqErrEntry> {
        self.progress_if_empty();
        let mut g = lock(&self.inner);
        if matches!(g.items.front(), Some(Err(_))) {
            if let Some(Err(e)) = self.pop_front(&mut g) {
                return Ok(e);
            }
        }
        Err(Error::Again)
    }

    /// Moves up to `max` items, in order, into `out`; returns how many.
    /// Inline and busy-poll queues drive their bound endpoints once first
    /// unless `max` items are queued already: what that pass completes
    /// joins the batch under the same lock (a ping-pong's answer, beside
    /// its send's completion).
    #[inline]
    pub fn pop_batch(&self, out: &mut Vec<CqItem>, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        if (self.len.load(Ordering::Acquire) as usize) < max && !self.hooks.is_empty() {
            self.hooks.drive();
        }
        // Still empty: nothing to take, and no lock to take for it.
        if self.len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.take(&mut lock(&self.inner), out, max)
    }

    /// [`pop_batch`](Self::pop_batch) made again while it finds nothing,
    /// at least once and `passes` times at most: for a reader that polls
    /// an empty queue in a loop (`weft::read_batch_spinning`, busy-poll's
    /// reader). A lone hook is upgraded once for all the passes, as an
    /// inline reader's wait does ([`ProgressHooks::single`]), instead of
    /// once a `pop_batch`: that upgrade (a compare-and-swap, and a
    /// decrement at its drop), the call and its checks were what made
    /// busy-poll's empty spinning pass dearer than inline's
    /// (`docs/benchmarks.md`, "the busy reader's empty pass"). The
    /// hook is held for these passes only, so a closed endpoint is let
    /// go of within microseconds, as by the inline wait. Returns the
    /// items taken; 0 after `passes` passes found nothing.
    #[inline]
    pub fn pop_batch_passes(&self, out: &mut Vec<CqItem>, max: usize, passes: u32) -> usize {
        if max == 0 {
            return 0;
        }
        if (self.len.load(Ordering::Acquire) as usize) < max {
            let one = self.hooks.single();
            let mut left = passes.max(1);
            loop {
                match &one {
                    Some(p) => {
                        p.progress();
                    }
                    None => {
                        if !self.hooks.is_empty() {
                            self.hooks.drive();
                        }
                    }
                }
                if self.len.load(Ordering::Acquire) > 0 {
                    break;
                }
                left -= 1;
                if left == 0 {
                    return 0;
                }
            }
        }
        // One call of `take` for both ways here: with two, it was not
        // inlined (in the build measured).
        self.take(&mut lock(&self.inner), out, max)
    }

    /// Moves up to `max` items from `g`, in order, into `out`; returns
    /// how many.
    #[inline]
    pub(super) fn take(&self, g: &mut CqInner, out: &mut Vec<CqItem>, max: usize) -> usize {
        let n = max.min(g.items.len());
        // All that is queued, into an empty batch with room for a whole
        // one (a reader that reuses its batch): the two buffers trade
        // places instead of each item being moved out and in again (112
        // bytes twice an item, about 85 instructions a ping-pong round
        // trip). The queue keeps a buffer of at least `max` items, and
        // of at least `LEND_MIN`, so that it seldom has to grow, and
        // never one larger than `LEND_MAX` or its own (a one-off drain
        // with a huge batch would leave the queue holding it); the
        // batch takes the queue's, which holds its items from the start
        // unless the queue wrapped (then `Vec::from` moves them there).
        if n > 0
            && n == g.items.len()
            && out.is_empty()
            && out.capacity() >= max.max(LEND_MIN)
            && out.capacity() <= LEND_MAX.max(g.items.capacity())
        {
            let spare = VecDeque::from(std::mem::take(out));
            *out = Vec::from(std::mem::replace(&mut g.items, spare));
        } else {
            // Item by item: `extend` from a `drain` cost about 100
            // instructions an item more (a batch is mostly one or two).
            out.reserve(n);
            for _ in 0..n {
                if let Some(it) = g.items.pop_front() {
                    out.push(it);
                }
            }
        }
        self.len.store(g.items.len() as u64, Ordering::Release);
        n
    }

    pub(super) fn try_pop(&self) -> Option<CqItem> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.pop_front(&mut lock(&self.inner))
    }

    /// Takes the head item, keeping the lock-free length mirror in step.
    #[inline]
    pub(super) fn pop_front(&self, g: &mut CqInner) -> Option<CqItem> {
        let it = g.items.pop_front();
        self.len.store(g.items.len() as u64, Ordering::Release);
        it
    }

    /// `fi_cq_signal`: wakes a reader blocked on an empty queue.
    pub fn signal(&self) {
        let wakers = {
            let mut g = lock(&self.inner);
            g.signaled = true;
            g.readers.take()
        };
        wake_all(wakers);
    }

    /// Marks the queue closed: streams end after the remaining items.
    pub fn close(&self) {
        let wakers = {
            let mut g = lock(&self.inner);
            g.closed = true;
            self.closed.store(true, Ordering::Release);
            g.readers.take()
        };
        wake_all(wakers);
    }
}
