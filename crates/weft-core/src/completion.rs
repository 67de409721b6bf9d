//! Completion queue entries, the completion queue's shared state, and the
//! rules that decide where an operation's completion goes.
//!
//! An operation ends exactly once, through its [`OpDone`]: success feeds the
//! bound counter and, unless selective completion suppresses it, the CQ (or
//! the future that awaits this one operation); failure feeds the counter's
//! error count and always produces an error entry.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use futures::channel::oneshot;

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::counter::CounterShared;
use crate::error::{Error, Result};
use crate::flags::OpFlags;
use crate::progress::{Progress, ProgressHooks};
use crate::sync::{lock, wake_all, WakerSet};
use crate::tagmatch::MsgInfo;

mod entry;
mod wait;
pub use entry::{CqEntry, CqErrEntry, CqFormat, CqItem};

/// How a CQ reader waits when the queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Sleep until woken (reactor / eventfd style); no CPU while idle.
    #[default]
    Interrupt,
    /// Progress never waits for the reactor: a waiter drives the bound
    /// endpoints itself for its spin budget, as in `Inline`, and otherwise
    /// a dedicated thread per endpoint spins on its sockets or CQ (parked
    /// while a waiter spins, so one process spins on one core).
    BusyPoll,
    /// Readers poll for a bounded budget before sleeping; the endpoint is
    /// driven by the reactor.
    Inline,
}

impl WaitMode {
    /// Parses `interrupt`, `busy-poll` (or `busy`), `inline`.
    pub fn parse(s: &str) -> Option<WaitMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interrupt" | "irq" => Some(WaitMode::Interrupt),
            "busy-poll" | "busypoll" | "busy_poll" | "busy" => Some(WaitMode::BusyPoll),
            "inline" => Some(WaitMode::Inline),
            _ => None,
        }
    }
}

/// The smallest batch buffer a read trades for the queue's (see
/// `CqShared::take`): a smaller one is filled item by item.
const LEND_MIN: usize = 32;

/// The largest batch buffer the queue takes in a trade, unless its own
/// is larger already.
const LEND_MAX: usize = 4096;

/// Length checks a busy-poll reader makes before it sleeps (a few
/// microseconds).
const SPIN_POLLS: u32 = 4096;

#[derive(Debug, Default)]
struct CqInner {
    items: VecDeque<CqItem>,
    readers: WakerSet,
    signaled: bool,
    closed: bool,
}

/// The shared state of a completion queue. Providers push into it; the
/// public `CompletionQueue` reads from it.
#[derive(Debug)]
pub struct CqShared {
    id: u64,
    format: CqFormat,
    wait: WaitMode,
    inner: crate::sync::FastMutex<CqInner>,
    // Length mirror so empty checks on the busy path take no lock.
    len: AtomicU64,
    // `inner.closed` mirrored, so a spinning reader's poll takes no lock.
    closed: AtomicBool,
    // Inline mode: the bound endpoints, driven by readers of an empty queue.
    hooks: ProgressHooks,
    /// Endpoints bound to the queue.
    pub bound: crate::sync::BindCount,
}

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
    fn take(&self, g: &mut CqInner, out: &mut Vec<CqItem>, max: usize) -> usize {
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

    fn try_pop(&self) -> Option<CqItem> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.pop_front(&mut lock(&self.inner))
    }

    /// Takes the head item, keeping the lock-free length mirror in step.
    #[inline]
    fn pop_front(&self, g: &mut CqInner) -> Option<CqItem> {
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

/// Cuts each buffer to the bytes it holds, `placed` in total, in order.
#[inline]
pub fn trim_bufs(bufs: &mut [BytesMut], placed: usize) {
    // Most receives have one buffer.
    if let [b] = bufs {
        b.truncate(placed);
        return;
    }
    let mut left = placed;
    for b in bufs.iter_mut() {
        let n = b.len().min(left);
        b.truncate(n);
        left -= n;
    }
}

/// Where a received message's completion was reported: kept beside the
/// completion an awaiting future is sent, so a message whose future is
/// dropped before it reads it can go back to its endpoint (see
/// [`Returned`]).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The CQ the operation reported to (for a shared receive context:
    /// the one of the endpoint the message arrived at).
    pub cq: Option<Arc<CqShared>>,
    /// Its counter, likewise.
    pub cntr: Option<Arc<CounterShared>>,
}

impl Origin {
    /// No queues.
    pub fn unknown() -> Origin {
        Origin::default()
    }
}

