//! Queue pairs (RC and UD), shared receive queues, state transitions.
//! Posting work requests lives in [`super::wr`].

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    ibv_attach_mcast, ibv_create_qp, ibv_create_srq, ibv_destroy_qp, ibv_destroy_srq,
    ibv_detach_mcast, ibv_modify_qp, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_cap,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_query_qp, ibv_srq, ibv_srq_attr,
    ibv_srq_init_attr,
};
use weft_core::Error;

use super::ah::AhAttr;
use super::cm::CmIdInner;
use super::cq::Cq;
use super::device::{Context, Gid, Mtu};
use super::mr::AccessFlags;
use super::pd::ProtectionDomain;
use super::{check_ret, last_error_or};

/// Queue pair transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    fn to_raw(self) -> ibv_qp_type::Type {
        match self {
            QpType::Rc => ibv_qp_type::IBV_QPT_RC,
            QpType::Ud => ibv_qp_type::IBV_QPT_UD,
        }
    }
}

/// Queue sizes and limits of a QP (requested, or actual after creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl QpCaps {
    fn to_raw(self) -> ibv_qp_cap {
        ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }

    fn from_raw(c: &ibv_qp_cap) -> QpCaps {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// What to create a QP with.
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    /// Transport (for QPs created on a `CmId` it must match the port space:
    /// TCP → RC, UDP → UD).
    pub qp_type: QpType,
    /// Send completions go here.
    pub send_cq: Arc<Cq>,
    /// Receive completions go here.
    pub recv_cq: Arc<Cq>,
    /// Receive from a shared receive queue instead of the QP's own.
    pub srq: Option<Arc<Srq>>,
    /// Requested sizes (the provider may round up; see [`QueuePair::caps`]).
    pub caps: QpCaps,
    /// Every send WR generates a completion, whatever its flags.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    fn to_raw(&self) -> ibv_qp_init_attr {
        ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.send_cq.as_ptr(),
            recv_cq: self.recv_cq.as_ptr(),
            srq: self
                .srq
                .as_ref()
                .map_or(std::ptr::null_mut(), |s| s.as_ptr()),
            cap: self.caps.to_raw(),
            qp_type: self.qp_type.to_raw(),
            sq_sig_all: i32::from(self.sq_sig_all),
        }
    }

    /// `Inval` unless the CQs and SRQ belong to the PD's context.
    fn check_context(&self, pd: &ProtectionDomain) -> Result<(), Error> {
        let ctx = pd.context();
        let same = self.send_cq.context().same_context(ctx)
            && self.recv_cq.context().same_context(ctx)
            && self
                .srq
                .as_ref()
                .is_none_or(|s| s.pd().context().same_context(ctx));
        if same {
            Ok(())
        } else {
            Err(Error::Inval)
        }
    }
}

/// QP state (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
    Unknown,
}

impl QpState {
    fn from_raw(v: ibv_qp_state::Type) -> QpState {
        use ibv_qp_state::*;
        match v {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            IBV_QPS_SQD => QpState::Sqd,
            IBV_QPS_SQE => QpState::Sqe,
            IBV_QPS_ERR => QpState::Error,
            _ => QpState::Unknown,
        }
    }
}

/// Parameters to connect an RC QP by hand (INIT → RTR → RTS), as exchanged
/// out of band: the peer's QP number, PSN and GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnectParams {
    /// Local port.
    pub port: u8,
    /// P_Key index (0 on RoCE).
    pub pkey_index: u16,
    /// What the peer may do to our memory through this QP (remote
    /// read/write/atomic; MRs must allow it too).
    pub access: AccessFlags,
    /// Path MTU (at most both ports' active MTU).
    pub path_mtu: Mtu,
    /// Peer QP number.
    pub dest_qp_num: u32,
    /// The peer's send PSN (our receive PSN).
    pub rq_psn: u32,
    /// Our send PSN.
    pub sq_psn: u32,
    /// Path to the peer (GRH with its GID on RoCE).
    pub ah: AhAttr,
    /// RDMA reads/atomics the peer may have outstanding at us.
    pub max_dest_rd_atomic: u8,
    /// RDMA reads/atomics we may have outstanding at the peer.
    pub max_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Transport retries (0-7).
    pub retry_cnt: u8,
    /// RNR retries (0-7, 7 = infinite).
    pub rnr_retry: u8,
}

