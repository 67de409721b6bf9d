//! What the API posts to a provider: sends, receives and one-sided
//! operations, each with the completion it ends through.

use std::fmt::Debug;

use bytes::{Bytes, BytesMut};

use crate::addr::FiAddr;
use crate::completion::OpDone;
use crate::error::{Error, Result};
use crate::flags::OpFlags;

/// The buffers of a send. One or two live inline: the common send of one
/// buffer allocates nothing for its list.
pub type Iov = smallvec::SmallVec<[Bytes; 2]>;

/// The list of a single buffer.
pub fn iov1(b: Bytes) -> Iov {
    let mut v = Iov::new();
    v.push(b);
    v
}

/// A send to post: message or tagged, one or more buffers.
#[derive(Debug)]
pub struct SendReq {
    /// Destination (ignored by connected endpoints).
    pub dest: FiAddr,
    /// The message, gathered from these buffers in order (empty when
    /// `pool` holds it).
    pub iov: Iov,
    /// The message as one pool buffer instead of `iov`: only for
    /// endpoints whose [`takes_pool_sends`](super::ProviderEndpoint::takes_pool_sends)
    /// says so; `None` for every other send.
    pub pool: Option<super::PoolSend>,
    /// `Some(tag)` for a tagged send.
    pub tag: Option<u64>,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// Operation flags (`INJECT`, `DELIVERY_COMPLETE`, ...).
    pub flags: OpFlags,
    /// Where the completion goes.
    pub done: OpDone,
}

impl SendReq {
    /// Total message length. One buffer, the usual case, is read without
    /// the summing loop (a dozen instructions a send).
    #[inline]
    pub fn len(&self) -> usize {
        if let Some(p) = &self.pool {
            return p.len();
        }
        if let [b] = self.iov.as_slice() {
            return b.len();
        }
        self.iov.iter().map(|b| b.len()).sum()
    }

    /// True for a zero-length message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive to post.
#[derive(Debug)]
pub struct RecvReq {
    /// Source filter (`FI_ADDR_UNSPEC` = any; needs `FI_DIRECTED_RECV`).
    pub src: FiAddr,
    /// Buffers filled in order; each one's `len()` is its capacity for this
    /// receive (the completion truncates them to what arrived).
    pub bufs: Vec<BytesMut>,
    /// Tagged receive.
    pub tagged: bool,
    /// Tag to match.
    pub tag: u64,
    /// Tag bits to ignore.
    pub ignore: u64,
    /// Operation flags (`PEEK`, `CLAIM`, `DISCARD`, `MULTI_RECV`, ...).
    pub flags: OpFlags,
    /// Where the completion goes.
    pub done: OpDone,
    /// A multi-receive buffer (`FI_MULTI_RECV`), or the part of one a
    /// message was matched to; `None` for every other receive. Set by
    /// [`multi_recv::attach`](crate::multi_recv::attach).
    pub multi: Option<crate::multi_recv::MultiPart>,
}

impl RecvReq {
    /// Total buffer capacity; one buffer without the summing loop, as
    /// [`SendReq::len`].
    #[inline]
    pub fn capacity(&self) -> usize {
        if let [b] = self.bufs.as_slice() {
            return b.len();
        }
        self.bufs.iter().map(|b| b.len()).sum()
    }

