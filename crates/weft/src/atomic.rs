//! Atomics on a peer's registered memory (fi_atomic(3)): `fi_atomic`,
//! `fi_fetch_atomic`, `fi_compare_atomic` on arrays of elements, and the
//! `*atomicvalid` queries that say which combinations a provider
//! executes.
//!
//! Operands and fetched values are arrays of the datatype's elements in
//! host byte order (as `to_ne_bytes` lays them out). What each provider
//! supports: tcp, every operation on every integer type, `FLOAT` and
//! `DOUBLE` where libfabric defines it (complex and `long double` types
//! are `OpNotSupp`); verbs, `FI_SUM` with fetch and `FI_CSWAP` on one
//! `UINT64`.

use bytes::{Bytes, BytesMut};
use weft_core::addr::FiAddr;
use weft_core::atomic::{AtomicKind, AtomicOp, Datatype};
use weft_core::completion::{CqEntry, CqErrEntry};
use weft_core::flags::{Caps, OpFlags};
use weft_core::provider::{Atomic, RmaOp};
use weft_core::{Error, Result};

use crate::endpoint::Endpoint;
use crate::rma::rma;

impl Endpoint {
    /// `fi_atomicvalid`: the most elements one `fi_atomic` of `op` on
    /// `datatype` may carry. `NoSys` without `FI_ATOMIC` (and
    /// `FI_WRITE`, when the caps name a direction) in the endpoint's
    /// caps or on a provider without atomics; `OpNotSupp` for a
    /// combination the provider does not execute (or libfabric does not
    /// define).
    pub fn atomicvalid(&self, op: AtomicOp, datatype: Datatype) -> Result<usize> {
        self.atomic_valid(AtomicKind::Plain, op, datatype)
    }

    /// `fi_fetch_atomicvalid`: as [`atomicvalid`](Self::atomicvalid),
    /// for `fi_fetch_atomic` (which needs `FI_READ` in directed caps).
    pub fn fetch_atomicvalid(&self, op: AtomicOp, datatype: Datatype) -> Result<usize> {
        self.atomic_valid(AtomicKind::Fetch, op, datatype)
    }

    /// `fi_compare_atomicvalid`: as [`atomicvalid`](Self::atomicvalid),
    /// for `fi_compare_atomic`.
    pub fn compare_atomicvalid(&self, op: AtomicOp, datatype: Datatype) -> Result<usize> {
        self.atomic_valid(AtomicKind::Compare, op, datatype)
    }

    fn atomic_valid(&self, kind: AtomicKind, op: AtomicOp, datatype: Datatype) -> Result<usize> {
        let live = self.live()?;
        let caps = self.info().caps;
        let dir = if kind.fetches() {
            Caps::READ
        } else {
            Caps::WRITE
        };
        // ATOMIC without READ or WRITE means both (fi_getinfo(3)).
        let rw = Caps::READ | Caps::WRITE;
        if !caps.contains(Caps::ATOMIC) || (caps.intersects(rw) && !caps.contains(dir)) {
            return Err(Error::NoSys);
        }
        live.prov.atomic_valid(kind, op, datatype)
    }

    /// The checks an atomic gets before it is posted: a supported
    /// combination, `1..=limit` elements (`Inval` for none, `MsgSize`
    /// past the limit), operand and compare arrays of `count` elements
    /// (`FI_ATOMIC_READ` may leave its operand empty; compare only in
    /// the compare form), and a target address aligned to the element
    /// size (`Inval`).
    pub(crate) fn check_atomic(&self, a: &Atomic, addr: u64) -> Result<()> {
        let limit = self.atomic_valid(a.kind, a.op, a.datatype)?;
        a.check_shape(limit)?;
        if addr % a.datatype.size() as u64 != 0 {
            return Err(Error::Inval);
        }
        Ok(())
    }

    async fn atomic_op(
        &self,
        dest: FiAddr,
        a: Atomic,
        addr: u64,
        key: u64,
    ) -> std::result::Result<CqEntry, CqErrEntry> {
        self.rmamsg(rma(dest, RmaOp::Atomic(a), addr, key, 0), OpFlags::empty())
            .await
    }

    /// `fi_atomic`: applies `op` to the `operand.len() / size` elements
    /// of `datatype` at `addr` (aligned to the element size) of the
    /// peer's region under `key`, and resolves with the completion once
    /// the target has applied it (or refused: `Access` for a bad key,
    /// range or rights, and the memory is untouched).
    pub async fn atomic(
        &self,
        dest: FiAddr,
        op: AtomicOp,
        datatype: Datatype,
        operand: Bytes,
        addr: u64,
        key: u64,
    ) -> std::result::Result<CqEntry, CqErrEntry> {
        let a = Atomic {
            op,
            datatype,
            kind: AtomicKind::Plain,
            count: count_of(&operand, datatype),
            operand,
            compare: Bytes::new(),
        };
        self.atomic_op(dest, a, addr, key).await
    }