/// Transport retries of every RC connection (also [`ConnParam`]'s
/// default). rxe takes 7, the largest count, as "retry for ever", so a
/// send to a peer that went silent would never complete there; 6 fails
/// everywhere, after seven local ACK timeouts.
///
/// [`ConnParam`]: super::ConnParam
pub const RC_RETRIES: u8 = 6;

/// The RNR NAK timer code of every RC queue pair: 12 is 0.64 ms, the
/// wait a sender whose message found no receive posted here is told to
/// take before it retries. rdma_cm leaves code 0 on the queue pairs it
/// connects (the kernel CM sets it at RTR), which is the longest wait,
/// 655.36 ms: one receive posted a moment late then stalls a stream for
/// two thirds of a second, so rdma_cm queue pairs get this code too once
/// they reach RTS (in [`CmId::accept`], after the reply has been sent,
/// and when [`EventChannel::get_event`] reports `Established` on the
/// connecting side). Until then a send that finds no receive posted
/// still meets the long wait.
///
/// [`CmId::accept`]: super::CmId::accept
/// [`EventChannel::get_event`]: super::EventChannel::get_event
pub const RNR_TIMER: u8 = 12;

impl RcConnectParams {
    /// RoCE defaults: GRH to `remote_gid` from `sgid_index` of `port`, all
    /// remote access, 16 outstanding reads/atomics each way, timeout 14,
    /// [`RC_RETRIES`] retries, infinite RNR retries.
    pub fn roce(
        port: u8,
        sgid_index: u8,
        path_mtu: Mtu,
        remote_gid: Gid,
        dest_qp_num: u32,
        rq_psn: u32,
        sq_psn: u32,
    ) -> RcConnectParams {
        RcConnectParams {
            port,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            path_mtu,
            dest_qp_num,
            rq_psn,
            sq_psn,
            ah: AhAttr::roce(remote_gid, port, sgid_index, 0),
            max_dest_rd_atomic: 16,
            max_rd_atomic: 16,
            min_rnr_timer: RNR_TIMER,
            timeout: 14,
            retry_cnt: RC_RETRIES,
            rnr_retry: 7,
        }
    }
}

enum Owner {
    /// `ibv_create_qp`; destroyed with `ibv_destroy_qp`.
    Verbs,
    /// `rdma_create_qp` on a cm id; destroyed with `rdma_destroy_qp`.
    Cm(Arc<CmIdInner>),
}

/// A queue pair. Holds its PD, CQs, SRQ and (for rdma_cm QPs) its cm id
/// alive.
pub struct QueuePair {
    pub(super) qp: NonNull<ibv_qp>,
    qp_num: u32,
    qp_type: QpType,
    pub(super) caps: QpCaps,
    owner: Owner,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    pub(super) srq: Option<Arc<Srq>>,
}

// SAFETY: libibverbs QP verbs (post, modify, query) are thread-safe; the
// struct itself is immutable.
unsafe impl Send for QueuePair {}
// SAFETY: see `Send`.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("qp_type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}

fn zeroed_qp_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain C data (integers, and unions of
    // integers/byte arrays); all-zero is a valid value.
    unsafe { MaybeUninit::<ibv_qp_attr>::zeroed().assume_init() }
}

