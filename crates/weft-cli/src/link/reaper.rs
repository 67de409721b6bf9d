//! Reading completions for the `post` API.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{CompletionQueue, CqEntry, CqItem};

use super::lost;
use crate::fail::{Failure, Res};

/// Reads completions for the `post` API. Completions that are not the
/// one awaited are kept, since the order in which a send and a receive
/// complete is not fixed.
#[derive(Debug)]
pub struct Reaper {
    cq: CompletionQueue,
    /// Completions read before the ones in `batch`, in order.
    stash: VecDeque<CqEntry>,
    /// What the last read brought and nobody took yet, in order; no
    /// error entries (a read fails on one and its batch is dropped, see
    /// [`check`](Self::check)).
    /// Taken from where it is: moved through the stash, every completion
    /// was copied twice more (112 bytes each time; net of the batch's
    /// own work, about 10 instructions a ping-pong round trip,
    /// `docs/benchmarks.md`). Shelved into the stash before the next
    /// read.
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

/// What a ping-pong reads of its receive's completion: how many bytes
/// came and the buffers they are in. Taken out of the batch in place
/// instead of moving the whole entry out (112 bytes as a batch item, 72
/// as an entry) and on through the results and the caller's state: each
/// move of it cost about 13 instructions, five of them a round trip.
#[derive(Debug)]
pub struct Received {
    pub len: usize,
    pub bufs: Vec<BytesMut>,
}

impl From<CqEntry> for Received {
    fn from(e: CqEntry) -> Received {
        Received {
            len: e.len,
            bufs: e.bufs,
        }
    }
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
    fn try_read(&mut self) -> Res<bool> {
        // Empty, mostly: a ping-pong takes all it read.
        self.shelve()?;
        if self.cq.try_read_batch(&mut self.batch, 64) == 0 {
            return Ok(false);
        }
        self.check()?;
        Ok(true)
    }

