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
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;
use weft_core::pool::Slots;
use weft_core::sync::lock;
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
    /// Each with the spare `Vec` its posted receives travel in.
    free: Mutex<Vec<(BytesMut, Vec<BytesMut>)>>,
    /// Wakes a `get` waiting for a buffer (once per buffer returned, all
    /// of them when every buffer is lost). Not a semaphore: its permits
    /// cost a lock at every return, waiters or not (about 80
    /// instructions a message of a pool ping-pong).
    back: Notify,
    lost: AtomicUsize,
    /// Buffers out on posted receives.
    lent: AtomicUsize,
    /// The provider's registration (dropped after the buffers above).
    _keep: Box<dyn Any + Send + Sync>,
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
                free: Mutex::new(mem.bufs.into_iter().map(|b| (b, Vec::new())).collect()),
                back: Notify::new(),
                lost: AtomicUsize::new(0),
                lent: AtomicUsize::new(0),
                _keep: mem.keep,
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
        loop {
            let back = self.inner.back.notified();
            tokio::pin!(back);
            // In line before looking again: a buffer returned between the
            // look and the wait wakes this one.
            back.as_mut().enable();
            match self.inner.take() {
                Err(Error::Again) => back.await,
                r => return r,
            }
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
            free: lock(&self.inner.free).len(),
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
        Some(PoolBuf {
            buf,
            iov,
            pool: self.inner.clone(),
            armed: true,
        })
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
        // ending. Saturating all the same: a count is not worth a panic.
        let _ = self
            .inner
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(1))
            });
    }
}

impl PoolInner {
    /// A free buffer at its full size; `Again` when none is free,
    /// `NoBufs` when every buffer was lost.
    fn take(self: &Arc<Self>) -> Result<PoolBuf> {
        let Some((mut buf, iov)) = lock(&self.free).pop() else {
            return Err(if self.lost.load(Ordering::Acquire) >= self.count {
                Error::NoBufs
            } else {
                Error::Again
            });
        };
        // Within the buffer's own capacity: no allocation, and zeroes
        // only what a short receive left out.
        buf.resize(self.size, 0);
        Ok(PoolBuf {
            buf,
            iov,
            pool: self.clone(),
            armed: true,
        })
    }

    /// Takes back one of its buffers (anything else counts as a lost
    /// buffer: the pool's own never left its operation).
    fn put(&self, buf: BytesMut, iov: Vec<BytesMut>) {
        if self.slots.index(&buf).is_some() {
            lock(&self.free).push((buf, iov));
            self.back.notify_one();
        } else {
            self.lose();
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

/// A buffer of a [`BufferPool`]: owned, filled through `&mut [u8]`, and
/// back in its pool when dropped. Its length is at most the pool's buffer
/// size ([`set_len`](Self::set_len)); a receive or read cuts it to the
/// bytes that arrived.
pub struct PoolBuf {
    buf: BytesMut,
    /// Empty; the `Vec` a posted receive takes the buffer in (kept with
    /// the buffer, so that posting allocates none).
    iov: Vec<BytesMut>,
    pool: Arc<PoolInner>,
    /// False once lent to an operation (the buffer travels without it).
    armed: bool,
}

impl fmt::Debug for PoolBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuf")
            .field("len", &self.buf.len())
            .field("desc", &self.pool.desc)
            .finish()
    }
}

impl PoolBuf {
    /// The local descriptor of its pool (`fi_mr_desc`).
    pub fn desc(&self) -> u64 {
        self.pool.desc
    }

    /// The pool's buffer size: the most [`set_len`](Self::set_len) takes.
    pub fn capacity(&self) -> usize {
        self.pool.size
    }

    /// The object id of the domain its pool belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.pool.domain
    }

    /// Makes the buffer `len` bytes long (new bytes are zero). `Inval`
    /// past [`capacity`](Self::capacity).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.pool.size {
            return Err(Error::Inval);
        }
        // Within the buffer's capacity: never reallocates.
        self.buf.resize(len, 0);
        Ok(())
    }

    /// The buffer as shared, read-only `Bytes` for sends and RMA writes
    /// (any endpoint call that takes `Bytes`): no copy, and the buffer
    /// goes back to its pool when the last clone is dropped — when the
    /// operation that holds it ends, on success, failure or close alike.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }

    /// The buffer itself for a posted receive (in its `Vec`), and its
    /// pool, which takes
    /// it back from the completion ([`BufferPool::reclaim`]); lent until
    /// then.
    pub(crate) fn lend_posted(mut self) -> (Vec<BytesMut>, BufferPool) {
        self.armed = false;
        self.pool.lent.fetch_add(1, Ordering::AcqRel);
        let mut iov = std::mem::take(&mut self.iov);
        iov.clear();
        iov.push(std::mem::take(&mut self.buf));
        let pool = BufferPool {
            inner: self.pool.clone(),
        };
        (iov, pool)
    }

    /// The buffer itself, for an operation that gives it back, and the
    /// claim that returns it to the pool then.
    pub(crate) fn lend(mut self) -> (BytesMut, Lent) {
        self.armed = false;
        let buf = std::mem::take(&mut self.buf);
        let lent = Lent {
            pool: Some(self.pool.clone()),
        };
        (buf, lent)
    }
}

impl Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl AsRef<[u8]> for PoolBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl AsMut<[u8]> for PoolBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if self.armed {
            self.pool
                .put(std::mem::take(&mut self.buf), std::mem::take(&mut self.iov));
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
        Some(PoolBuf {
            buf,
            iov: Vec::new(),
            pool,
            armed: true,
        })
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(p) = self.pool.take() {
            p.lose();
        }
    }
}
