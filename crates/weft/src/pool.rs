//! Registered buffer pools: local descriptors that mean something
//! (`fi_mr_desc`).
//!
//! [`Domain::buffer_pool`] registers `count` buffers of `size` bytes once
//! (verbs: one memory region) and hands them out as owned [`PoolBuf`]s.
//! Sends, receives and RMA from pool buffers go to the device under the
//! pool's local key: no registration per operation, no registration-cache
//! lookup, no copy into bounce buffers. On providers that register
//! nothing (tcp, udp) the pool is plain memory and the same code works.
//!
//! What comes back when is said on [`BufferPool`], where rustdoc shows it.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;
use weft_core::pool::Slots;
use weft_core::provider::{PoolHome, PoolSend};
use weft_core::sync::FastMutex;
use weft_core::{Error, Result};

use crate::fabric::Domain;

/// Most buffers one pool may hold.
pub const MAX_POOL_BUFS: usize = 1 << 20;

/// What a pool holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Buffers the pool was made with.
    pub count: usize,
    /// Buffers in the pool, ready to hand out.
    pub free: usize,
    /// Buffers discarded with an operation an endpoint closed under
    /// them; never handed out again.
    pub lost: usize,
    /// Buffers out on posted receives, not reclaimed from their
    /// completions yet ([`BufferPool::reclaim`]).
    pub lent: usize,
}

/// A pool of registered buffers of one domain
/// ([`Domain::buffer_pool`]). Cloning gives another handle to the same
/// pool; its memory is deregistered and freed once every handle and
/// every buffer is gone.
///
/// A buffer goes back to the pool when it is dropped, wherever that
/// happens: in the application, when a send or RMA write it was frozen
/// into completes or fails ([`PoolBuf::freeze`]), or after the receive or
/// RMA read it was lent to ends — also when that operation's future is
/// dropped first: the receive is withdrawn and the buffer comes back once
/// the device can no longer write it, never earlier. An endpoint closed
/// under a pool receive or read discards that operation and its buffer
/// with it; the pool then counts the buffer as lost
/// ([`PoolStats::lost`]) and never hands it out again.
///
/// The posted forms (`Endpoint::post_send_pooled`,
/// `Endpoint::post_recv_pooled`, completions on the bound CQ) hand a
/// receive's buffer to the caller inside its completion: the entry's
/// `bufs` (error entries' too: a cancelled receive — on verbs MSG only
/// one that had no work request of its own; the device keeps a posted
/// one's buffer, which the next message to land in it brings back inside
/// another receive's completion, or which stays lent) hold it, and
/// [`BufferPool::reclaim`] makes it a `PoolBuf` again. Until then the
/// pool counts it as lent ([`PoolStats::lent`]) and never hands it out;
/// its memory stays allocated whatever happens to the entry. A completion
/// dropped without a reclaim, or a receive discarded by `fi_close`
/// (which reports nothing), leaves the buffer lent for good: cancel
/// posted pool receives before closing to have their buffers back.
///
/// [`get`](Self::get) waits while no buffer is free; buffers lent for
/// good never come back, so a pool whose every buffer is lent for good
/// keeps a `get` waiting (it fails with `NoBufs` only once all are
/// lost).
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    domain: u64,
    size: usize,
    count: usize,
    desc: u64,
    slots: Slots,
    free: FastMutex<Free>,
    /// Wakes a `get` waiting for a buffer (once per buffer returned while
    /// one waits, all of them when every buffer is lost). Not a
    /// semaphore: its permits cost a lock at every return, waiters or not
    /// (about 80 instructions a message of a pool ping-pong).
    back: Notify,
    lost: AtomicUsize,
    /// Buffers out on posted receives.
    lent: AtomicUsize,
    /// The provider's registration (dropped after the buffers above).
    keep: Box<dyn Any + Send + Sync>,
}

/// The buffers ready to hand out, and how many `get`s wait for one:
/// counted under the same lock as the list, so that a return sees a
/// waiter that found the list empty, and only then wakes one (a
/// `Notify` without waiters still costs its state's atomics every time).
struct Free {
    /// Each with the spare `Vec` its posted receives travel in.
    bufs: Vec<(BytesMut, Vec<BytesMut>)>,
    waiting: usize,
}