    /// Fails on the first error entry the last read brought (before its
    /// other completions are taken: none is left lying in the batch,
    /// where a run's last read would lose it).
    #[inline(always)]
    fn check(&mut self) -> Res<()> {
        if self.batch.iter().any(Result::is_err) {
            return self.fail_first();
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn fail_first(&mut self) -> Res<()> {
        // The whole batch goes with its first error: every caller ends
        // the run on it, and a batch left holding a second error would
        // make the next shelve stop there and drop what follows it.
        let first = self.batch.drain(..).find_map(Result::err);
        match first {
            Some(e) => Err(Failure::new("completion", e)),
            None => Ok(()),
        }
    }

    /// Moves what is left of the last read into the stash, behind what
    /// is there, so that a read into the batch finds it empty (as the
    /// queue's trade of buffers wants it).
    #[inline(always)]
    fn shelve(&mut self) -> Res<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.shelve_all()
    }

    #[cold]
    #[inline(never)]
    fn shelve_all(&mut self) -> Res<()> {
        for item in self.batch.drain(..) {
            self.stash
                .push_back(item.map_err(|e| Failure::new("completion", e))?);
        }
        Ok(())
    }

    /// Reads the next batch of completions (at least one) into `batch`.
    async fn read(&mut self) -> Res<()> {
        if self.try_read()? {
            return Ok(());
        }
        self.read_wait().await
    }

    /// [`read`](Self::read) once a read that does not wait found
    /// nothing.
    async fn read_wait(&mut self) -> Res<()> {
        self.shelve()?;
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
        self.check()
    }

    async fn fill(&mut self) -> Res<()> {
        self.read().await?;
        self.shelve()
    }

    /// The next completion, whichever it is.
    pub async fn next(&mut self) -> Res<CqEntry> {
        loop {
            if let Some(e) = self.stash.pop_front() {
                return Ok(e);
            }
            if self.batch.is_empty() {
                self.fill().await?;
            } else {
                self.shelve()?;
            }
        }
    }

    /// The completion of the operation posted with `ctx`.
    pub async fn wait(&mut self, ctx: u64) -> Res<CqEntry> {
        self.wait_for(|e| e.context == ctx).await
    }

    /// The first completion read already that `want` accepts: the
    /// stash's (the older ones) before the batch's.
    #[inline(always)]
    fn take_read(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Option<CqEntry> {
        if !self.stash.is_empty() {
            if let Some(e) = self.take_stashed(want) {
                return Some(e);
            }
        }
        self.take_batched(want)
    }

    /// The first stashed completion `want` accepts; the front (the
    /// common case) without a search.
    fn take_stashed(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Option<CqEntry> {
        if want(self.stash.front()?) {
            return self.stash.pop_front();
        }
        let i = self.stash.iter().position(want)?;
        self.stash.remove(i)
    }

    /// Where in the batch the first completion `want` accepts is.
    #[inline(always)]
    fn find_batched(&self, want: &impl Fn(&CqEntry) -> bool) -> Option<usize> {
        self.batch
            .iter()
            .position(|it| matches!(it, Ok(e) if want(e)))
    }

    /// The first completion in the batch `want` accepts; the last one
    /// (a ping-pong's answer, taken first) without moving the others.
    #[inline(always)]
    fn take_batched(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Option<CqEntry> {
        let i = self.find_batched(want)?;
        if i + 1 == self.batch.len() {
            return self.batch.pop()?.ok();
        }
        self.take_batched_at(i)
    }

    #[cold]
    #[inline(never)]
    fn take_batched_at(&mut self, i: usize) -> Option<CqEntry> {
        self.batch.remove(i).ok()
    }

    /// [`take_batched`](Self::take_batched) of the length and buffers
    /// of a completion ([`Received`]): the last one's are taken out of it
    /// where it lies, and what is left of it (it owns nothing then) is
    /// dropped there.
    #[inline(always)]
    fn take_batched_received(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Option<Received> {
        let i = self.find_batched(want)?;
        if i + 1 == self.batch.len() {
            let got = match self.batch.last_mut() {
                Some(Ok(e)) => Received {
                    len: e.len,
                    bufs: std::mem::take(&mut e.bufs),
                },
                // `find_batched` found an entry there.
                _ => return None,
            };
            drop(self.batch.pop());
            return Some(got);
        }
        self.take_batched_at(i).map(Received::from)
    }

    /// [`take_batched`](Self::take_batched) of a completion nobody
    /// looks at.
    #[inline(always)]
    fn drop_batched(&mut self, want: &impl Fn(&CqEntry) -> bool) -> bool {
        let Some(i) = self.find_batched(want) else {
            return false;
        };
        if i + 1 == self.batch.len() {
            // Not `truncate`: that drops through a loop over a slice,
            // out of line (about 38 instructions a message).
            drop(self.batch.pop());
        } else {
            drop(self.take_batched_at(i));
        }
        true
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

    /// [`try_wait`](Self::try_wait) for a completion of which the
    /// caller uses the length and the buffers only (a ping-pong's
    /// receive): see [`Received`].
    pub fn try_wait_received(&mut self, ctx: u64) -> Res<Option<Received>> {
        let want = |e: &CqEntry| e.context == ctx;
        if !self.stash.is_empty() {
            if let Some(e) = self.take_stashed(&want) {
                return Ok(Some(e.into()));
            }
        }
        if let Some(r) = self.take_batched_received(&want) {
            return Ok(Some(r));
        }
        if !self.try_read()? {
            return Ok(None);
        }
        Ok(self.take_batched_received(&want))
    }

    /// [`try_wait`](Self::try_wait) for a completion whose entry the
    /// caller has no use for (a send's): true once it was read.
    pub fn try_done(&mut self, ctx: u64) -> Res<bool> {
        let want = |e: &CqEntry| e.context == ctx;
        if !self.stash.is_empty() && self.take_stashed(&want).is_some() {
            return Ok(true);
        }
        if self.drop_batched(&want) {
            return Ok(true);
        }
        Ok(self.try_read()? && self.drop_batched(&want))
    }

    /// [`try_wait`](Self::try_wait) for any completion `want` accepts.
    #[inline(always)]
    fn try_take(&mut self, want: &impl Fn(&CqEntry) -> bool) -> Res<Option<CqEntry>> {
        if let Some(e) = self.take_read(want) {
            return Ok(Some(e));
        }
        if !self.try_read()? {
            return Ok(None);
        }
        Ok(self.take_batched(want))
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
            if let Some(e) = self.take_batched(&want) {
                return Ok(e);
            }
        }
    }
}
