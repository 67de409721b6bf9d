//! Reading completions for the `post` API.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::{Duration, Instant};

use weft::{CompletionQueue, CqEntry, CqItem};

use super::lost;
use crate::fail::{Failure, Res};

/// Reads completions for the `post` API. Completions that are not the
/// one awaited are kept, since the order in which a send and a receive
/// complete is not fixed.
#[derive(Debug)]
pub struct Reaper {
    cq: CompletionQueue,
    stash: VecDeque<CqEntry>,
    batch: Vec<CqItem>,
    busy: bool,
    /// DGRAM: how long to wait for a completion before giving up.
    idle: Option<Duration>,
    /// The timer that gives up, kept across reads and re-armed at most
    /// every [`REARM`]: a timer made per read (`timeout_at`) cost a
    /// registration in the runtime's timer wheel and its removal on every
    /// message, on the latency path of a DGRAM ping-pong.
    guard: Option<(Pin<Box<tokio::time::Sleep>>, Instant)>,
}

/// How stale the give-up timer may get: it fires between `idle - REARM`
/// and `idle` after the last completion.
const REARM: Duration = Duration::from_secs(1);

/// The give-up timer for a read starting now: `idle` from now, give or
/// take [`REARM`].
fn rearm(
    slot: &mut Option<(Pin<Box<tokio::time::Sleep>>, Instant)>,
    idle: Duration,
) -> Pin<&mut tokio::time::Sleep> {
    let now = Instant::now();
    let (sleep, armed) =
        slot.get_or_insert_with(|| (Box::pin(tokio::time::sleep_until((now + idle).into())), now));
    if now.duration_since(*armed) >= REARM {
        sleep.as_mut().reset((now + idle).into());
        *armed = now;
    }
    sleep.as_mut()
}

impl Reaper {
    pub(super) fn new(cq: CompletionQueue, busy: bool, idle: Option<Duration>) -> Reaper {
        Reaper {
            busy,
            idle,
            cq,
            stash: VecDeque::new(),
            batch: Vec::with_capacity(64),
            guard: None,
        }
    }

    /// Reads what is there without waiting (with the progress pass an
    /// inline or busy-poll queue makes first) into `batch`; false when
    /// nothing was. On the latency path the answer is mostly there: then
    /// no read future is built or polled, and no clock is read for the
    /// give-up timer (about 150 instructions a message,
    /// `docs/benchmarks.md`).
    fn try_read(&mut self) -> bool {
        // Empty already: every read's batch is drained where it is
        // sorted (and a drain dropped early empties it as well).
        debug_assert!(self.batch.is_empty());
        self.cq.try_read_batch(&mut self.batch, 64) > 0
    }

    /// Reads the next batch of completions (at least one) into `batch`.
    async fn read(&mut self) -> Res<()> {
        if self.try_read() {
            return Ok(());
        }
        self.read_wait().await
    }

    /// [`read`](Self::read) once a read that does not wait found
    /// nothing.
    async fn read_wait(&mut self) -> Res<()> {
        self.batch.clear();
        if self.busy {
            let deadline = self.idle.map(|d| (Instant::now() + d, d));
            // Busy-poll's reader spins, sharing its core by the library's
            // policy (the provider's spinning thread may need it).
            let at = deadline.map(|(at, _)| at);
            let n = weft::read_batch_spinning(&self.cq, &mut self.batch, 64, at).await;
            if let (None, Some((_, d))) = (n, deadline) {
                return Err(lost("read completion queue", d));
            }
        } else {
            let n = match self.idle {
                None => self.cq.read_batch(&mut self.batch, 64).await,
                Some(d) => {
                    let guard = rearm(&mut self.guard, d);
                    tokio::select! {
                        biased;
                        n = self.cq.read_batch(&mut self.batch, 64) => n,
                        _ = guard => return Err(lost("read completion queue", d)),
                    }
                }
            };
            if n == 0 {
                return Err(Failure::new("read completion queue", "queue closed"));
            }
        }
        Ok(())
    }

    async fn fill(&mut self) -> Res<()> {
        self.read().await?;
        for item in self.batch.drain(..) {
            match item {
                Ok(e) => self.stash.push_back(e),
                Err(e) => return Err(Failure::new("completion", e)),
            }
        }
        Ok(())
    }