impl QueuePair {
    /// `ibv_create_qp` on `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, init: &QpInitAttr) -> Result<Arc<QueuePair>, Error> {
        init.check_context(pd)?;
        let mut raw = init.to_raw();
        // SAFETY: PD, CQs and SRQ are alive (the result holds Arcs of them);
        // `raw` is fully initialised; the call writes back the actual caps.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut raw) };
        let qp = NonNull::new(qp).ok_or_else(|| last_error_or(Error::NoMem))?;
        Ok(Arc::new(Self::wrap(qp, &raw, init, pd, Owner::Verbs)))
    }

    /// `rdma_create_qp` on a cm id (called by [`super::CmId::create_qp`]).
    pub(crate) fn new_cm(
        id: &Arc<CmIdInner>,
        pd: &Arc<ProtectionDomain>,
        init: &QpInitAttr,
    ) -> Result<Arc<QueuePair>, Error> {
        init.check_context(pd)?;
        let mut raw = init.to_raw();
        let qp = id.create_qp(pd, &mut raw)?;
        Ok(Arc::new(Self::wrap(
            qp,
            &raw,
            init,
            pd,
            Owner::Cm(Arc::clone(id)),
        )))
    }

    fn wrap(
        qp: NonNull<ibv_qp>,
        raw: &ibv_qp_init_attr,
        init: &QpInitAttr,
        pd: &Arc<ProtectionDomain>,
        owner: Owner,
    ) -> QueuePair {
        // SAFETY: a valid, freshly created QP; `qp_num` is immutable.
        let qp_num = unsafe { (*qp.as_ptr()).qp_num };
        QueuePair {
            qp,
            qp_num,
            qp_type: init.qp_type,
            caps: QpCaps::from_raw(&raw.cap),
            owner,
            pd: Arc::clone(pd),
            send_cq: Arc::clone(&init.send_cq),
            recv_cq: Arc::clone(&init.recv_cq),
            srq: init.srq.clone(),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_qp {
        self.qp.as_ptr()
    }

    /// QP number (give it to the peer).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Actual sizes, as returned by the provider (at least those requested).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Send CQ.
    pub fn send_cq(&self) -> &Arc<Cq> {
        &self.send_cq
    }

    /// Receive CQ.
    pub fn recv_cq(&self) -> &Arc<Cq> {
        &self.recv_cq
    }

    /// Shared receive queue, if any.
    pub fn srq(&self) -> Option<&Arc<Srq>> {
        self.srq.as_ref()
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask) -> Result<(), Error> {
        // SAFETY: the QP is alive while `self` is.
        unsafe { modify_raw(self.as_ptr(), attr, mask) }
    }

    /// RESET → INIT for an RC QP, allowing the peer `access`.
    pub fn modify_to_init(
        &self,
        port: u8,
        pkey_index: u16,
        access: AccessFlags,
    ) -> Result<(), Error> {
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = port;
        a.pkey_index = pkey_index;
        a.qp_access_flags = access.bits();
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR for an RC QP.
    pub fn modify_to_rtr(&self, p: &RcConnectParams) -> Result<(), Error> {
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = p.path_mtu.to_raw();
        a.dest_qp_num = p.dest_qp_num;
        a.rq_psn = p.rq_psn & 0x00ff_ffff;
        a.max_dest_rd_atomic = p.max_dest_rd_atomic;
        a.min_rnr_timer = p.min_rnr_timer;
        a.ah_attr = p.ah.to_raw();
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_AV
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS for an RC QP.
    pub fn modify_to_rts(&self, p: &RcConnectParams) -> Result<(), Error> {
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = p.sq_psn & 0x00ff_ffff;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.max_rd_atomic = p.max_rd_atomic;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    /// RESET → INIT → RTR → RTS for an RC QP (`Inval` on a UD QP).
    pub fn connect_rc(&self, p: &RcConnectParams) -> Result<(), Error> {
        if self.qp_type != QpType::Rc {
            return Err(Error::Inval);
        }
        self.modify_to_init(p.port, p.pkey_index, p.access)?;
        self.modify_to_rtr(p)?;
        self.modify_to_rts(p)
    }

    /// RESET → INIT (with `qkey`) → RTR → RTS for a UD QP (`Inval` on RC).
    pub fn activate_ud(
        &self,
        port: u8,
        pkey_index: u16,
        qkey: u32,
        sq_psn: u32,
    ) -> Result<(), Error> {
        if self.qp_type != QpType::Ud {
            return Err(Error::Inval);
        }
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = port;
        a.pkey_index = pkey_index;
        a.qkey = qkey;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_QKEY,
        )?;
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE)?;
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn & 0x00ff_ffff;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
        )
    }

    /// Moves the QP to the error state: outstanding work requests complete
    /// with `WrFlushErr`.
    pub fn to_error(&self) -> Result<(), Error> {
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Moves the QP back to RESET (clearing its queues).
    pub fn reset(&self) -> Result<(), Error> {
        let mut a = zeroed_qp_attr();
        a.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// `ibv_attach_mcast`: datagrams sent to multicast group `mgid`
    /// (`mlid` on IB, 0 on RoCE) reach this UD QP too. rdma_cm does this
    /// itself only for ids with a QP of their own (`rdma_create_qp`).
    pub fn attach_mcast(&self, mgid: Gid, mlid: u16) -> Result<(), Error> {
        let gid = mgid.to_raw();
        // SAFETY: the QP is alive; `gid` is valid for the call.
        check_ret(unsafe { ibv_attach_mcast(self.as_ptr(), &gid, mlid) })
    }

    /// `ibv_detach_mcast`: undoes [`attach_mcast`](Self::attach_mcast).
    pub fn detach_mcast(&self, mgid: Gid, mlid: u16) -> Result<(), Error> {
        let gid = mgid.to_raw();
        // SAFETY: as for `attach_mcast`.
        check_ret(unsafe { ibv_detach_mcast(self.as_ptr(), &gid, mlid) })
    }

    /// The RNR NAK timer code this QP answers senders with when it has
    /// no receive posted (`ibv_query_qp`).
    pub fn min_rnr_timer(&self) -> Result<u8, Error> {
        Ok(self
            .query(ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)?
            .min_rnr_timer)
    }

    /// `ibv_query_qp` of the attributes in `mask`.
    fn query(&self, mask: ibv_qp_attr_mask) -> Result<ibv_qp_attr, Error> {
        let mut a = zeroed_qp_attr();
        // SAFETY: all-zero is a valid ibv_qp_init_attr (null pointers and
        // integers).
        let mut init = unsafe { MaybeUninit::<ibv_qp_init_attr>::zeroed().assume_init() };
        let mask = i32::try_from(mask.0).map_err(|_| Error::Inval)?;
        // SAFETY: the QP is alive; both out-pointers are valid.
        check_ret(unsafe { ibv_query_qp(self.as_ptr(), &mut a, mask, &mut init) })?;
        Ok(a)
    }

    /// `ibv_query_qp` of the current state.
    pub fn state(&self) -> Result<QpState, Error> {
        let a = self.query(ibv_qp_attr_mask::IBV_QP_STATE)?;
        Ok(QpState::from_raw(a.qp_state))
    }

    /// The primary address vector as the device holds it (`ibv_query_qp`
    /// with `IBV_QP_AV`): what a connected QP's packets carry, e.g. the
    /// traffic class rdma_cm gave it. Meaningful once the QP is past RTR.
    pub fn address_vector(&self) -> Result<AhAttr, Error> {
        let a = self.query(ibv_qp_attr_mask::IBV_QP_AV)?;
        Ok(AhAttr::from_raw(&a.ah_attr))
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Verbs => {
                // SAFETY: created by ibv_create_qp, destroyed once.
                let ret = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
                if ret != 0 {
                    tracing::warn!(ret, qpn = self.qp_num, "ibv_destroy_qp failed");
                }
            }
            Owner::Cm(id) => id.destroy_qp(),
        }
    }
}

/// `ibv_modify_qp` of the fields of `attr` that `mask` selects.
///
/// # Safety
/// `qp` must be a live QP that nothing destroys during the call.
unsafe fn modify_raw(
    qp: *mut ibv_qp,
    attr: &mut ibv_qp_attr,
    mask: ibv_qp_attr_mask,
) -> Result<(), Error> {
    let mask = i32::try_from(mask.0).map_err(|_| Error::Inval)?;
    // SAFETY: the caller keeps `qp` alive; `attr` is fully initialised and
    // only the fields selected by `mask` are read.
    check_ret(unsafe { ibv_modify_qp(qp, attr, mask) })
}

/// Sets the RNR NAK timer code of an RC QP in RTS without changing its
/// state (RTS to RTS, where the timer is an optional attribute). A QP
/// that has already left RTS gives `Inval` (`EINVAL`).
///
/// # Safety
/// `qp` must be a live QP that nothing destroys during the call.
pub(super) unsafe fn set_min_rnr_timer(qp: *mut ibv_qp, code: u8) -> Result<(), Error> {
    let mut a = zeroed_qp_attr();
    a.min_rnr_timer = code;
    // SAFETY: the caller keeps `qp` alive; only `min_rnr_timer` is read.
    // Without `IBV_QP_STATE` in the mask libibverbs leaves `qp->state`
    // alone, so this does not race a concurrent move to the error state
    // (the kernel serialises the two modifies).
    unsafe { modify_raw(qp, &mut a, ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER) }
}

/// A shared receive queue (`ibv_srq`).
pub struct Srq {
    pub(super) srq: NonNull<ibv_srq>,
    pub(super) max_sge: u32,
    max_wr: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQ verbs (post_srq_recv, destroy) are thread-safe; the struct is
// immutable.
unsafe impl Send for Srq {}
// SAFETY: see `Send`.
unsafe impl Sync for Srq {}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl Srq {
    /// `ibv_create_srq` with room for `max_wr` receives of `max_sge`
    /// elements each.
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> Result<Arc<Srq>, Error> {
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is alive; `init` is initialised and gets the actual
        // sizes written back.
        let srq = unsafe { ibv_create_srq(pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| last_error_or(Error::NoMem))?;
        Ok(Arc::new(Srq {
            srq,
            max_sge: init.attr.max_sge.max(max_sge),
            max_wr: init.attr.max_wr.max(max_wr),
            pd: Arc::clone(pd),
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.srq.as_ptr()
    }

    /// Protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Number of receives it holds.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq, destroyed once; every QP using
        // it holds an Arc of it.
        let ret = unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_srq failed");
        }
    }
}

/// Finds the largest `max_inline_data` the device accepts for an RC QP by
/// creating throw-away QPs (doubling from 64 bytes, then bisecting, capped
/// at 64 KiB). Uses the value the provider reports back when it rounds up.
pub fn probe_max_inline_data(ctx: &Arc<Context>) -> Result<u32, Error> {
    const CAP: u32 = 64 * 1024;
    let pd = ProtectionDomain::new(ctx)?;
    let cq = Cq::new(ctx, 2, None)?;
    let try_inline = |n: u32| -> Result<u32, Error> {
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: Arc::clone(&cq),
            recv_cq: Arc::clone(&cq),
            srq: None,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: n,
            },
            sq_sig_all: false,
        };
        QueuePair::new(&pd, &init).map(|qp| qp.caps().max_inline_data.max(n))
    };
    let mut good = try_inline(0)?;
    let mut bad = None;
    let mut cand = 64u32;
    while cand <= CAP {
        match try_inline(cand) {
            Ok(actual) => {
                good = good.max(actual);
                cand = cand.saturating_mul(2);
            }
            Err(_) => {
                bad = Some(cand);
                break;
            }
        }
    }
    if let Some(mut bad) = bad {
        while bad > good + 1 {
            let mid = good + (bad - good) / 2;
            match try_inline(mid) {
                Ok(actual) => good = actual.max(mid).min(bad - 1),
                Err(_) => bad = mid,
            }
        }
    }
    Ok(good.min(CAP))
}