/// What the awaiting future of an operation is sent.
///
/// Its size decides the size of every operation's channel allocation, so
/// it is kept at 88 bytes: at 96 the channel became a 176-byte block,
/// which in most heap layouts took glibc's slow path on every other
/// message (`docs/benchmarks.md`). To get there, the entry's `context`
/// slot carries the sender's raw AV handle while in the channel: the
/// future knows its own context and puts it back ([`into_result`]).
///
/// [`into_result`]: Finished::into_result
#[derive(Debug)]
pub struct Finished {
    /// The completion; an error entry boxed, since errors are rare and
    /// every completion moves this through a channel. Its `context` is
    /// the raw source (see above).
    item: std::result::Result<CqEntry, Box<CqErrEntry>>,
    /// For a receive: where it was reported.
    origin: Origin,
}

impl Finished {
    /// A completion for a future; `src` is the sender's AV handle as the
    /// endpoint knew it at arrival (before any user id replaced it in the
    /// entry), or `FI_ADDR_NOTAVAIL`.
    fn new(
        item: std::result::Result<CqEntry, Box<CqErrEntry>>,
        src: FiAddr,
        origin: Origin,
    ) -> Finished {
        let mut item = item;
        match &mut item {
            Ok(e) => e.context = src,
            Err(e) => e.context = src,
        }
        Finished { item, origin }
    }

    /// The successful completion, to look at (its `context` is the raw
    /// source until [`into_result`](Self::into_result)); `None` for an
    /// error.
    pub fn entry(&self) -> Option<&CqEntry> {
        self.item.as_ref().ok()
    }

    /// The completion as the future of the operation posted with
    /// `context` reports it, with the sender's raw AV handle and where it
    /// was reported (what a give-back needs).
    pub fn into_parts(
        self,
        context: u64,
    ) -> (std::result::Result<CqEntry, CqErrEntry>, FiAddr, Origin) {
        let Finished { item, origin } = self;
        let (item, src) = match item {
            Ok(mut e) => {
                let src = std::mem::replace(&mut e.context, context);
                (Ok(e), src)
            }
            Err(mut e) => {
                let src = std::mem::replace(&mut e.context, context);
                (Err(*e), src)
            }
        };
        (item, src, origin)
    }

    /// The completion as the future of the operation posted with
    /// `context` reports it.
    #[inline]
    pub fn into_result(self, context: u64) -> std::result::Result<CqEntry, CqErrEntry> {
        self.into_parts(context).0
    }
}

/// A received message nobody read: the future awaiting its receive was
/// dropped after the message reached it. Its endpoint hands it to the next
/// receive that takes it, ahead of later messages.
#[derive(Debug)]
pub struct Returned {
    /// The completion the receive would have reported (buffers included).
    pub entry: CqEntry,
    /// The sender's AV handle as the endpoint knew it at arrival (before
    /// any user id replaced it in the entry), or `FI_ADDR_NOTAVAIL`.
    pub src: FiAddr,
    /// Where it was reported.
    pub origin: Origin,
    /// The sender's raw address when its AV handle was unknown
    /// (`FI_SOURCE_ERR`), so that the message keeps it; else empty.
    pub raw: Vec<u8>,
}

impl Returned {
    /// The message a finished receive carries, if it carries a whole one:
    /// a completion, or an `FI_SOURCE_ERR` error entry (`AddrNotAvail`,
    /// the message placed, the sender's address in `err_data`). Other
    /// errors carry nothing to hand on.
    pub fn from_finished(f: Finished) -> Option<Returned> {
        let (item, src, origin) = f.into_parts(0);
        Returned::from_parts(item, src, origin)
    }

    /// [`from_finished`](Self::from_finished) of a completion already
    /// taken apart ([`Finished::into_parts`]).
    pub fn from_parts(
        item: std::result::Result<CqEntry, CqErrEntry>,
        src: FiAddr,
        origin: Origin,
    ) -> Option<Returned> {
        match item {
            Ok(entry) => Some(Returned {
                src,
                entry,
                origin,
                raw: Vec::new(),
            }),
            Err(e) if e.err == Error::AddrNotAvail => Some(Returned {
                src,
                entry: CqEntry {
                    context: 0,
                    flags: e.flags,
                    len: e.len,
                    bufs: e.bufs,
                    data: e.data,
                    tag: e.tag,
                    src: e.src,
                },
                origin,
                raw: e.err_data,
            }),
            Err(_) => None,
        }
    }

