//! Completion channels and completion queues.

use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_wc, ibv_wc_flags,
    ibv_wc_opcode, ibv_wc_status,
};
use weft_core::Error;

use super::device::Context;
use super::{check_ret, last_error_or, set_nonblocking};

static NEXT_CQ_ID: AtomicU64 = AtomicU64::new(1);

/// A completion channel (`ibv_comp_channel`): a non-blocking fd that becomes
/// readable when an armed CQ attached to it gets a completion. Register
/// [`AsRawFd::as_raw_fd`] with `tokio::io::unix::AsyncFd`, then call
/// [`get_events`](Self::get_events) when it is readable.
pub struct CompChannel {
    ch: NonNull<ibv_comp_channel>,
    fd: RawFd,
    ctx: Arc<Context>,
}

// SAFETY: ibv_get_cq_event/ack are thread-safe (the kernel serialises reads
// of the fd; acks take the CQ's mutex); the struct itself is immutable.
unsafe impl Send for CompChannel {}
// SAFETY: see `Send`.
unsafe impl Sync for CompChannel {}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("device", &self.ctx.name())
            .field("fd", &self.fd)
            .finish()
    }
}

/// How many completion events one CQ got, from [`CompChannel::get_events`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEvents {
    /// [`Cq::id`] of the CQ.
    pub cq_id: u64,
    /// Number of events (already acknowledged).
    pub count: u32,
}

impl CompChannel {
    /// `ibv_create_comp_channel`, with the fd set to `O_NONBLOCK`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<CompChannel>, Error> {
        // SAFETY: the context is open (we hold an Arc of it).
        let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| last_error_or(Error::NoMem))?;
        // SAFETY: a freshly created, valid channel; `fd` is immutable.
        let fd = unsafe { (*ch.as_ptr()).fd };
        let chan = CompChannel {
            ch,
            fd,
            ctx: Arc::clone(ctx),
        };
        set_nonblocking(fd)?;
        Ok(Arc::new(chan))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_comp_channel {
        self.ch.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Reads every pending completion event (`ibv_get_cq_event` until
    /// `EAGAIN`), acknowledges them (`ibv_ack_cq_events`) and returns how
    /// many each CQ got. Empty when nothing was pending. Each CQ that got an
    /// event is disarmed: call [`Cq::req_notify`] again, then poll it.
    pub fn get_events(&self) -> Result<Vec<CqEvents>, Error> {
        let mut counts: Vec<(NonNull<ibv_cq>, u64, u32)> = Vec::new();
        let result = loop {
            match self.read_event() {
                Ok(Some((cq, id))) => match counts.iter_mut().find(|(p, _, _)| *p == cq) {
                    Some(entry) => entry.2 += 1,
                    None => counts.push((cq, id, 1)),
                },
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        for &(cq, _, n) in &counts {
            // SAFETY: `cq` was just reported by the kernel; a CQ with
            // unacknowledged events cannot finish ibv_destroy_cq (it waits
            // for this ack), so the pointer is still valid.
            unsafe { ibv_ack_cq_events(cq.as_ptr(), n) };
        }
        // Events already read are reported even if a later read failed;
        // the error will show up again on the next call.
        if counts.is_empty() {
            result?;
        }
        Ok(counts
            .into_iter()
            .map(|(_, cq_id, count)| CqEvents { cq_id, count })
            .collect())
    }

    /// Reads and acknowledges at most one completion event: one
    /// `ibv_get_cq_event`, without the read that would only find `EAGAIN`.
    /// `None` when nothing was pending. Enough for a channel of one CQ
    /// that is re-armed only after its event was taken: such a channel
    /// never holds more than one event.
    pub fn get_event(&self) -> Result<Option<CqEvents>, Error> {
        let Some((cq, cq_id)) = self.read_event()? else {
            return Ok(None);
        };
        // SAFETY: as in `get_events`: the CQ just reported cannot be
        // destroyed before this ack.
        unsafe { ibv_ack_cq_events(cq.as_ptr(), 1) };
        Ok(Some(CqEvents { cq_id, count: 1 }))
    }

    /// One `ibv_get_cq_event`, not acknowledged: the CQ and its id, `None`
    /// on `EAGAIN`.
    fn read_event(&self) -> Result<Option<(NonNull<ibv_cq>, u64)>, Error> {
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut cq_ctx: *mut libc::c_void = ptr::null_mut();
            // SAFETY: the channel is alive; out-pointers are valid.
            let ret = unsafe { ibv_get_cq_event(self.as_ptr(), &mut cq, &mut cq_ctx) };
            if ret != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EAGAIN) {
                    return Ok(None);
                }
                return Err(last_error_or(Error::Io));
            }
            let Some(cq) = NonNull::new(cq) else {
                continue;
            };
            // `cq_context` holds the CQ id (see `Cq::new`).
            return Ok(Some((cq, cq_ctx as usize as u64)));
        }
    }
}