/// A `get` counted among the waiters until it ends (with a buffer, an
/// error, or dropped).
struct Waiting<'a>(&'a PoolInner);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut g = self.0.free.lock();
        g.waiting = g.waiting.saturating_sub(1);
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("size", &self.inner.size)
            .field("desc", &self.inner.desc)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Domain {
    /// Opens a pool of `count` buffers of `size` bytes each, registered
    /// once for every endpoint of this domain (`fi_mr_desc` semantics: the
    /// buffers carry the registration's local descriptor). `Inval` for
    /// no buffers, empty ones or more than [`MAX_POOL_BUFS`]; `NoMem` past
    /// 1 GiB in all or when the device refuses to register that much
    /// (verbs: the locked-memory limit).
    pub fn buffer_pool(&self, count: usize, size: usize) -> Result<BufferPool> {
        if count > MAX_POOL_BUFS {
            return Err(Error::Inval);
        }
        let _rt = self.rt().enter();
        let mem = match &self.inner.prov {
            Some(p) => p.pool_alloc(count, size)?,
            None => weft_core::pool::PoolMemory::plain(count, size)?,
        };
        let slots = Slots::of(&mem.bufs, size)?;
        let count = mem.bufs.len();
        Ok(BufferPool {
            inner: Arc::new(PoolInner {
                domain: self.fid(),
                size,
                count,
                desc: mem.desc,
                slots,
                free: FastMutex::new(Free {
                    bufs: mem.bufs.into_iter().map(|b| (b, Vec::new())).collect(),
                    waiting: 0,
                }),
                back: Notify::new(),
                lost: AtomicUsize::new(0),
                lent: AtomicUsize::new(0),
                keep: mem.keep,
            }),
        })
    }
}

impl BufferPool {
    /// A buffer, or `Again` when all are in use (`NoBufs` when every
    /// buffer was lost). Its length is the pool's buffer size; its bytes
    /// are what its last user left.
    pub fn try_get(&self) -> Result<PoolBuf> {
        self.inner.take()
    }

    /// A buffer, waiting for one to come back when all are in use
    /// (waiters are woken in the order they came; a `try_get` may take a
    /// returned buffer first, and the waiter woken for it waits on).
    /// `NoBufs` when every buffer was lost.
    pub async fn get(&self) -> Result<PoolBuf> {
        // Mostly one is free: taken without building the wait.
        match self.inner.take() {
            Err(Error::Again) => {}
            r => return r,
        }
        let mut counted = None;
        loop {
            let back = self.inner.back.notified();
            tokio::pin!(back);
            // In line before looking again: a buffer returned between the
            // look and the wait wakes this one.
            back.as_mut().enable();
            {
                let mut g = self.inner.free.lock();
                if let Some((buf, iov)) = g.bufs.pop() {
                    drop(g);
                    return Ok(self.inner.hand_out(buf, iov));
                }
                if self.inner.all_lost() {
                    return Err(Error::NoBufs);
                }
                if counted.is_none() {
                    // Under the lock a return takes: it sees this waiter.
                    g.waiting += 1;
                    counted = Some(Waiting(&self.inner));
                }
            }
            back.await;
        }
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.size
    }

    /// The local descriptor of the pool's memory (`fi_mr_desc`): the
    /// registration's local key on verbs, 0 where nothing is registered.
    pub fn desc(&self) -> u64 {
        self.inner.desc
    }

