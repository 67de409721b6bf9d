//! Work requests: posting sends, RDMA, atomics and receives.
//!
//! Memory is named only through [`Sge`]s (which borrow a live registration)
//! or, for inline sends, plain byte slices that the provider copies at post
//! time. Keep the registrations alive until the completion arrives.

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr;

use rdma_sys::{
    atomic_t, bind_mw_t, ibv_mw_bind_info, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge,
    ibv_wr_opcode, rdma_t, ud_t,
};
use weft_core::Error;

use super::ah::AddressHandle;
use super::mr::{AccessFlags, OwnedMr, Sge};
use super::mw::MemoryWindow;
use super::qp::{QpType, QueuePair, Srq};
use super::{errno_error, ret_errno};

/// What a send work request does. Remote addresses and keys are the peer's
/// (its device checks them); immediate data is given in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send.
    Send,
    /// Send with 32-bit immediate data (host order).
    SendWithImm(u32),
    /// Send that revokes the peer's memory window with this rkey once it
    /// arrives (the peer's completion names it). The window must be bound
    /// to the connection the send arrives on.
    SendWithInv(u32),
    /// RDMA write.
    RdmaWrite {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
    },
    /// RDMA write consuming a receive at the peer, with immediate data.
    RdmaWriteWithImm {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
        /// Immediate data (host order).
        imm: u32,
    },
    /// RDMA read into the local SGEs (which need local write rights).
    RdmaRead {
        /// Peer address.
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
    },
    /// 64-bit compare-and-swap at an 8-byte aligned peer address; the old
    /// value lands in the (8-byte) local SGE.
    AtomicCmpSwp {
        /// Peer address (8-byte aligned).
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// 64-bit fetch-and-add; the old value lands in the local SGE.
    AtomicFetchAdd {
        /// Peer address (8-byte aligned).
        remote_addr: u64,
        /// Peer rkey.
        rkey: u32,
        /// Addend.
        add: u64,
    },
}

impl SendOp {
    fn is_atomic(self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    fn is_send(self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
        )
    }
}

/// Send flags (`IBV_SEND_*`); `INLINE` is implied by [`Payload::Inline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    /// No flags (unsignaled unless the QP has `sq_sig_all`).
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion.
    pub const SIGNALED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SIGNALED.0);
    /// Wait for earlier RDMA reads/atomics to complete first.
    pub const FENCE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_FENCE.0);
    /// Solicited event at the receiver.
    pub const SOLICITED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SOLICITED.0);

    /// True if every flag of `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags without `SIGNALED`: the request makes a completion
    /// only if it fails.
    pub fn unsignaled(self) -> SendFlags {
        SendFlags(self.0 & !Self::SIGNALED.0)
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// The local data of a send work request.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Registered memory (zero-copy); may be empty.
    Sges(&'a [Sge<'a>]),
    /// Bytes copied into the work request at post time (`IBV_SEND_INLINE`):
    /// at most [`super::QpCaps::max_inline_data`]; not for reads/atomics.
    Inline(&'a [u8]),
}

/// Destination of a UD send.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// Address handle (of the QP's PD, else `Inval`).
    pub ah: &'a AddressHandle,
    /// Peer QP number.
    pub remote_qpn: u32,
    /// Peer Q_Key.
    pub remote_qkey: u32,
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
    /// Local data.
    pub payload: Payload<'a>,
    /// Destination, for UD QPs only.
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendRequest<'a> {
    /// A signaled request.
    pub fn new(wr_id: u64, op: SendOp, payload: Payload<'a>) -> SendRequest<'a> {
        SendRequest {
            wr_id,
            op,
            flags: SendFlags::SIGNALED,
            payload,
            ud: None,
        }
    }

    /// With these flags instead.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// To a UD destination.
    pub fn ud(mut self, dest: UdDest<'a>) -> Self {
        self.ud = Some(dest);
        self
    }

    fn num_sge(&self) -> usize {
        match self.payload {
            Payload::Sges(s) => s.len(),
            Payload::Inline(d) => usize::from(!d.is_empty()),
        }
    }
}

/// A receive work request (for a UD QP the first 40 bytes receive the GRH).
#[derive(Debug, Clone, Copy)]
pub struct RecvRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the data goes (registrations with local write).
    pub sges: &'a [Sge<'a>],
}

/// A failed post: which request of the list failed and why. Requests before
/// it were posted; it and the ones after were not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostError {
    /// Index of the first request not posted.
    pub index: usize,
    /// Why (`Again` when the queue is full).
    pub error: Error,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} not posted: {}", self.index, self.error)
    }
}

impl std::error::Error for PostError {}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        e.error
    }
}

/// A post error from a provider return value; a full queue (`ENOMEM`)
/// is `Again`.
fn post_errno(ret: i32) -> Error {
    match ret_errno(ret) {
        libc::ENOMEM => Error::Again,
        e => errno_error(e),
    }
}