    /// The message as a matcher knows one: raw source, kind, tag, length,
    /// remote data.
    pub fn info(&self) -> MsgInfo {
        let e = &self.entry;
        MsgInfo {
            key: None,
            src: self.src,
            tagged: e.flags.contains(OpFlags::TAGGED),
            tag: e.tag,
            len: e.len,
            data: e.flags.contains(OpFlags::REMOTE_CQ_DATA).then_some(e.data),
        }
    }

    /// Its bytes in one buffer: the receive's own when it had only one
    /// (no copy), else joined.
    pub fn take_bytes(&mut self) -> BytesMut {
        let mut bufs = std::mem::take(&mut self.entry.bufs);
        if bufs.len() == 1 {
            return bufs.pop().unwrap_or_default();
        }
        let mut out = BytesMut::with_capacity(self.entry.len);
        for b in &bufs {
            out.extend_from_slice(b);
        }
        out
    }
}

/// The channel an awaiting future's completion comes through.
pub type Waiter = oneshot::Sender<Finished>;

/// Where the completion of one operation goes, and the rules for it.
#[derive(Debug)]
pub struct OpDone {
    /// The caller's context.
    pub context: u64,
    /// Flags of the completion entry (`FI_SEND | FI_MSG`, ...).
    pub flags: OpFlags,
    /// Report success to the CQ (false under selective completion without
    /// `FI_COMPLETION`). Errors are always reported.
    pub report: bool,
    /// The CQ bound for this direction.
    pub cq: Option<Arc<CqShared>>,
    /// The counter bound for this operation class.
    pub cntr: Option<Arc<CounterShared>>,
    /// The awaiting future of an `async fn` operation: it takes the
    /// completion instead of the CQ.
    pub waiter: Option<Waiter>,
}

/// An [`OpDone`] whose success was stamped into its entry and counted:
/// where the entry goes.
struct Settled {
    report: bool,
    cq: Option<Arc<CqShared>>,
    cntr: Option<Arc<CounterShared>>,
    waiter: Option<Waiter>,
}

impl OpDone {
    /// A success: the entry gets the operation's context and flags, and
    /// the counter moves — before the hand-over, so whoever the
    /// completion wakes sees it moved. (A message that comes back was
    /// counted as well: counters count completions, and it will complete
    /// again in the receive that takes it.) Taken apart, so that what is
    /// left is dropped field by field in place rather than by a call of
    /// the whole `OpDone`'s drop.
    #[inline(always)]
    fn settle(self, item: &mut CqItem) -> Settled {
        let OpDone {
            context,
            flags,
            report,
            cq,
            cntr,
            waiter,
        } = self;
        if let Ok(entry) = item {
            entry.context = context;
            entry.flags |= flags;
        }
        if let Some(c) = &cntr {
            c.add(1);
        }
        Settled {
            report,
            cq,
            cntr,
            waiter,
        }
    }

    /// Moves this completion out of `self`, leaving one that reports
    /// nothing and holds nothing: a receive completed through a reference
    /// to its request takes its completion this way, which costs less
    /// than moving the whole request.
    #[inline(always)]
    pub fn take(&mut self) -> OpDone {
        std::mem::replace(
            self,
            OpDone {
                context: 0,
                flags: OpFlags::empty(),
                report: false,
                cq: None,
                cntr: None,
                waiter: None,
            },
        )
    }

    /// The operation succeeded. For operations whose completion may be
    /// dropped unread (a send: the data went); receives use
    /// [`complete_from`](Self::complete_from).
    // Always: out of line (a send's completion, from the provider's
    // send path), the entry came in behind a pointer and was copied
    // into the item on this frame and from there into the queue, 112
    // bytes twice; inlined, the item is built where the caller builds
    // the entry (mostly defaults and a length).
    #[inline(always)]
    pub fn complete(self, entry: CqEntry) {
        // The queue's item from the start, as in `complete_from`.
        let mut item: CqItem = Ok(entry);
        let Settled {
            report, cq, waiter, ..
        } = self.settle(&mut item);
        if let Some(w) = waiter {
            // Nothing to give back: what was sent stays sent.
            let _ = w.send(Finished::new(
                item.map_err(Box::new),
                FI_ADDR_NOTAVAIL,
                Origin::unknown(),
            ));
        } else if report {
            if let Some(cq) = &cq {
                cq.lock_push().push(item);
            }
        }
    }