    /// Whether nothing is left in this request that owns a resource:
    /// what [`deliver_in`](crate::recv_completion::deliver_in) leaves,
    /// which its callers forget instead of dropping (they assert this in
    /// debug builds).
    pub fn owns_nothing(&self) -> bool {
        self.bufs.capacity() == 0
            && self.multi.is_none()
            && self.done.cq.is_none()
            && self.done.cntr.is_none()
            && self.done.waiter.is_none()
    }
}

/// What an RMA operation moves, and where the local side of it lives.
#[derive(Debug)]
pub enum RmaOp {
    /// `fi_write` / `fi_writedata`.
    Write {
        /// The bytes written, gathered in order.
        iov: Vec<Bytes>,
        /// Remote CQ data reported at the target (`fi_writedata`).
        data: Option<u64>,
    },
    /// `fi_read`.
    Read {
        /// Filled in order, each up to its `len()`; the completion gives
        /// them back.
        bufs: Vec<BytesMut>,
    },
    /// `fi_atomic` / `fi_fetch_atomic` / `fi_compare_atomic`.
    Atomic(Atomic),
}

/// An atomic operation on an array of `count` elements of a peer's
/// memory (fi_atomic(3)). Operands are in host byte order, as in memory.
#[derive(Debug)]
pub struct Atomic {
    /// The operation.
    pub op: crate::atomic::AtomicOp,
    /// The element type.
    pub datatype: crate::atomic::Datatype,
    /// Which call: plain, fetching or compare.
    pub kind: crate::atomic::AtomicKind,
    /// Elements.
    pub count: usize,
    /// `count` operands (empty for `FI_ATOMIC_READ`).
    pub operand: Bytes,
    /// `count` compare values for the compare form (the mask of
    /// `FI_MSWAP`), else empty.
    pub compare: Bytes,
}

impl Atomic {
    /// Bytes of the target's memory it touches.
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(self.datatype.size())
    }

    /// Its shape, given the provider's count `limit` for it: `1..=limit`
    /// elements (`Inval` for none, `MsgSize` past the limit), `count`
    /// operands (or none for `FI_ATOMIC_READ`) and `count` compare values
    /// in the compare form only (`Inval`).
    pub fn check_shape(&self, limit: usize) -> Result<()> {
        use crate::atomic::{AtomicKind, AtomicOp};
        if self.count == 0 {
            return Err(Error::Inval);
        }
        if self.count > limit {
            return Err(Error::MsgSize);
        }
        let n = self.bytes();
        let operand =
            self.operand.len() == n || (self.op == AtomicOp::Read && self.operand.is_empty());
        let compare = if self.kind == AtomicKind::Compare {
            self.compare.len() == n
        } else {
            self.compare.is_empty()
        };
        if operand && compare {
            Ok(())
        } else {
            Err(Error::Inval)
        }
    }
}

impl RmaOp {
    /// The completion flags of the operation: `RMA | WRITE`, `RMA | READ`,
    /// `ATOMIC | WRITE` (`fi_atomic`) or `ATOMIC | READ` (the fetching
    /// and compare forms).
    pub fn flags(&self) -> OpFlags {
        match self {
            RmaOp::Write { .. } => OpFlags::RMA | OpFlags::WRITE,
            RmaOp::Read { .. } => OpFlags::RMA | OpFlags::READ,
            RmaOp::Atomic(a) if !a.kind.fetches() => OpFlags::ATOMIC | OpFlags::WRITE,
            RmaOp::Atomic(_) => OpFlags::ATOMIC | OpFlags::READ,
        }
    }
}

/// An RMA or atomic operation to post against a peer's memory region.
#[derive(Debug)]
pub struct RmaReq {
    /// Target (ignored by connected endpoints).
    pub dest: FiAddr,
    /// The operation and its local buffers.
    pub op: RmaOp,
    /// Target address: a virtual address inside the remote region
    /// (`FI_MR_VIRT_ADDR`).
    pub addr: u64,
    /// The remote region's key.
    pub key: u64,
    /// Operation flags (`DELIVERY_COMPLETE`, `REMOTE_CQ_DATA`, ...).
    pub flags: OpFlags,
    /// Where the completion goes.
    pub done: OpDone,
}

impl RmaReq {
    /// Bytes moved.
    pub fn len(&self) -> usize {
        match &self.op {
            RmaOp::Write { iov, .. } => iov.iter().map(|b| b.len()).sum(),
            RmaOp::Read { bufs } => bufs.iter().map(|b| b.len()).sum(),
            RmaOp::Atomic(a) => a.bytes(),
        }
    }

    /// True when nothing is moved.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