/// Scatter/gather elements of a single posted request built on the stack
/// (more go through the list path).
const ONE_WR_SGES: usize = 4;

const EMPTY_SGE: ibv_sge = ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

fn zeroed_send_wr() -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data (integers, raw pointers and
    // unions of those); all-zero is a valid value.
    unsafe { MaybeUninit::<ibv_send_wr>::zeroed().assume_init() }
}

impl QueuePair {
    fn check_send(&self, wr: &SendRequest<'_>) -> Result<(), Error> {
        match self.qp_type() {
            QpType::Ud => {
                let Some(ud) = wr.ud else {
                    return Err(Error::Inval);
                };
                if !wr.op.is_send() || ud.ah.pd().as_ptr() != self.pd().as_ptr() {
                    return Err(Error::Inval);
                }
            }
            QpType::Rc if wr.ud.is_some() => return Err(Error::Inval),
            QpType::Rc => {}
        }
        if wr.num_sge() > self.caps.max_send_sge as usize {
            return Err(Error::Inval);
        }
        match wr.payload {
            Payload::Inline(d) => {
                if wr.op.is_atomic() || matches!(wr.op, SendOp::RdmaRead { .. }) {
                    return Err(Error::Inval);
                }
                if d.len() > self.caps.max_inline_data as usize {
                    return Err(Error::MsgSize);
                }
            }
            Payload::Sges(sges) if wr.op.is_atomic() => {
                let total: u64 = sges.iter().map(|s| u64::from(s.len())).sum();
                let addr = match wr.op {
                    SendOp::AtomicCmpSwp { remote_addr, .. }
                    | SendOp::AtomicFetchAdd { remote_addr, .. } => remote_addr,
                    _ => 0,
                };
                if total != 8 || addr % 8 != 0 {
                    return Err(Error::Inval);
                }
            }
            Payload::Sges(_) => {}
        }
        Ok(())
    }

