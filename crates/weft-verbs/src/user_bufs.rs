//! The caller's buffers on their way to and from the device: gathered
//! into one, or registered one by one and handed back afterwards; and
//! the RMA post both endpoint types share.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use weft_core::atomic::{AtomicKind, AtomicOp, Datatype};
use weft_core::flags::OpFlags;
use weft_core::provider::{Atomic, RmaOp};
use weft_core::Error;

use crate::local_mem::{all_pooled, Dst, Src};
use crate::slot_pool::{SlotPool, SLOT};

use crate::sys::{
    AccessFlags, BytesMr, Payload, ProtectionDomain, QueuePair, SendFlags, SendOp, SendRequest, Sge,
};

/// Remote CQ data as the 32-bit immediate of a send or RDMA write
/// (`cq_data_size` 4): wider data would arrive cut short, so it is `Inval`.
pub(crate) fn imm_data(data: Option<u64>) -> Result<Option<u32>, Error> {
    data.map(|d| u32::try_from(d).map_err(|_| Error::Inval))
        .transpose()
}

/// One buffer holding `iov` in order (`len` bytes in all); no copy when
/// there is only one.
pub(crate) fn gather(iov: &[Bytes], len: usize) -> Bytes {
    match iov {
        [one] => one.clone(),
        many => {
            let mut v = BytesMut::with_capacity(len);
            for b in many {
                v.extend_from_slice(b);
            }
            v.freeze()
        }
    }
}

/// The registration of `buf` for the device to read locally (a send
/// source, an RDMA write source): its buffer pool's when it is a pool
/// buffer, else as [`cached_source`] makes it.
pub(crate) fn register_source(
    cache: Option<&Arc<SourceCache>>,
    pd: &Arc<ProtectionDomain>,
    buf: &Bytes,
) -> Result<Src, Error> {
    if let Some(src) = Src::pooled(pd, buf) {
        return Ok(src);
    }
    cached_source(cache, pd, buf, AccessFlags::NONE).map(Src::Mr)
}

/// The registration of `buf` for the device to read with `access` (also
/// a rendezvous buffer, which peers read: pools are never exposed to
/// them): from the domain's registration cache when the endpoint has it,
/// else made for this one use. A pool buffer (of any domain: one frozen
/// into `Bytes` and sent where its pool's key does not serve) is
/// registered for this one use, never cached: a cache entry would keep
/// it from its pool until evicted.
pub(crate) fn cached_source(
    cache: Option<&Arc<SourceCache>>,
    pd: &Arc<ProtectionDomain>,
    buf: &Bytes,
    access: AccessFlags,
) -> Result<Arc<BytesMr>, Error> {
    let reg = || BytesMr::new(pd, buf.clone(), access);
    let cache = cache.filter(|_| !crate::sys::in_any_pool(buf.as_ptr() as usize, buf.len()));
    match cache {
        Some(c) => c.get(source_key(buf, access), reg),
        None => reg().map(Arc::new),
    }
}

/// The cache key of `buf` registered with `access`.
fn source_key(buf: &Bytes, access: AccessFlags) -> crate::regcache::Key {
    (buf.as_ptr() as usize, buf.len(), access.bits())
}

/// The cached registration of `buf`, if the cache holds one: nothing is
/// registered on a miss.
pub(crate) fn cached_hit(
    cache: Option<&Arc<SourceCache>>,
    buf: &Bytes,
    access: AccessFlags,
) -> Option<Arc<BytesMr>> {
    cache?.peek(source_key(buf, access))
}

/// The registration cache of send sources.
pub(crate) type SourceCache = crate::regcache::RegCache<BytesMr>;

impl crate::regcache::Owns for BytesMr {
    fn only_owner(&self) -> bool {
        self.bytes().is_unique()
    }
}

/// Registers each buffer for the device to write into. On failure every
/// buffer comes back, in order, with the error.
pub(crate) fn register_targets(
    pd: &Arc<ProtectionDomain>,
    bufs: Vec<BytesMut>,
) -> Result<Vec<Dst>, (Error, Vec<BytesMut>)> {
    let mut mrs = Vec::with_capacity(bufs.len());
    let mut left = bufs.into_iter();
    for b in left.by_ref() {
        match Dst::new(pd, b, AccessFlags::LOCAL_WRITE) {
            Ok(m) => mrs.push(m),
            Err(e) => {
                let mut back = unregister(mrs);
                back.extend(left);
                return Err((e, back));
            }
        }
    }
    Ok(mrs)
}

/// The buffers back from their registrations (a buffer whose
/// deregistration fails is leaked, never freed under the device).
pub(crate) fn unregister(mrs: Vec<Dst>) -> Vec<BytesMut> {
    mrs.into_iter()
        .filter_map(|m| m.into_inner().ok())
        .collect()
}