    /// The next completion, whichever it is.
    pub async fn next(&mut self) -> Res<CqEntry> {
        loop {
            if let Some(e) = self.stash.pop_front() {
                return Ok(e);
            }
            self.fill().await?;
        }
    }

    /// The completion of the operation posted with `ctx`.
    pub async fn wait(&mut self, ctx: u64) -> Res<CqEntry> {
        self.wait_for(|e| e.context == ctx).await
    }

    /// The first stashed completion `want` accepts; the front (the
    /// common case) without a search.
    fn take_stashed(&mut self, want: impl Fn(&CqEntry) -> bool) -> Option<CqEntry> {
        if want(self.stash.front()?) {
            return self.stash.pop_front();
        }
        let i = self.stash.iter().position(want)?;
        self.stash.remove(i)
    }

    /// The target completion of the peer's next write with remote CQ
    /// data (on MSG it completes a posted receive, on RDM it comes with
    /// no context of ours: the flags are what tell it apart).
    pub async fn wait_remote_write(&mut self) -> Res<CqEntry> {
        let f = weft::OpFlags::REMOTE_WRITE | weft::OpFlags::REMOTE_CQ_DATA;
        self.wait_for(|e| e.flags.contains(f)).await
    }

    /// The completion of the operation posted with `ctx` if it was read
    /// already or a read that does not wait finds it; `None` if it has
    /// not completed yet (then [`wait`](Self::wait) for it). A
    /// ping-pong's two completions mostly come in one batch: both are
    /// taken without building and polling the waits' futures.
    pub fn try_wait(&mut self, ctx: u64) -> Res<Option<CqEntry>> {
        self.try_take(&|e: &CqEntry| e.context == ctx)
    }

    /// [`try_wait`](Self::try_wait) for a completion whose entry the
    /// caller has no use for (a send's): true once it was read. The entry
    /// is dropped where it is found instead of being moved out.
    pub fn try_done(&mut self, ctx: u64) -> Res<bool> {
        let want = |e: &CqEntry| e.context == ctx;
        if self.take_stashed(want).is_some() {
            return Ok(true);
        }
        Ok(self.try_read() && self.sort(&want, drop)?)
    }

    /// [`try_wait`](Self::try_wait) for any completion `want` accepts.
    fn try_take(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Res<Option<CqEntry>> {
        if let Some(e) = self.take_stashed(want) {
            return Ok(Some(e));
        }
        if !self.try_read() {
            return Ok(None);
        }
        self.sort_out(want)
    }

    /// Empties the batch: the first completion `want` accepts goes to
    /// `found`, the others are kept, in order. True if one was found.
    fn sort(
        &mut self,
        want: &impl Fn(&CqEntry) -> bool,
        mut found: impl FnMut(CqEntry),
    ) -> Res<bool> {
        let mut hit = false;
        for item in self.batch.drain(..) {
            let e = item.map_err(|e| Failure::new("completion", e))?;
            if !hit && want(&e) {
                hit = true;
                found(e);
            } else {
                self.stash.push_back(e);
            }
        }
        Ok(hit)
    }

    /// [`sort`](Self::sort), handing the completion found to the caller.
    fn sort_out(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Res<Option<CqEntry>> {
        let mut out = None;
        self.sort(want, |e| out = Some(e))?;
        Ok(out)
    }

    /// [`wait`](Self::wait) once [`try_wait`](Self::try_wait) or
    /// [`try_done`](Self::try_done) found nothing: the stash and a read
    /// that does not wait were looked at just now, so this goes straight
    /// to a waiting read instead of making both again.
    pub async fn wait_unread(&mut self, ctx: u64) -> Res<CqEntry> {
        self.read_until(|e| e.context == ctx).await
    }

    async fn wait_for(&mut self, want: impl Fn(&CqEntry) -> bool) -> Res<CqEntry> {
        if let Some(e) = self.try_take(&want)? {
            return Ok(e);
        }
        self.read_until(want).await
    }

    /// Waiting reads until one brings a completion `want` accepts (the
    /// others are kept, in order).
    async fn read_until(&mut self, want: impl Fn(&CqEntry) -> bool) -> Res<CqEntry> {
        loop {
            self.read_wait().await?;
            if let Some(e) = self.sort_out(&want)? {
                return Ok(e);
            }
        }
    }
}