    /// Fills `raw` from `wr`, with `sg` pointing at its `num_sge()`
    /// elements (already written by the caller).
    fn fill_send(wr: &SendRequest<'_>, raw: &mut ibv_send_wr, sg: *mut ibv_sge) {
        raw.wr_id = wr.wr_id;
        raw.next = ptr::null_mut();
        raw.sg_list = sg;
        raw.num_sge = wr.num_sge() as i32;
        raw.send_flags = wr.flags.0;
        if matches!(wr.payload, Payload::Inline(_)) {
            raw.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let rdma = |remote_addr, rkey| rdma_t { remote_addr, rkey };
        match wr.op {
            SendOp::Send => raw.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::SendWithImm(imm) => {
                raw.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::SendWithInv(rkey) => {
                raw.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                raw.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                raw.wr.rdma = rdma(remote_addr, rkey);
            }
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                raw.wr.rdma = rdma(remote_addr, rkey);
                raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                raw.wr.rdma = rdma(remote_addr, rkey);
            }
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                raw.wr.atomic = atomic_t {
                    remote_addr,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                raw.wr.atomic = atomic_t {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
        }
        if let Some(ud) = wr.ud {
            raw.wr.ud = ud_t {
                ah: ud.ah.as_ptr(),
                remote_qpn: ud.remote_qpn,
                remote_qkey: ud.remote_qkey,
            };
        }
    }

    /// The scatter/gather list of `wr`, one element at a time.
    fn raw_sges<'w>(wr: &'w SendRequest<'_>) -> impl Iterator<Item = ibv_sge> + 'w {
        let (sges, inline) = match wr.payload {
            Payload::Sges(s) => (s, None),
            Payload::Inline(d) if !d.is_empty() => (&[][..], Some(d)),
            Payload::Inline(_) => (&[][..], None),
        };
        let inline = inline.map(|d| ibv_sge {
            addr: d.as_ptr() as u64,
            length: d.len() as u32,
            lkey: 0,
        });
        sges.iter().map(|s| s.to_raw()).chain(inline)
    }

    /// Posts one send work request (`ibv_post_send`). `Again` when the send
    /// queue is full; `Inval`/`MsgSize` for requests that cannot be valid
    /// on this QP (checked before calling the provider).
    pub fn post_send(&self, wr: &SendRequest<'_>) -> Result<(), Error> {
        // The common case (one request, a few elements) is built on the
        // stack: no allocation per message.
        if wr.num_sge() > ONE_WR_SGES {
            return self
                .post_send_list(std::slice::from_ref(wr))
                .map_err(|e| e.error);
        }
        self.check_send(wr)?;
        let mut sges = [EMPTY_SGE; ONE_WR_SGES];
        let mut raw = zeroed_send_wr();
        Self::fill_one(wr, &mut raw, &mut sges);
        self.call_post_send(&mut raw, 1).map_err(|e| e.error)
    }

    /// Fills `raw` from `wr` (at most [`ONE_WR_SGES`] elements), its
    /// elements in `sges`, which must outlive the post.
    fn fill_one(wr: &SendRequest<'_>, raw: &mut ibv_send_wr, sges: &mut [ibv_sge; ONE_WR_SGES]) {
        for (d, s) in sges.iter_mut().zip(Self::raw_sges(wr)) {
            *d = s;
        }
        let sg = if wr.num_sge() == 0 {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        Self::fill_send(wr, raw, sg);
    }

    /// Binds `window` over `len` bytes at `offset` of `mr` for remote
    /// reads under the key `rkey`, then posts `wr` after it, in one
    /// `ibv_post_send`: the peer learns the key from `wr` and can use it
    /// as soon as it arrives, since a queue pair executes its requests in
    /// order. The bind is unsignaled and carries `wr`'s id, so a failed
    /// bind is reported under `wr`'s id. `Inval` unless the QP is RC, the
    /// window and region are on its PD, the region allows
    /// [`AccessFlags::MW_BIND`] and holds the range, and `rkey` names the
    /// window with a new key byte. On success the window's key is `rkey`.
    pub fn post_bind_then_send(
        &self,
        (window, rkey): (&mut MemoryWindow, u32),
        (mr, offset, len): (&OwnedMr, usize, usize),
        wr: &SendRequest<'_>,
    ) -> Result<(), Error> {
        if self.qp_type() != QpType::Rc
            || window.pd().as_ptr() != self.pd().as_ptr()
            || !mr.is_on(self.pd())
            || rkey & !0xff != window.rkey() & !0xff
            || rkey == window.rkey()
            || wr.num_sge() > ONE_WR_SGES
        {
            return Err(Error::Inval);
        }
        let (raw_mr, addr) = mr.bind_range(offset, len)?;
        self.check_send(wr)?;
        let mut sges = [EMPTY_SGE; ONE_WR_SGES];
        let mut chain = [zeroed_send_wr(), zeroed_send_wr()];
        Self::fill_one(wr, &mut chain[1], &mut sges);
        let bind = &mut chain[0];
        bind.wr_id = wr.wr_id;
        bind.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        bind.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: window.as_ptr(),
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: raw_mr.as_ptr(),
                addr,
                length: len as u64,
                mw_access_flags: AccessFlags::REMOTE_READ.bits(),
            },
        };
        let base = chain.as_mut_ptr();
        // SAFETY: both indices are in bounds of `chain`, which outlives
        // the post below.
        unsafe { (*base).next = base.add(1) };
        // The region is borrowed for the call; afterwards the window keeps
        // the device's access to it only while the region stays
        // registered (see the module's invariants).
        self.call_post_send(base, 2).map_err(|e| e.error)?;
        window.set_rkey(rkey);
        Ok(())
    }

    /// Posts a list of send work requests with one `ibv_post_send`.
    pub fn post_send_list(&self, wrs: &[SendRequest<'_>]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        for (index, wr) in wrs.iter().enumerate() {
            self.check_send(wr)
                .map_err(|error| PostError { index, error })?;
        }
        let mut sges: Vec<ibv_sge> = Vec::with_capacity(wrs.iter().map(|w| w.num_sge()).sum());
        for wr in wrs {
            sges.extend(Self::raw_sges(wr));
        }
        let mut raw: Vec<ibv_send_wr> = wrs.iter().map(|_| zeroed_send_wr()).collect();
        let mut off = 0;
        for (wr, r) in wrs.iter().zip(raw.iter_mut()) {
            // `sges` is not resized any more, so the pointers stay valid.
            let sg = if wr.num_sge() == 0 {
                ptr::null_mut()
            } else {
                sges[off..].as_mut_ptr()
            };
            Self::fill_send(wr, r, sg);
            off += wr.num_sge();
        }
        let base = raw.as_mut_ptr();
        for i in 1..raw.len() {
            // SAFETY: `i - 1` and `i` are in bounds of `raw`.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        self.call_post_send(base, raw.len())
    }

    /// `ibv_post_send` of the chain of `len` requests at `base`, whose
    /// scatter/gather lists are filled in and stay valid for the call.
    fn call_post_send(&self, base: *mut ibv_send_wr, len: usize) -> Result<(), PostError> {
        // SAFETY: the QP is alive; the op table of an open context is
        // immutable.
        let op = unsafe { (*(*self.as_ptr()).context).ops.post_send };
        let op = op.ok_or(PostError {
            index: 0,
            error: Error::NoSys,
        })?;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the WR chain and its SGE arrays are valid for the call;
        // every SGE names memory of a registration the caller borrows (or
        // inline data the provider copies now); the provider only reads
        // the chain and writes `bad`.
        let ret = unsafe { op(self.as_ptr(), base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            index: chain_index(base, bad, len),
            error: post_errno(ret),
        })
    }

    /// Posts one receive work request (`ibv_post_recv`). `Inval` if the QP
    /// uses an SRQ (post to the [`Srq`] instead); `Again` when full.
    pub fn post_recv(&self, wr: &RecvRequest<'_>) -> Result<(), Error> {
        self.post_recv_list(std::slice::from_ref(wr))
            .map_err(|e| e.error)
    }

    /// Posts a list of receive work requests with one `ibv_post_recv`.
    pub fn post_recv_list(&self, wrs: &[RecvRequest<'_>]) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError {
                index: 0,
                error: Error::Inval,
            });
        }
        let max_sge = self.caps.max_recv_sge as usize;
        // SAFETY: the QP is alive; the op table of an open context is
        // immutable.
        let op = unsafe { (*(*self.as_ptr()).context).ops.post_recv };
        let op = op.ok_or(PostError {
            index: 0,
            error: Error::NoSys,
        })?;
        post_recv_chain(wrs, max_sge, |wr, bad| {
            // SAFETY: the QP is alive; the WR chain and SGEs are valid for
            // the call and name memory of registrations the caller borrows.
            unsafe { op(self.as_ptr(), wr, bad) }
        })
    }
}

impl Srq {
    /// Posts one receive to the shared receive queue (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: &RecvRequest<'_>) -> Result<(), Error> {
        self.post_recv_list(std::slice::from_ref(wr))
            .map_err(|e| e.error)
    }