/// [`unregister`] into `rest`, in front of what it holds (a receive's
/// own `Vec` and its zero-length buffers): no allocation when it has
/// room, as the `Vec` a receive was posted with has.
pub(crate) fn unregister_before(
    mrs: impl IntoIterator<Item = Dst>,
    mut rest: Vec<BytesMut>,
) -> Vec<BytesMut> {
    let k = rest.len();
    rest.extend(mrs.into_iter().filter_map(|m| m.into_inner().ok()));
    rest.rotate_left(k);
    rest
}

/// What keeps an RMA operation's local bytes alive while the device uses
/// them.
pub(crate) enum RmaLocal {
    /// Copied into the work request (a small write).
    Inline,
    /// A write's registered source.
    Source(#[allow(dead_code)] Src),
    /// A read's registered targets, handed back at completion.
    Targets(Vec<Dst>),
    /// A small read landing in a slot of `pool`, copied into `bufs` at
    /// completion (no registration per read).
    ReadSlot {
        loan: crate::slot_pool::Loan,
        len: usize,
        bufs: Vec<BytesMut>,
    },
}

impl RmaLocal {
    /// A read's buffers, back from their registrations or filled from
    /// their slot when the read succeeded (`ok`); none for writes.
    pub(crate) fn into_bufs(self, ok: bool) -> Vec<BytesMut> {
        match self {
            RmaLocal::Targets(mrs) => unregister(mrs),
            RmaLocal::ReadSlot {
                loan,
                len,
                mut bufs,
            } => {
                // The slot holds exactly `len` bytes, which fit the
                // buffers (checked at post).
                loan.land(ok, len, &mut bufs);
                bufs
            }
            RmaLocal::Inline | RmaLocal::Source(_) => Vec::new(),
        }
    }
}

/// Slots for small RDMA reads, per connection or endpoint: 16 of them
/// (64 KiB pinned); reads beyond them register their buffers.
pub(crate) fn read_pool(pd: &Arc<ProtectionDomain>) -> Result<Arc<SlotPool>, Error> {
    SlotPool::new(pd, 16, AccessFlags::LOCAL_WRITE).map(Arc::new)
}

/// The work request flags of an operation posted with `flags`: every
/// request is signaled, and `FI_FENCE` is `IBV_SEND_FENCE`, which holds
/// the request until the queue pair's earlier reads and atomics have
/// completed — what an RC queue pair does not order by itself (write and
/// send after read; `docs/design.md`).
pub(crate) fn wr_flags(flags: OpFlags) -> SendFlags {
    if flags.contains(OpFlags::FENCE) {
        SendFlags::SIGNALED | SendFlags::FENCE
    } else {
        SendFlags::SIGNALED
    }
}

/// Posts `op` as one RDMA write, read or 64-bit atomic on `qp` against `addr`/`rkey`:
/// writes up to `inline_max` bytes go inline, larger ones from a
/// registered copy (gathered); reads land in the caller's buffers,
/// registered. A write with `imm` is an RDMA write with immediate, which
/// also completes a receive at the target (the write's own remote CQ
/// data is not looked at here: RDM carries it in a note of its own). On
/// failure the operation comes back whole.
pub(crate) fn post_rma(
    qp: &QueuePair,
    (pd, cache, reads): (
        &Arc<ProtectionDomain>,
        Option<&Arc<SourceCache>>,
        Option<&Arc<SlotPool>>,
    ),
    inline_max: usize,
    op: RmaOp,
    (addr, rkey): (u64, u32),
    imm: Option<u32>,
    (wr_id, flags): (u64, SendFlags),
) -> Result<RmaLocal, (Error, RmaOp)> {
    let at = Posting {
        qp,
        pd,
        wr_id,
        flags,
        addr,
        rkey,
    };
    match op {
        RmaOp::Write { iov, data } => at.write(cache, inline_max, imm, iov, data),
        RmaOp::Atomic(a) => at.atomic(a),
        RmaOp::Read { bufs } => at.read(reads, bufs),
    }
}

/// Where one RMA operation is posted: the queue pair, the protection
/// domain its local memory is registered in, and the remote region.
struct Posting<'a> {
    qp: &'a QueuePair,
    pd: &'a Arc<ProtectionDomain>,
    wr_id: u64,
    /// `SIGNALED`, with `FENCE` for a fenced operation.
    flags: SendFlags,
    addr: u64,
    rkey: u32,
}