    /// The object id of the domain the pool belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.inner.domain
    }

    /// Buffers free, lost and lent now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            count: self.inner.count,
            free: self.inner.free.lock().bufs.len(),
            lost: self.inner.lost.load(Ordering::Acquire),
            lent: self.inner.lent.load(Ordering::Acquire),
        }
    }

    /// The buffer of this pool that a posted pool receive's completion
    /// carries in `bufs` (a `CqEntry`'s or a `CqErrEntry`'s), taken out
    /// of them as a `PoolBuf` holding what arrived. `None` when `bufs`
    /// hold no buffer of this pool. When they hold just that buffer, the
    /// `Vec` goes with it (`bufs` is left empty, unallocated), for its
    /// next posted receive: the receive path then allocates nothing.
    pub fn reclaim(&self, bufs: &mut Vec<BytesMut>) -> Option<PoolBuf> {
        let (buf, iov) = match bufs.as_slice() {
            [one] if self.inner.slots.index(one).is_some() => {
                let mut iov = std::mem::take(bufs);
                (iov.pop()?, iov)
            }
            _ => {
                let i = bufs
                    .iter()
                    .position(|b| self.inner.slots.index(b).is_some())?;
                (bufs.remove(i), Vec::new())
            }
        };
        self.end_lend();
        Some(PoolBuf::new(buf, iov, self.inner.clone()))
    }

    /// A posted receive's buffer that the provider did not hand back:
    /// lost.
    pub(crate) fn lose_lent(&self) {
        self.end_lend();
        self.inner.lose();
    }

    fn end_lend(&self) {
        // Only a posted receive lets a pool's buffer out as a `BytesMut`,
        // and one view of a slot exists at a time: this is that lend
        // ending, so the count is above zero (one atomic, not a
        // compare-and-swap loop: this is on every pool receive).
        let before = self.inner.lent.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a lend ended that did not begin");
    }
}

impl PoolInner {
    /// A free buffer at its full size; `Again` when none is free,
    /// `NoBufs` when every buffer was lost.
    fn take(self: &Arc<Self>) -> Result<PoolBuf> {
        let Some((buf, iov)) = self.free.lock().bufs.pop() else {
            return Err(if self.all_lost() {
                Error::NoBufs
            } else {
                Error::Again
            });
        };
        Ok(self.hand_out(buf, iov))
    }

    fn all_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) >= self.count
    }

    /// A buffer taken from the free list, at its full size.
    fn hand_out(self: &Arc<Self>, mut buf: BytesMut, iov: Vec<BytesMut>) -> PoolBuf {
        // Within the buffer's own capacity: no allocation, and zeroes
        // only what a short receive left out.
        if buf.len() != self.size {
            buf.resize(self.size, 0);
        }
        PoolBuf::new(buf, iov, self.clone())
    }

    /// Takes back one of its buffers: a `PoolBuf`'s or a `PoolSend`'s,
    /// whose `BytesMut` no one else can reach or swap, so it is one of
    /// the pool's slots (`reclaim` and `Lent::restore` checked that
    /// before making the `PoolBuf`): no check here.
    fn put(&self, buf: BytesMut, iov: Vec<BytesMut>) {
        debug_assert!(self.slots.index(&buf).is_some());
        let mut g = self.free.lock();
        g.bufs.push((buf, iov));
        let wake = g.waiting > 0;
        drop(g);
        if wake {
            self.back.notify_one();
        }
    }

    fn lose(&self) {
        let lost = self.lost.fetch_add(1, Ordering::AcqRel) + 1;
        tracing::warn!(lost, "pool buffer discarded with its operation");
        if lost >= self.count {
            self.back.notify_waiters();
        }
    }
}

impl PoolHome for PoolInner {
    fn put_back(&self, mut buf: Vec<BytesMut>) {
        match buf.pop() {
            Some(b) => self.put(b, buf),
            // Not made by `PoolBuf::into_send`: nothing to take back.
            None => self.lose(),
        }
    }

    fn registration(&self) -> &(dyn Any + Send + Sync) {
        &*self.keep
    }
}

/// A buffer of a [`BufferPool`]: owned, filled through `&mut [u8]`, and
/// back in its pool when dropped. Its length is at most the pool's buffer
/// size ([`set_len`](Self::set_len)); a receive or read cuts it to the
/// bytes that arrived.
pub struct PoolBuf(
    /// `None` once lent to an operation or a send: the consuming methods
    /// move it out whole, so the `PoolBuf` left behind has nothing to
    /// drop (no emptied fields to put back or free). Never `None` in the
    /// caller's hands.
    Option<Slot>,
);

/// What a `PoolBuf` holds.
struct Slot {
    buf: BytesMut,
    /// Empty; the `Vec` a posted receive takes the buffer in (kept with
    /// the buffer, so that posting allocates none).
    iov: Vec<BytesMut>,
    pool: Arc<PoolInner>,
}