    /// [`complete`](Self::complete) of a success whose entry carries its
    /// length and nothing else (a send). When nothing takes the entry (an
    /// inject, or a send without `FI_COMPLETION` under selective
    /// completion) only the counter moves, as `settle` moves it, and the
    /// entry is never built: built into an item for nothing, and the
    /// whole `OpDone` dropped out of line, that was about 25 instructions
    /// an inject.
    #[inline(always)]
    pub fn complete_len(self, len: usize) {
        if !self.report && self.waiter.is_none() {
            let OpDone { cntr, .. } = self;
            if let Some(c) = &cntr {
                c.add(1);
            }
            return;
        }
        self.complete(CqEntry {
            len,
            ..CqEntry::default()
        });
    }

    /// A receive succeeded with a message from `src` (the raw AV handle).
    /// If the future awaiting it is already gone the message comes back,
    /// uncounted, for the endpoint to hand to the next receive.
    #[must_use = "a returned message must go to the next receive"]
    // Always: left out of line (as it was in `deliver_in`), its entry and
    // completion are copied into its parameters, about 20 instructions.
    #[inline(always)]
    pub fn complete_from(self, entry: CqEntry, src: FiAddr) -> Option<Returned> {
        // The queue's item from the start: built in place where this is
        // inlined, it goes into the queue in one copy. Wrapped at the
        // push, the entry was copied into an item and the item into the
        // queue (112 bytes).
        let mut item: CqItem = Ok(entry);
        let Settled {
            report,
            cq,
            cntr,
            waiter,
        } = self.settle(&mut item);
        if let Some(w) = waiter {
            let origin = Origin { cq, cntr };
            return w
                .send(Finished::new(item.map_err(Box::new), src, origin))
                .err()
                .and_then(Returned::from_finished);
        }
        if report {
            if let Some(cq) = &cq {
                cq.lock_push().push(item);
            }
        }
        None
    }

    /// [`complete_from`](Self::complete_from) of a completion that stays
    /// where it lies (in a receive request its caller keeps, see
    /// `recv_completion::deliver_in`): only its handles (queue, counter,
    /// waiter) are taken out, and what is left holds nothing. Taking the
    /// whole completion out first ([`take`](Self::take)) copied it onto
    /// the stack and wrote an empty one back.
    #[must_use = "a returned message must go to the next receive"]
    #[inline(always)]
    pub fn complete_from_in(&mut self, entry: CqEntry, src: FiAddr) -> Option<Returned> {
        OpDone {
            context: self.context,
            flags: self.flags,
            report: self.report,
            cq: self.cq.take(),
            cntr: self.cntr.take(),
            waiter: self.waiter.take(),
        }
        .complete_from(entry, src)
    }

    /// The operation failed; `e.context`/`e.flags` are filled in here.
    pub fn fail(self, mut e: CqErrEntry) {
        e.context = self.context;
        e.flags |= self.flags;
        if let Some(c) = &self.cntr {
            c.add_err(1);
        }
        if let Some(w) = self.waiter {
            let _ = w.send(Finished::new(
                Err(Box::new(e)),
                FI_ADDR_NOTAVAIL,
                Origin::unknown(),
            ));
        } else if let Some(cq) = &self.cq {
            cq.push(Err(e));
        }
    }

    /// Fails a receive with an error entry that carries a whole message
    /// (`FI_SOURCE_ERR`: the sender is not in the AV). As in
    /// [`complete_from`](Self::complete_from), a receive whose future is
    /// gone does not consume it: the message comes back, with `src` and
    /// the sender's raw address `raw`, for the next receive.
    pub fn fail_from(mut self, mut e: CqErrEntry, src: FiAddr) -> Option<Returned> {
        e.context = self.context;
        e.flags |= self.flags;
        if let Some(c) = &self.cntr {
            c.add_err(1);
        }
        if let Some(w) = self.waiter.take() {
            let origin = Origin {
                cq: self.cq.take(),
                cntr: self.cntr.take(),
            };
            return w
                .send(Finished::new(Err(Box::new(e)), src, origin))
                .err()
                .and_then(Returned::from_finished);
        }
        if let Some(cq) = &self.cq {
            cq.push(Err(e));
        }
        None
    }

    /// Fails with a bare error code.
    pub fn fail_with(self, err: Error) {
        let e = CqErrEntry::new(self.context, OpFlags::empty(), err);
        self.fail(e);
    }
}

#[cfg(test)]
#[path = "completion_tests.rs"]
mod tests;