    /// `fi_fetch_atomic`: as [`atomic`](Self::atomic) on `count`
    /// elements (`operand` holds `count` of them, or nothing for
    /// `FI_ATOMIC_READ`), resolving with the values before.
    #[allow(clippy::too_many_arguments)]
    pub async fn fetch_atomic(
        &self,
        dest: FiAddr,
        op: AtomicOp,
        datatype: Datatype,
        count: usize,
        operand: Bytes,
        addr: u64,
        key: u64,
    ) -> std::result::Result<BytesMut, CqErrEntry> {
        let a = Atomic {
            op,
            datatype,
            kind: AtomicKind::Fetch,
            count,
            operand,
            compare: Bytes::new(),
        };
        old_values(
            self.atomic_op(dest, a, addr, key).await,
            count * datatype.size(),
        )
    }

    /// `fi_compare_atomic`: one of the `FI_CSWAP*` operations (or
    /// `FI_MSWAP`, whose `compare` is the mask) on `operand.len() / size`
    /// elements, resolving with the values before.
    #[allow(clippy::too_many_arguments)]
    pub async fn compare_atomic(
        &self,
        dest: FiAddr,
        op: AtomicOp,
        datatype: Datatype,
        operand: Bytes,
        compare: Bytes,
        addr: u64,
        key: u64,
    ) -> std::result::Result<BytesMut, CqErrEntry> {
        let count = count_of(&operand, datatype);
        let a = Atomic {
            op,
            datatype,
            kind: AtomicKind::Compare,
            count,
            operand,
            compare,
        };
        old_values(
            self.atomic_op(dest, a, addr, key).await,
            count * datatype.size(),
        )
    }

    /// `fi_fetch_atomic` with `FI_SUM` on one `u64` at `addr` (8-byte
    /// aligned): adds `add` (wrapping) and resolves with the value
    /// before.
    pub async fn fetch_add(
        &self,
        dest: FiAddr,
        addr: u64,
        key: u64,
        add: u64,
    ) -> std::result::Result<u64, CqErrEntry> {
        let operand = Bytes::copy_from_slice(&add.to_ne_bytes());
        let old = self
            .fetch_atomic(dest, AtomicOp::Sum, Datatype::U64, 1, operand, addr, key)
            .await?;
        Ok(first_u64(&old))
    }

    /// `fi_compare_atomic` with `FI_CSWAP` on one `u64` at `addr`
    /// (8-byte aligned): writes `swap` if the value is `compare`, and
    /// resolves with the value before either way (equal to `compare`
    /// when it swapped).
    pub async fn compare_swap(
        &self,
        dest: FiAddr,
        addr: u64,
        key: u64,
        compare: u64,
        swap: u64,
    ) -> std::result::Result<u64, CqErrEntry> {
        let old = self
            .compare_atomic(
                dest,
                AtomicOp::Cswap,
                Datatype::U64,
                Bytes::copy_from_slice(&swap.to_ne_bytes()),
                Bytes::copy_from_slice(&compare.to_ne_bytes()),
                addr,
                key,
            )
            .await?;
        Ok(first_u64(&old))
    }
}

/// Elements in `b`; a length that is not whole elements gives a count
/// the checks refuse (`Inval`: the operand no longer matches it).
fn count_of(b: &Bytes, dt: Datatype) -> usize {
    if b.len() % dt.size() == 0 {
        b.len() / dt.size()
    } else {
        b.len() / dt.size() + 1
    }
}

/// The values a fetching atomic returned: its completion's first buffer,
/// which holds at least `len` bytes (`Io` otherwise).
fn old_values(
    r: std::result::Result<CqEntry, CqErrEntry>,
    len: usize,
) -> std::result::Result<BytesMut, CqErrEntry> {
    let mut e = r?;
    if e.bufs.first().is_some_and(|b| b.len() >= len) {
        let mut b = e.bufs.swap_remove(0);
        b.truncate(len);
        return Ok(b);
    }
    let mut err = CqErrEntry::new(e.context, e.flags, Error::Io);
    err.bufs = e.bufs;
    Err(err)
}

fn first_u64(b: &[u8]) -> u64 {
    let mut x = [0u8; 8];
    let n = b.len().min(8);
    x[..n].copy_from_slice(&b[..n]);
    u64::from_ne_bytes(x)
}