impl fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("len", &self.len())
            .field("desc", &self.desc())
            .finish()
    }
}

impl PoolBuf {
    fn new(buf: BytesMut, iov: Vec<BytesMut>, pool: Arc<PoolInner>) -> PoolBuf {
        PoolBuf(Some(Slot { buf, iov, pool }))
    }

    /// The local descriptor of its pool (`fi_mr_desc`).
    pub fn desc(&self) -> u64 {
        self.0.as_ref().map_or(0, |s| s.pool.desc)
    }

    /// The pool's buffer size: the most [`set_len`](Self::set_len) takes.
    pub fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.pool.size)
    }

    /// The object id of the domain its pool belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.0.as_ref().map_or(0, |s| s.pool.domain)
    }

    /// Makes the buffer `len` bytes long (new bytes are zero). `Inval`
    /// past [`capacity`](Self::capacity).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        match &mut self.0 {
            Some(s) if len <= s.pool.size => {
                // Within the buffer's capacity: never reallocates.
                s.buf.resize(len, 0);
                Ok(())
            }
            _ => Err(Error::Inval),
        }
    }

    /// The buffer as shared, read-only `Bytes` for sends and RMA writes
    /// (any endpoint call that takes `Bytes`): no copy, and the buffer
    /// goes back to its pool when the last clone is dropped — when the
    /// operation that holds it ends, on success, failure or close alike.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }

    /// The buffer as a send's payload that the provider reads where it
    /// is ([`SendReq::pool`](weft_core::provider::SendReq::pool)); back in
    /// the pool when the provider drops it. Allocates nothing.
    pub(crate) fn into_send(mut self) -> Option<PoolSend> {
        let Slot { buf, iov, pool } = self.0.take()?;
        Some(PoolSend::new(buf, iov, pool))
    }

    /// The buffer itself for a posted receive (in its `Vec`), and its
    /// pool, which takes
    /// it back from the completion ([`BufferPool::reclaim`]); lent until
    /// then.
    pub(crate) fn lend_posted(mut self) -> Option<(Vec<BytesMut>, BufferPool)> {
        let Slot {
            buf,
            mut iov,
            pool: inner,
        } = self.0.take()?;
        inner.lent.fetch_add(1, Ordering::AcqRel);
        iov.clear();
        iov.push(buf);
        Some((iov, BufferPool { inner }))
    }

    /// The buffer itself, for an operation that gives it back, and the
    /// claim that returns it to the pool then.
    pub(crate) fn lend(mut self) -> (BytesMut, Lent) {
        match self.0.take() {
            Some(Slot { buf, iov: _, pool }) => (buf, Lent { pool: Some(pool) }),
            None => (BytesMut::new(), Lent { pool: None }),
        }
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |s| &s.buf[..])
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_mut().map_or(&mut [], |s| &mut s.buf[..])
    }
}

impl Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes_mut()
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl AsMut<[u8]> for PoolBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.bytes_mut()
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if let Some(Slot { buf, iov, pool }) = self.0.take() {
            pool.put(buf, iov);
        }
    }
}

/// A pool buffer out on an operation: the way back to the pool. Dropped
/// without [`restore`](Self::restore), the buffer counts as lost.
pub(crate) struct Lent {
    pool: Option<Arc<PoolInner>>,
}

impl Lent {
    /// The buffer back from the operation (the first of `bufs`; an
    /// operation on one buffer gives back just that one) as a `PoolBuf`,
    /// or `None` when it did not come back (then counted as lost).
    pub(crate) fn restore(mut self, bufs: Vec<BytesMut>) -> Option<PoolBuf> {
        let pool = self.pool.take()?;
        let mut bufs = bufs.into_iter();
        let Some(buf) = bufs.next() else {
            pool.lose();
            return None;
        };
        if pool.slots.index(&buf).is_none() {
            pool.lose();
            return None;
        }
        Some(PoolBuf::new(buf, Vec::new(), pool))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(p) = self.pool.take() {
            p.lose();
        }
    }
}