impl Posting<'_> {
    fn post(&self, op: SendOp, p: Payload<'_>) -> Result<(), Error> {
        self.qp
            .post_send(&SendRequest::new(self.wr_id, op, p).flags(self.flags))
    }

    /// An RDMA write (with immediate if `imm`): inline up to
    /// `inline_max`, else from a registered gathered copy.
    fn write(
        &self,
        cache: Option<&Arc<SourceCache>>,
        inline_max: usize,
        imm: Option<u32>,
        iov: Vec<Bytes>,
        data: Option<u64>,
    ) -> Result<RmaLocal, (Error, RmaOp)> {
        let (remote_addr, rkey) = (self.addr, self.rkey);
        let len: usize = iov.iter().map(|b| b.len()).sum();
        let wop = match imm {
            Some(imm) => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            None => SendOp::RdmaWrite { remote_addr, rkey },
        };
        let src = gather(&iov, len);
        let r = if len <= inline_max {
            self.post(wop, Payload::Inline(&src))
                .map(|()| RmaLocal::Inline)
        } else {
            register_source(cache, self.pd, &src).and_then(|mr| {
                self.post(wop, Payload::Sges(&[mr.sge()?]))
                    .map(|()| RmaLocal::Source(mr))
            })
        };
        r.map_err(|e| (e, RmaOp::Write { iov, data }))
    }

    /// A 64-bit atomic the device executes (fetch-add, compare-swap);
    /// the old value lands in an 8-byte buffer of our own.
    fn atomic(&self, a: Atomic) -> Result<RmaLocal, (Error, RmaOp)> {
        let (remote_addr, rkey) = (self.addr, self.rkey);
        let sop = match verbs_atomic(&a) {
            Some(VerbsAtomic::FetchAdd(add)) => SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
            Some(VerbsAtomic::CompareSwap { compare, swap }) => SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            },
            None => return Err((Error::OpNotSupp, RmaOp::Atomic(a))),
        };
        let mrs = match register_targets(self.pd, vec![BytesMut::zeroed(8)]) {
            Ok(m) => m,
            Err((e, _)) => return Err((e, RmaOp::Atomic(a))),
        };
        let posted = mrs
            .first()
            .ok_or(Error::Io)
            .and_then(|m| m.sge())
            .and_then(|sge| self.post(sop, Payload::Sges(&[sge])));
        match posted {
            Ok(()) => Ok(RmaLocal::Targets(mrs)),
            Err(e) => Err((e, RmaOp::Atomic(a))),
        }
    }

    /// An RDMA read: a small one into a slot of `reads` (copied out at
    /// completion), else into the caller's buffers, registered.
    fn read(
        &self,
        reads: Option<&Arc<SlotPool>>,
        bufs: Vec<BytesMut>,
    ) -> Result<RmaLocal, (Error, RmaOp)> {
        let op = || SendOp::RdmaRead {
            remote_addr: self.addr,
            rkey: self.rkey,
        };
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let slot = reads
            .filter(|_| len > 0 && len <= SLOT && !all_pooled(self.pd, &bufs))
            .and_then(|p| p.take().map(|s| (p, s)));
        if let Some((pool, slot)) = slot {
            let posted =
                pool.with(|mr| self.post(op(), Payload::Sges(&[mr.sge(pool.offset(slot), len)?])));
            return match posted {
                Ok(()) => Ok(RmaLocal::ReadSlot {
                    loan: crate::slot_pool::Loan {
                        pool: pool.clone(),
                        slot,
                    },
                    len,
                    bufs,
                }),
                Err(e) => {
                    pool.put(slot);
                    Err((e, RmaOp::Read { bufs }))
                }
            };
        }
        let mrs = register_targets(self.pd, bufs).map_err(|(e, bufs)| (e, RmaOp::Read { bufs }))?;
        let posted = mrs
            .iter()
            .filter(|m| !m.is_empty())
            .map(|m| m.sge())
            .collect::<Result<Vec<Sge<'_>>, Error>>()
            .and_then(|sges| self.post(op(), Payload::Sges(&sges)));
        match posted {
            Ok(()) => Ok(RmaLocal::Targets(mrs)),
            Err(e) => Err((
                e,
                RmaOp::Read {
                    bufs: unregister(mrs),
                },
            )),
        }
    }
}

/// The two atomics the device executes: fetch-add and compare-swap of
/// one `u64`.
enum VerbsAtomic {
    FetchAdd(u64),
    CompareSwap { compare: u64, swap: u64 },
}

/// The elements of how many an atomic of `op` on `dt` in form `kind`
/// may carry here (one), or `OpNotSupp`: the device does `FI_SUM` with
/// fetch and `FI_CSWAP`, on one 64-bit unsigned integer.
pub fn atomic_valid(kind: AtomicKind, op: AtomicOp, dt: Datatype) -> weft_core::Result<usize> {
    match (kind, op, dt) {
        (AtomicKind::Fetch, AtomicOp::Sum, Datatype::U64)
        | (AtomicKind::Compare, AtomicOp::Cswap, Datatype::U64) => Ok(1),
        _ => Err(Error::OpNotSupp),
    }
}

fn first_u64(b: &[u8]) -> Option<u64> {
    let mut x = [0u8; 8];
    x.copy_from_slice(b.get(..8)?);
    Some(u64::from_ne_bytes(x))
}

fn verbs_atomic(a: &Atomic) -> Option<VerbsAtomic> {
    atomic_valid(a.kind, a.op, a.datatype).ok()?;
    if a.count != 1 {
        return None;
    }
    match a.op {
        AtomicOp::Sum => Some(VerbsAtomic::FetchAdd(first_u64(&a.operand)?)),
        _ => Some(VerbsAtomic::CompareSwap {
            compare: first_u64(&a.compare)?,
            swap: first_u64(&a.operand)?,
        }),
    }
}