    /// Posts a list of receives with one `ibv_post_srq_recv`.
    pub fn post_recv_list(&self, wrs: &[RecvRequest<'_>]) -> Result<(), PostError> {
        // SAFETY: the SRQ is alive; the op table of an open context is
        // immutable.
        let op = unsafe { (*(*self.as_ptr()).context).ops.post_srq_recv };
        let op = op.ok_or(PostError {
            index: 0,
            error: Error::NoSys,
        })?;
        post_recv_chain(wrs, self.max_sge as usize, |wr, bad| {
            // SAFETY: as for QueuePair::post_recv_list.
            unsafe { op(self.as_ptr(), wr, bad) }
        })
    }
}

/// Builds the `ibv_recv_wr` chain for `wrs` and hands it to `post`.
fn post_recv_chain(
    wrs: &[RecvRequest<'_>],
    max_sge: usize,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    if let Some(index) = wrs.iter().position(|w| w.sges.len() > max_sge) {
        return Err(PostError {
            index,
            error: Error::Inval,
        });
    }
    if let [wr] = wrs {
        if wr.sges.len() <= ONE_WR_SGES {
            // One request with a few elements, on the stack: no
            // allocation per message.
            let mut sges = [EMPTY_SGE; ONE_WR_SGES];
            for (d, s) in sges.iter_mut().zip(wr.sges) {
                *d = s.to_raw();
            }
            let mut raw = ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list: if wr.sges.is_empty() {
                    ptr::null_mut()
                } else {
                    sges.as_mut_ptr()
                },
                num_sge: wr.sges.len() as i32,
            };
            let mut bad: *mut ibv_recv_wr = ptr::null_mut();
            let ret = post(&mut raw, &mut bad);
            return match ret {
                0 => Ok(()),
                _ => Err(PostError {
                    index: 0,
                    error: post_errno(ret),
                }),
            };
        }
    }
    let mut sges: Vec<ibv_sge> = wrs
        .iter()
        .flat_map(|w| w.sges.iter().map(|s| s.to_raw()))
        .collect();
    let mut raw: Vec<ibv_recv_wr> = Vec::with_capacity(wrs.len());
    let mut off = 0;
    for wr in wrs {
        let sg = if wr.sges.is_empty() {
            ptr::null_mut()
        } else {
            sges[off..].as_mut_ptr()
        };
        raw.push(ibv_recv_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: sg,
            num_sge: wr.sges.len() as i32,
        });
        off += wr.sges.len();
    }
    let base = raw.as_mut_ptr();
    for i in 1..raw.len() {
        // SAFETY: `i - 1` and `i` are in bounds of `raw`.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad: *mut ibv_recv_wr = ptr::null_mut();
    let ret = post(base, &mut bad);
    if ret == 0 {
        return Ok(());
    }
    Err(PostError {
        index: chain_index(base, bad, raw.len()),
        error: post_errno(ret),
    })
}

/// Index of `bad` in the array starting at `base` (0 if not in it).
fn chain_index<T>(base: *mut T, bad: *mut T, len: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    let off = (bad as usize).wrapping_sub(base as usize) / size;
    if bad.is_null() || off >= len {
        0
    } else {
        off
    }
}
