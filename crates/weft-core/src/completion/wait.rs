//! Reading a completion queue that may be empty: the waits of
//! [`CqShared`]'s readers in each wait mode (interrupt, busy-poll, inline
//! spinning), kept apart from the queue itself.

use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use super::{CqInner, CqItem, CqShared, WaitMode, SPIN_POLLS};
use crate::progress::{InlineWait, Spun};
use crate::sync::lock;

impl CqShared {
    /// Polls for a batch: `Ready(n)` once `n` (at least one, at most
    /// `max.max(1)`) items were moved, in order, into `out`; `Ready(0)`
    /// once the queue is closed and drained; `Pending` as
    /// [`poll_next`](Self::poll_next). Items queued already are taken as
    /// [`pop_batch`](Self::pop_batch) takes them: under one lock, with
    /// what a progress pass adds (one lock instead of one for the first
    /// item and another for the rest).
    #[inline]
    pub fn poll_batch(
        &self,
        cx: &mut Context<'_>,
        wait: &mut InlineWait,
        out: &mut Vec<CqItem>,
        max: usize,
    ) -> Poll<usize> {
        let max = max.max(1);
        // A pass first unless the batch is full already, as in
        // `pop_batch`; an empty queue is left to the wait's own passes.
        let queued = self.len.load(Ordering::Acquire) as usize;
        let got = if queued == 0 && self.spins() && !self.closed.load(Ordering::Acquire) {
            // An empty queue of a spinning reader: the wait's passes
            // straight away, the lock left alone (one lock and unlock
            // a poll less while a reader spins).
            self.spin(cx, wait)
        } else {
            if queued > 0 && queued < max && !self.hooks.is_empty() {
                self.hooks.drive();
            }
            let mut g = lock(&self.inner);
            let n = self.take(&mut g, out, max);
            if n > 0 {
                wait.finish(Some(&self.spin_hint));
                return Poll::Ready(n);
            }
            self.poll_wait(g, cx, wait)
        };
        match got {
            Poll::Ready(Some(it)) => {
                out.push(it);
                // What else is queued joins the batch, without another
                // pass: the wait's pass that found `it` was just now (a
                // second one cost about 460 instructions a round trip).
                let more = if max > 1 && self.len.load(Ordering::Acquire) > 0 {
                    self.take(&mut lock(&self.inner), out, max - 1)
                } else {
                    0
                };
                Poll::Ready(1 + more)
            }
            Poll::Ready(None) => Poll::Ready(0),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Polls for the next item: `Ready(Some)` with an item, `Ready(None)`
    /// once the queue is closed and drained, `Pending` after registering the
    /// waker. Busy-poll readers spin briefly first; inline readers drive the
    /// bound endpoints (`wait` holds this reader's spin budget), and
    /// within that budget return `Pending` having woken the waker for a
    /// re-poll instead of registering it.
    #[inline]
    pub fn poll_next(&self, cx: &mut Context<'_>, wait: &mut InlineWait) -> Poll<Option<CqItem>> {
        // An item queued already (a ping-pong's send completion, mostly)
        // is taken inline; waiting is out of line.
        let mut g = lock(&self.inner);
        if let Some(it) = self.pop_front(&mut g) {
            wait.finish(Some(&self.spin_hint));
            return Poll::Ready(Some(it));
        }
        self.poll_wait(g, cx, wait)
    }

    /// [`poll_next`](Self::poll_next) of an empty queue, its lock held.
    fn poll_wait<'a>(
        &'a self,
        mut g: crate::sync::FastGuard<'a, CqInner>,
        cx: &mut Context<'_>,
        wait: &mut InlineWait,
    ) -> Poll<Option<CqItem>> {
        if g.closed {
            return Poll::Ready(None);
        }
        match self.wait {
            WaitMode::Interrupt => {}
            WaitMode::Inline | WaitMode::BusyPoll if !self.hooks.is_empty() => {
                drop(g);
                return self.spin(cx, wait);
            }
            WaitMode::Inline | WaitMode::BusyPoll => {
                drop(g);
                if let Some(it) = self.spin_for_item() {
                    return Poll::Ready(Some(it));
                }
                return self.sleep(cx, wait);
            }
        }
        g.readers.register(cx.waker());
        Poll::Pending
    }

    /// A reader that spun with the lock let go and found nothing goes to
    /// sleep: registered under the lock, after a last look (an item
    /// pushed since it last looked would wake nobody) and a close check
    /// (a close takes the wakers registered before it; registering
    /// after it would sleep for ever).
    fn sleep(&self, cx: &mut Context<'_>, wait: &mut InlineWait) -> Poll<Option<CqItem>> {
        let mut g = lock(&self.inner);
        if let Some(it) = self.pop_front(&mut g) {
            wait.finish(Some(&self.spin_hint));
            return Poll::Ready(Some(it));
        }
        if g.closed {
            return Poll::Ready(None);
        }
        g.readers.register(cx.waker());
        Poll::Pending
    }

    /// Whether a reader of an empty queue drives the bound endpoints
    /// itself ([`spin`](Self::spin)).
    #[inline]
    fn spins(&self) -> bool {
        matches!(self.wait, WaitMode::Inline | WaitMode::BusyPoll) && !self.hooks.is_empty()
    }

    /// The wait of a reader that drives the bound endpoints, its queue
    /// found empty (without the lock held).
    fn spin(&self, cx: &mut Context<'_>, wait: &mut InlineWait) -> Poll<Option<CqItem>> {
        // Held for this poll's passes only: a closed endpoint is still
        // let go of at once.
        let one = self.hooks.single();
        wait.cheap_passes(one.as_ref().is_some_and(|p| p.cheap_pass()));
        // The queue's budget is learned only when the one endpoint it
        // drives learns its own (`Progress::spin_hint`).
        let hint = one
            .as_ref()
            .and_then(|p| p.spin_hint())
            .map(|_| &self.spin_hint);
        match wait.spin(
            cx,
            hint,
            || match &one {
                Some(p) => p.progress(),
                None => self.hooks.drive(),
            },
            |_| self.try_pop(),
            || self.hooks.idle(),
        ) {
            Spun::Ready(it) => Poll::Ready(Some(it)),
            // Within the budget the wait has asked for a re-poll
            // already: nothing to register, and a reader that finds its
            // item while spinning never registers.
            Spun::Again => Poll::Pending,
            Spun::Sleep => self.sleep(cx, wait),
        }
    }

    /// Busy-poll readers spin on the lock-free length for a short while
    /// before sleeping: completions that arrive within microseconds are
    /// taken without a wake-up, and an idle reader still costs no CPU.
    /// (The endpoint's busy-poll thread is the one dedicated spinner.)
    fn spin_for_item(&self) -> Option<CqItem> {
        for _ in 0..SPIN_POLLS {
            if self.len.load(Ordering::Acquire) > 0 {
                if let Some(it) = self.pop_front(&mut lock(&self.inner)) {
                    return Some(it);
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Polls until an item arrives or the queue is signalled; a signal
    /// resolves to `Ready(None)` once (fi_cq_signal / fi_cq_sread returning
    /// `Again`).
    pub fn poll_item_or_signal(&self, cx: &mut Context<'_>) -> Poll<Option<CqItem>> {
        let mut g = lock(&self.inner);
        if let Some(it) = self.pop_front(&mut g) {
            return Poll::Ready(Some(it));
        }
        if g.closed || std::mem::take(&mut g.signaled) {
            return Poll::Ready(None);
        }
        g.readers.register(cx.waker());
        Poll::Pending
    }
}