impl CompChannel {
    /// Registers the fd with the current Tokio reactor for readability.
    /// Wait with `readable().await`, then drain with `get_inner()` and clear
    /// the readiness when it returns nothing.
    ///
    /// # Panics
    /// Outside a Tokio runtime (Tokio's own check).
    pub fn register_async(
        self: &Arc<Self>,
    ) -> Result<tokio::io::unix::AsyncFd<Arc<CompChannel>>, Error> {
        // SAFETY: the AsyncFd owns an Arc of the completion channel, whose fd stays
        // open and unchanged until the last Arc is dropped (Drop closes it),
        // so it outlives the registration, and `as_raw_fd` always returns
        // the same fd.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                Arc::clone(self),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| Error::from_io(&e.into_parts().1))
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd stays open until the channel is destroyed in Drop,
        // which cannot happen while `&self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once; every
        // CQ attached holds an Arc of this channel, so none is left.
        let ret = unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion queue (`ibv_cq`).
pub struct Cq {
    cq: NonNull<ibv_cq>,
    id: u64,
    capacity: u32,
    channel: Option<Arc<CompChannel>>,
    ctx: Arc<Context>,
    /// The provider hands the kernel's `wc_flags` through unchanged (see
    /// [`kernel_wc_flags`]).
    kernel_flags: bool,
}

/// The vendor id soft-RoCE (rxe) reports.
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// `wc_flags` in libibverbs' numbering from the kernel's: rxe's user
/// library copies the kernel's flags, in which "with invalidate" is bit 2
/// and "IP checksum OK" bit 3, the other way round from libibverbs.
fn kernel_wc_flags(k: u32) -> u32 {
    const K_WITH_INV: u32 = 1 << 2;
    const K_IP_CSUM_OK: u32 = 1 << 3;
    let mut f = k & !(K_WITH_INV | K_IP_CSUM_OK);
    if k & K_WITH_INV != 0 {
        f |= ibv_wc_flags::IBV_WC_WITH_INV.0;
    }
    if k & K_IP_CSUM_OK != 0 {
        f |= ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    }
    f
}

// SAFETY: ibv_poll_cq / ibv_req_notify_cq are thread-safe in libibverbs
// providers (they lock the CQ); the struct itself is immutable.
unsafe impl Send for Cq {}
// SAFETY: see `Send`.
unsafe impl Sync for Cq {}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.id)
            .field("capacity", &self.capacity)
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// How many completions [`Cq::poll`] reads per provider call.
const POLL_BATCH: usize = 16;

impl Cq {
    /// `ibv_create_cq` with at least `cqe` entries, reporting to `channel`
    /// if given (which must belong to the same context: `Inval`).
    pub fn new(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>, Error> {
        if let Some(ch) = channel {
            if !ch.context().same_context(ctx) {
                return Err(Error::Inval);
            }
        }
        let cqe = i32::try_from(cqe).map_err(|_| Error::Inval)?;
        let id = NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed);
        let ch_ptr = channel.map_or(ptr::null_mut(), |c| c.as_ptr());
        // SAFETY: context and channel are alive (Arcs held by the result);
        // `cq_context` is an opaque integer we only read back.
        let cq = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, id as usize as *mut _, ch_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| last_error_or(Error::NoMem))?;
        // SAFETY: valid CQ; `cqe` is set at creation.
        let capacity = u32::try_from(unsafe { (*cq.as_ptr()).cqe }).unwrap_or(0);
        let kernel_flags = ctx
            .device_attr()
            .is_ok_and(|a| a.vendor_id == RXE_VENDOR_ID);
        Ok(Arc::new(Cq {
            cq,
            id,
            capacity,
            channel: channel.cloned(),
            ctx: Arc::clone(ctx),
            kernel_flags,
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// A process-unique id, as reported in [`CqEvents::cq_id`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Actual number of entries.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&Arc<CompChannel>> {
        self.channel.as_ref()
    }

    /// `ibv_req_notify_cq`: arm the CQ for one event on its channel at the
    /// next (solicited, if `solicited_only`) completion. Poll after arming
    /// to catch completions that arrived before.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        // SAFETY: the CQ is alive; the provider op table of an open context
        // is immutable.
        let op = unsafe { (*(*self.as_ptr()).context).ops.req_notify_cq };
        let op = op.ok_or(Error::NoSys)?;
        // SAFETY: calling the provider's req_notify_cq on its own CQ, as the
        // inline ibv_req_notify_cq does.
        check_ret(unsafe { op(self.as_ptr(), i32::from(solicited_only)) })
    }

    /// `ibv_poll_cq`: appends up to `max` completions to `out` and returns
    /// how many were appended (0 when the CQ is empty).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize, Error> {
        // SAFETY: as in `req_notify`.
        let op = unsafe { (*(*self.as_ptr()).context).ops.poll_cq };
        let op = op.ok_or(Error::NoSys)?;
        let mut total = 0;
        while total < max {
            let want = (max - total).min(POLL_BATCH);
            let mut wcs: [MaybeUninit<ibv_wc>; POLL_BATCH] =
                [const { MaybeUninit::uninit() }; POLL_BATCH];
            // SAFETY: the CQ is alive and `wcs` has room for `want` entries
            // (`want <= POLL_BATCH`), as ibv_poll_cq does.
            let n = unsafe { op(self.as_ptr(), want as i32, wcs.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(super::errno_error(n.saturating_neg()));
            }
            let n = (n as usize).min(want);
            out.reserve(n);
            for wc in &wcs[..n] {
                // SAFETY: the provider initialised the first `n` entries.
                let wc = unsafe { wc.assume_init_ref() };
                out.push(WorkCompletion::from_raw(wc, self.kernel_flags));
            }
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once; every QP/SRQ
        // using it holds an Arc of this CQ, and all its channel events were
        // acknowledged in `get_events`.
        let ret = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_cq failed");
        }
    }
}

/// A work completion (`ibv_wc`), copied out of the CQ.
///
/// For an error completion only `wr_id`, `status`, `vendor_err` and
/// `qp_num` are meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The id given when posting.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Operation (valid for successful completions).
    pub opcode: WcOpcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes transferred (receives, RDMA reads, atomics).
    pub byte_len: u32,
    /// Immediate data in host order (converted from the wire's network
    /// order), when `wc_flags` has `WITH_IMM`.
    pub imm_data: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Flags (in libibverbs' numbering whatever the provider).
    pub wc_flags: WcFlags,
    /// The rkey a send with invalidate revoked, when `wc_flags` has
    /// `WITH_INV`.
    pub invalidated_rkey: Option<u32>,
    /// P_Key index (GSI QPs).
    pub pkey_index: u16,
    /// Source LID (IB; 0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    fn from_raw(wc: &ibv_wc, kernel_flags: bool) -> WorkCompletion {
        let wc_flags = WcFlags(if kernel_flags {
            kernel_wc_flags(wc.wc_flags)
        } else {
            wc.wc_flags
        });
        // SAFETY: both union members are plain u32s.
        let rkey = unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey };
        let invalidated_rkey = wc_flags.contains(WcFlags::WITH_INV).then_some(rkey);
        let imm_data = if wc_flags.contains(WcFlags::WITH_IMM) {
            // SAFETY: both union members are plain u32s.
            Some(u32::from_be(unsafe {
                wc.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        };
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_raw(wc.status),
            opcode: WcOpcode::from_raw(wc.opcode),
            vendor_err: wc.vendor_err,
            byte_len: wc.byte_len,
            imm_data,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            wc_flags,
            invalidated_rkey,
            pkey_index: wc.pkey_index,
            slid: wc.slid,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
        }
    }

    /// True for a successful completion.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// The error of a failed completion (`None` on success); see
    /// [`WcStatus::to_error`].
    pub fn to_error(&self) -> Option<Error> {
        self.status.to_error()
    }
}

/// `ibv_wc_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    /// A GRH is present (the first 40 bytes of a UD receive buffer).
    pub const GRH: WcFlags = WcFlags(ibv_wc_flags::IBV_WC_GRH.0);
    /// Immediate data is valid.
    pub const WITH_IMM: WcFlags = WcFlags(ibv_wc_flags::IBV_WC_WITH_IMM.0);
    /// IP checksum verified.
    pub const IP_CSUM_OK: WcFlags = WcFlags(ibv_wc_flags::IBV_WC_IP_CSUM_OK.0);
    /// An rkey was invalidated.
    pub const WITH_INV: WcFlags = WcFlags(ibv_wc_flags::IBV_WC_WITH_INV.0);

