//! The registration an operation's local bytes go to the device under:
//! the region of the buffer pool they belong to (registered once, when
//! the pool was made: nothing to do per operation), or one of their own
//! (a send source from the registration cache, a receive target
//! registered for this one use).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::Error;

use crate::sys::{AccessFlags, BytesMr, BytesMutMr, PoolMr, ProtectionDomain, Sge};

/// A send or RDMA-write source, registered.
pub(crate) enum Src {
    /// Registered on its own (or found in the registration cache).
    Mr(Arc<BytesMr>),
    /// A pool buffer, held until the operation ends.
    Pool(Arc<PoolMr>, Bytes),
}

impl Src {
    /// `buf`'s pool registration on `pd`, if it is a pool buffer.
    pub(crate) fn pooled(pd: &ProtectionDomain, buf: &Bytes) -> Option<Src> {
        pd.pool_for(buf.as_ptr() as usize, buf.len())
            .map(|p| Src::Pool(p, buf.clone()))
    }

    /// The whole source as one element.
    pub(crate) fn sge(&self) -> Result<Sge<'_>, Error> {
        match self {
            Src::Mr(m) => m.sge(),
            Src::Pool(p, b) => p.sge_of(b),
        }
    }
}

/// A receive or RDMA-read target, registered; the buffer comes back by
/// [`into_inner`](Dst::into_inner) once the device is done with it.
pub(crate) enum Dst {
    /// Registered for this one use.
    Mr(BytesMutMr),
    /// A pool buffer.
    Pool(Arc<PoolMr>, BytesMut),
}

impl Dst {
    /// `buf` for the device to write: under its pool's key if it is a
    /// pool buffer on `pd`, else registered with `access`.
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        buf: BytesMut,
        access: AccessFlags,
    ) -> Result<Dst, Error> {
        match pd.pool_for(buf.as_ptr() as usize, buf.len()) {
            Some(p) => Ok(Dst::Pool(p, buf)),
            None => BytesMutMr::new(pd, buf, access).map(Dst::Mr),
        }
    }

    /// Bytes the device may write.
    pub(crate) fn len(&self) -> usize {
        match self {
            Dst::Mr(m) => m.len(),
            Dst::Pool(_, b) => b.len(),
        }
    }

    /// True for an empty target.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole target as one element.
    pub(crate) fn sge(&self) -> Result<Sge<'_>, Error> {
        match self {
            Dst::Mr(m) => m.sge(),
            Dst::Pool(p, b) => p.sge_of(b),
        }
    }

    /// `offset..offset + len` of the target as one element.
    pub(crate) fn sge_range(&self, offset: usize, len: usize) -> Result<Sge<'_>, Error> {
        match self {
            Dst::Mr(m) => m.sge_range(offset, len),
            Dst::Pool(p, b) => {
                let l32 = u32::try_from(len).map_err(|_| Error::MsgSize)?;
                let o32 = u32::try_from(offset).map_err(|_| Error::MsgSize)?;
                p.sge_of(b)?.slice(o32, l32)
            }
        }
    }

    /// The buffer back (a registration of its own deregistered first; if
    /// that fails the buffer is leaked, never freed under the device).
    pub(crate) fn into_inner(self) -> Result<BytesMut, Error> {
        match self {
            Dst::Mr(m) => m.into_inner(),
            Dst::Pool(_, b) => Ok(b),
        }
    }
}

/// Whether every non-empty buffer of `bufs` is a pool buffer on `pd`: then
/// the device reads or writes them where they are, and a bounce slot
/// would only add a copy.
pub(crate) fn all_pooled<B: std::ops::Deref<Target = [u8]>>(
    pd: &ProtectionDomain,
    bufs: &[B],
) -> bool {
    bufs.iter().any(|b| !b.is_empty())
        && bufs
            .iter()
            .all(|b| b.is_empty() || pd.pool_for(b.as_ptr() as usize, b.len()).is_some())
}

/// A receive's registered targets: one held inline (the usual case:
/// posting it allocates nothing), several on the heap.
pub(crate) type RecvTargets = smallvec::SmallVec<[Dst; 1]>;