    /// True if every flag of `other` is set.
    pub fn contains(self, other: WcFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// Completion opcode (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    BindMw,
    LocalInv,
    Recv,
    RecvRdmaWithImm,
    Other(u32),
}

impl WcOpcode {
    fn from_raw(v: ibv_wc_opcode::Type) -> WcOpcode {
        use ibv_wc_opcode::*;
        match v {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
            IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            IBV_WC_BIND_MW => WcOpcode::BindMw,
            IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }
}

macro_rules! wc_status {
    ($( $(#[$doc:meta])* $name:ident = $c:ident => $err:expr, )*) => {
        /// Completion status (`ibv_wc_status`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum WcStatus {
            $( $(#[$doc])* $name, )*
            /// A value this build does not know.
            Unknown(u32),
        }

        impl WcStatus {
            /// From the `ibv_wc_status` value.
            pub fn from_raw(v: u32) -> WcStatus {
                match v {
                    $( ibv_wc_status::$c => WcStatus::$name, )*
                    other => WcStatus::Unknown(other),
                }
            }

            /// The `ibv_wc_status` value.
            pub fn to_raw(self) -> u32 {
                match self {
                    $( WcStatus::$name => ibv_wc_status::$c, )*
                    WcStatus::Unknown(v) => v,
                }
            }

            /// The Weft error of a failed completion; `None` for `Success`.
            pub fn to_error(self) -> Option<Error> {
                match self {
                    $( WcStatus::$name => $err, )*
                    WcStatus::Unknown(_) => Some(Error::Other),
                }
            }
        }
    };
}

wc_status! {
    /// Success.
    Success = IBV_WC_SUCCESS => None,
    /// Local length error: the message did not fit the receive buffer (or
    /// exceeded the port's maximum message size).
    LocLenErr = IBV_WC_LOC_LEN_ERR => Some(Error::Trunc),
    /// Local QP operation error (malformed work request).
    LocQpOpErr = IBV_WC_LOC_QP_OP_ERR => Some(Error::Inval),
    /// Local EE context operation error.
    LocEecOpErr = IBV_WC_LOC_EEC_OP_ERR => Some(Error::Io),
    /// Local protection error: an SGE does not match a registration the
    /// QP's PD may use with these rights.
    LocProtErr = IBV_WC_LOC_PROT_ERR => Some(Error::Fault),
    /// Flushed because the QP is in the error state.
    WrFlushErr = IBV_WC_WR_FLUSH_ERR => Some(Error::Canceled),
    /// Memory window bind error.
    MwBindErr = IBV_WC_MW_BIND_ERR => Some(Error::Access),
    /// Bad response from the responder.
    BadRespErr = IBV_WC_BAD_RESP_ERR => Some(Error::Io),
    /// Local access error (e.g. receive into memory without local write).
    LocAccessErr = IBV_WC_LOC_ACCESS_ERR => Some(Error::Access),
    /// The responder found the request invalid (e.g. message too long for
    /// its receive buffer, unsupported operation).
    RemInvReqErr = IBV_WC_REM_INV_REQ_ERR => Some(Error::RemoteIo),
    /// Remote access error: bad rkey, address or rights.
    RemAccessErr = IBV_WC_REM_ACCESS_ERR => Some(Error::Access),
    /// Remote operation error.
    RemOpErr = IBV_WC_REM_OP_ERR => Some(Error::RemoteIo),
    /// Transport retries exhausted (peer gone).
    RetryExcErr = IBV_WC_RETRY_EXC_ERR => Some(Error::TimedOut),
    /// RNR retries exhausted: the peer had no receive posted.
    RnrRetryExcErr = IBV_WC_RNR_RETRY_EXC_ERR => Some(Error::NoRx),
    /// Local RDD violation.
    LocRddViolErr = IBV_WC_LOC_RDD_VIOL_ERR => Some(Error::Io),
    /// Remote invalid RD request.
    RemInvRdReqErr = IBV_WC_REM_INV_RD_REQ_ERR => Some(Error::RemoteIo),
    /// Remote aborted.
    RemAbortErr = IBV_WC_REM_ABORT_ERR => Some(Error::ConnAborted),
    /// Invalid EE context number.
    InvEecnErr = IBV_WC_INV_EECN_ERR => Some(Error::Io),
    /// Invalid EE context state.
    InvEecStateErr = IBV_WC_INV_EEC_STATE_ERR => Some(Error::Io),
    /// Fatal error.
    FatalErr = IBV_WC_FATAL_ERR => Some(Error::Io),
    /// Response timeout.
    RespTimeoutErr = IBV_WC_RESP_TIMEOUT_ERR => Some(Error::TimedOut),
    /// General error.
    GeneralErr = IBV_WC_GENERAL_ERR => Some(Error::Other),
    /// Tag matching error.
    TmErr = IBV_WC_TM_ERR => Some(Error::Io),
    /// Tag matching rendezvous incomplete.
    TmRndvIncomplete = IBV_WC_TM_RNDV_INCOMPLETE => Some(Error::Io),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_flags_renumbered() {
        // The kernel's "with invalidate" (bit 2) and "IP checksum OK"
        // (bit 3) swap places; GRH and immediate keep theirs.
        let f = WcFlags(kernel_wc_flags(1 << 2));
        assert!(f.contains(WcFlags::WITH_INV));
        assert!(!f.contains(WcFlags::IP_CSUM_OK));
        let f = WcFlags(kernel_wc_flags(1 << 3));
        assert!(f.contains(WcFlags::IP_CSUM_OK));
        assert!(!f.contains(WcFlags::WITH_INV));
        let f = WcFlags(kernel_wc_flags(0b11));
        assert_eq!(f, WcFlags(WcFlags::GRH.0 | WcFlags::WITH_IMM.0));
    }
}
