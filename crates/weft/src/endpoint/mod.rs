//! Endpoints: the fi_endpoint(3) state machine (binds, enable, close) and
//! the connection calls; the data path is in [`data`].

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::channel::oneshot;
use weft_core::attr::{EpType, Info};
use weft_core::completion::{CqShared, Finished, OpDone, WaitMode, Waiter};
use weft_core::counter::CounterShared;
use weft_core::eventq::{ConnHandle, EqShared};
use weft_core::flags::{BindFlags, Caps, OpFlags};
use weft_core::limits::ConnLimits;
use weft_core::progress::Progress;
use weft_core::provider::{EpStats, Fault, ProviderEndpoint};
use weft_core::sync::{lock, Bound};
use weft_core::{Error, Result};

use crate::av::AddressVector;
use crate::counter::Counter;
use crate::cq::CompletionQueue;
use crate::eq::EventQueue;
use crate::fabric::{next_fid, Domain};
use crate::opfuture::{OnDrop, OpFuture, Owner};
use crate::srx::SharedRxContext;

mod data;
pub(crate) use data::{peek_flags_ok, OpResult};
pub(crate) use multi::{check_multi, post_multi, post_stream};
mod enable;
mod multi;

pub use multi::{MultiMsg, MultiRecv, MultiRecvBuf};

const DISABLED: u8 = 0;
const ENABLED: u8 = 1;
const CLOSED: u8 = 2;

/// Contexts of `async` operations live in the top half of the space so
/// they never collide with an application's `post_*` contexts; contexts
/// with bit 63 set are reserved.
static NEXT_ASYNC_CTX: AtomicU64 = AtomicU64::new(1 << 63);

#[derive(Debug, Default)]
struct Binds {
    av: Option<AddressVector>,
    eq: Option<Arc<EqShared>>,
    tx_cq: Option<(Arc<CqShared>, bool)>,
    rx_cq: Option<(Arc<CqShared>, bool)>,
    send_cntr: Option<Arc<CounterShared>>,
    recv_cntr: Option<Arc<CounterShared>>,
    read_cntr: Option<Arc<CounterShared>>,
    write_cntr: Option<Arc<CounterShared>>,
    /// Remote accesses completed at this endpoint (`FI_RMA_EVENT`).
    remote_cntrs: weft_core::provider::RemoteCntrs,
    tx_op_flags: OpFlags,
    rx_op_flags: OpFlags,
    wait: WaitMode,
    src_addr: Option<Vec<u8>>,
    context: u64,
    srx: Option<SharedRxContext>,
    stx: Option<crate::stx::SharedTxContext>,
    /// `None`: the environment's limits, read at enable.
    limits: Option<ConnLimits>,
    /// One per bound queue: a bound CQ or EQ cannot be closed (`Busy`).
    holds: Vec<Bound>,
    /// A context's hold on its scalable endpoint, which cannot close
    /// while it is open.
    sep_hold: Option<crate::scalable::CtxHold>,
}

/// Endpoint options (`fi_getopt`/`fi_setopt`, level `FI_OPT_ENDPOINT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EpOpt {
    /// `FI_OPT_MIN_MULTI_RECV`: the free space below which a multi-receive
    /// buffer is released.
    MinMultiRecv,
    /// `FI_OPT_CM_DATA_SIZE`: connection-manager data size (read-only).
    CmDataSize,
    /// `FI_OPT_BUFFERED_MIN`: bytes of a message delivered before it is
    /// matched (`FI_BUFFERED_RECV` mode).
    BufferedMin,
    /// `FI_OPT_BUFFERED_LIMIT`: the largest message buffered whole
    /// (`FI_BUFFERED_RECV` mode).
    BufferedLimit,
}

/// What the data path needs, fixed at enable.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) prov: Arc<dyn ProviderEndpoint>,
    pub(crate) tx_cq: Option<(Arc<CqShared>, bool)>,
    pub(crate) rx_cq: Option<(Arc<CqShared>, bool)>,
    send_cntr: Option<Arc<CounterShared>>,
    recv_cntr: Option<Arc<CounterShared>>,
    /// Initiated RMA reads and writes (`FI_READ`, `FI_WRITE` binds).
    pub(crate) read_cntr: Option<Arc<CounterShared>>,
    pub(crate) write_cntr: Option<Arc<CounterShared>>,
    /// Default flags; `FI_SETOPSFLAG` may change them after enable too.
    tx_op_flags: AtomicU64,
    rx_op_flags: AtomicU64,
    /// Inline and busy-poll modes: awaited operations drive the endpoint
    /// themselves.
    pub(crate) inline: Option<Arc<dyn Progress>>,
    /// The shared receive context receives go to.
    pub(crate) srx: Option<SharedRxContext>,
}

impl Live {
    /// `flags` of a transmit operation with the endpoint's defaults.
    pub(crate) fn tx_flags(&self, flags: OpFlags) -> OpFlags {
        flags | OpFlags::from_bits_retain(self.tx_op_flags.load(Ordering::Acquire))
    }

    /// `flags` of a receive with the endpoint's defaults.
    pub(crate) fn rx_flags(&self, flags: OpFlags) -> OpFlags {
        flags | OpFlags::from_bits_retain(self.rx_op_flags.load(Ordering::Acquire))
    }

    /// The future of an `async` operation posted with `ctx`; `on_drop`
    /// says what dropping it does (receives are withdrawn).
    pub(crate) fn op_future(
        &self,
        ctx: u64,
        rx: oneshot::Receiver<Finished>,
        on_drop: OnDrop,
    ) -> OpFuture {
        // Sends and RMA have nothing to withdraw: no handle to hold.
        let owner = (on_drop != OnDrop::Nothing).then(|| Owner::Ep(self.prov.clone()));
        OpFuture::new(rx, ctx, owner, on_drop, self.inline.clone())
    }
}

/// Where the completion of an operation posted with `flags` (defaults
/// merged) goes: to the bound queue `cq` (and whether that queue is
/// selective), reported on success unless the queue is selective and
/// `FI_COMPLETION` is absent; and to `cntr`.
pub(crate) fn op_done(
    cq: &Option<(Arc<CqShared>, bool)>,
    context: u64,
    kind: OpFlags,
    flags: OpFlags,
    cntr: Option<Arc<CounterShared>>,
    waiter: Option<Waiter>,
) -> OpDone {
    let (cq, selective) = cq.clone().map_or((None, false), |(c, s)| (Some(c), s));
    OpDone {
        context,
        flags: kind,
        report: !selective || flags.contains(OpFlags::COMPLETION),
        cq,
        cntr,
        waiter,
    }
}

/// A context for an `async` operation, and the channel its completion
/// comes back on.
pub(crate) fn async_op() -> (u64, Waiter, oneshot::Receiver<Finished>) {
    let ctx = NEXT_ASYNC_CTX.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    (ctx, tx, rx)
}

/// An endpoint. Created disabled: bind an AV (connectionless types), CQs
/// or counters, and an EQ (connection-oriented types), then `enable`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    inner: Arc<EpInner>,
}

/// What kind of endpoint: how `enable` opens it.
#[derive(Debug)]
pub(crate) enum Role {
    /// `fi_endpoint`.
    Plain,
    /// `fi_scalable_ep`: carries no data operations itself.
    Scalable,
    /// A transmit (`tx`) or receive context of a scalable endpoint.
    Ctx {
        sep: Arc<crate::scalable::SepInner>,
        tx: bool,
        index: usize,
    },
}

#[derive(Debug)]
struct EpInner {
    fid: u64,
    domain: Domain,
    info: Info,
    role: Role,
    conn: Option<ConnHandle>,
    state: AtomicU8,
    binds: Mutex<Binds>,
    live: OnceLock<Live>,
    /// Raised by the provider on a critical error: disabled until
    /// `enable` re-enables.
    fault: Arc<Fault>,
    /// `FI_OPT_MIN_MULTI_RECV`, taken by each multi-receive when posted.
    min_multi_recv: std::sync::atomic::AtomicUsize,
}

impl Drop for EpInner {
    fn drop(&mut self) {
        if let Some(l) = self.live.get() {
            l.prov.close();
        }
        let b = lock(&self.binds);
        if let Some(av) = &b.av {
            av.inner.bound_eps.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(srx) = &b.srx {
            srx.inner.state.unbind();
        }
        if let Some(stx) = &b.stx {
            stx.inner.state.unbind();
        }
    }
}

impl Endpoint {
    pub(crate) fn new(domain: Domain, info: Info, conn: Option<ConnHandle>) -> Result<Endpoint> {
        Self::with_role(domain, info, conn, Role::Plain)
    }

    pub(crate) fn with_role(
        domain: Domain,
        info: Info,
        conn: Option<ConnHandle>,
        role: Role,
    ) -> Result<Endpoint> {
        let mut info = info;
        // The endpoint's key: its own, else its domain's (fi_endpoint(3)),
        // so the provider finds it in one place.
        if info.ep_attr.auth_key.is_none() {
            info.ep_attr.auth_key = domain.info().domain_attr.auth_key.clone();
        }
        crate::fabric::check_keys(
            domain.fabric().prov(),
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        // On an `FI_AV_AUTH_KEY` domain RDM (and udp DGRAM) endpoints
        // take their keys from the AV when they are enabled, and may have
        // none of their own.
        info.domain_attr.av_auth_key = domain.info().domain_attr.av_auth_key;
        if info.domain_attr.av_auth_key
            && info.ep_attr.ep_type.takes_av_keys()
            && info.ep_attr.auth_key.is_some()
        {
            return Err(Error::Inval);
        }
        // TLS is the domain's: its endpoints run what it was opened with
        // (checked then, environment included). Files of the endpoint's
        // own are checked now.
        if info.domain_attr.tls.is_none() {
            info.domain_attr.tls = domain.info().domain_attr.tls.clone();
        } else if info.domain_attr.tls != domain.info().domain_attr.tls {
            crate::fabric::check_tls(domain.fabric().prov(), &info)?;
        }
        match info.ep_attr.ep_type {
            EpType::Rdm | EpType::Msg | EpType::Dgram | EpType::SockStream | EpType::SockDgram => {}
            EpType::Unspec => return Err(Error::Inval),
            _ => return Err(Error::NoSys),
        }
        // A traffic class that is neither a DSCP value nor a label.
        weft_core::tclass::to_dscp(info.tx_attr.tclass)?;
        // Default flags the provider would not honour (multi-receive,
        // fences, multicast, completion levels it cannot give) are
        // refused here rather than ignored on every operation.
        if !info
            .tx_attr
            .op_flags_supported
            .contains(info.tx_attr.op_flags)
            || !info
                .rx_attr
                .op_flags_supported
                .contains(info.rx_attr.op_flags)
            || (info.tx_attr.op_flags & OpFlags::COMPLETION_LEVELS)
                .bits()
                .count_ones()
                > 1
        {
            return Err(Error::BadFlags);
        }
        // Caps granted on request change what operations report
        // (FI_SOURCE_ERR: how messages from unknown senders complete;
        // FI_RMA_EVENT: remote accesses counted): only where the provider
        // offers them, never by an info made up for a provider without.
        let asked = info.caps & Caps::ON_REQUEST;
        if !asked.is_empty() {
            let offered = domain
                .fabric()
                .prov()
                .offers()
                .iter()
                .any(|o| o.ep_attr.ep_type == info.ep_attr.ep_type && o.caps.contains(asked));
            if !offered {
                return Err(Error::NoSys);
            }
        }
        if info.caps.contains(Caps::SOURCE_ERR) && !info.caps.contains(Caps::SOURCE) {
            return Err(Error::Inval);
        }
        let binds = Binds {
            tx_op_flags: info.tx_attr.op_flags,
            rx_op_flags: info.rx_attr.op_flags,
            src_addr: info.src_addr.clone(),
            ..Binds::default()
        };
        Ok(Endpoint {
            inner: Arc::new(EpInner {
                fid: next_fid(),
                domain,
                info,
                role,
                conn,
                state: AtomicU8::new(DISABLED),
                binds: Mutex::new(binds),
                live: OnceLock::new(),
                fault: Arc::default(),
                min_multi_recv: std::sync::atomic::AtomicUsize::new(
                    weft_core::multi_recv::DEFAULT_MIN_MULTI_RECV,
                ),
            }),
        })
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.fid
    }

    /// The domain it belongs to.
    pub(crate) fn domain(&self) -> Domain {
        self.inner.domain.clone()
    }

    /// The object id of the domain it belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.inner.domain.fid()
    }

    /// The endpoint's attributes.
    pub fn info(&self) -> &Info {
        &self.inner.info
    }

    /// True once enabled (and not closed).
    /// Enabled, and not disabled since by a critical error.
    pub fn is_enabled(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == ENABLED && !self.inner.fault.is_raised()
    }

    /// The bound EQ, if any.
    pub(crate) fn bound_eq(&self) -> Option<Arc<EqShared>> {
        lock(&self.inner.binds).eq.clone()
    }

    fn binds_mut(&self) -> Result<std::sync::MutexGuard<'_, Binds>> {
        if self.inner.state.load(Ordering::Acquire) != DISABLED {
            return Err(Error::OpBadState);
        }
        Ok(lock(&self.inner.binds))
    }

    /// Binds an AV (flags must be empty). Connectionless endpoints need one.
    pub fn bind_av(&self, av: &AddressVector) -> Result<()> {
        if av.inner.domain.fid() != self.inner.domain.fid() {
            return Err(Error::Domain);
        }
        // A context sends and receives through its scalable endpoint's AV.
        if self.inner.info.ep_attr.ep_type.is_connected()
            || matches!(self.inner.role, Role::Ctx { .. })
        {
            return Err(Error::Inval);
        }
        let mut b = self.binds_mut()?;
        if b.av.is_some() {
            return Err(Error::Inval);
        }
        av.inner.bound_eps.fetch_add(1, Ordering::AcqRel);
        b.av = Some(av.clone());
        Ok(())
    }

    /// Binds an EQ for connection and error events.
    pub fn bind_eq(&self, eq: &EventQueue) -> Result<()> {
        let mut b = self.binds_mut()?;
        if b.eq.is_some() {
            return Err(Error::Inval);
        }
        b.eq = Some(eq.shared.clone());
        b.holds.push(eq.shared.bound.hold());
        Ok(())
    }

    /// Binds a CQ for `TRANSMIT` and/or `RECV` completions, optionally with
    /// `SELECTIVE_COMPLETION`. One CQ per direction.
    pub fn bind_cq(&self, cq: &CompletionQueue, flags: BindFlags) -> Result<()> {
        let allowed = BindFlags::TRANSMIT | BindFlags::RECV | BindFlags::SELECTIVE_COMPLETION;
        if !allowed.contains(flags) || !flags.intersects(BindFlags::TRANSMIT | BindFlags::RECV) {
            return Err(Error::BadFlags);
        }
        if cq.domain != self.inner.domain.fid() {
            return Err(Error::Domain);
        }
        let mut b = self.binds_mut()?;
        let sel = flags.contains(BindFlags::SELECTIVE_COMPLETION);
        if (flags.contains(BindFlags::TRANSMIT) && b.tx_cq.is_some())
            || (flags.contains(BindFlags::RECV) && b.rx_cq.is_some())
        {
            return Err(Error::Inval);
        }
        if flags.contains(BindFlags::TRANSMIT) {
            b.tx_cq = Some((cq.shared.clone(), sel));
        }
        if flags.contains(BindFlags::RECV) {
            b.rx_cq = Some((cq.shared.clone(), sel));
        }
        b.holds.push(cq.shared.bound.hold());
        Ok(())
    }

    /// Binds a counter to `SEND` and/or `RECV` completions, to the RMA
    /// reads (`READ`) and writes (`WRITE`) this endpoint initiates, or to
    /// the remote accesses peers complete at it: `REMOTE_READ` counts
    /// their RMA reads and fetching or compare atomics, `REMOTE_WRITE`
    /// their RMA writes (with or without remote CQ data) and plain
    /// atomics (fi_endpoint(3)), each once it is complete at this
    /// endpoint (the bytes written are in place, the bytes read copied
    /// out). Refused accesses count nothing here: they never completed,
    /// and their initiator gets the error. `READ`/`WRITE` need the RMA
    /// capability and `REMOTE_*` the endpoint's `FI_RMA_EVENT` (tcp, on
    /// request), else `NoSys`; `BadFlags` for no flag or
    /// `SELECTIVE_COMPLETION`; `Domain` for another domain's counter;
    /// `Inval` for a direction bound already.
    pub fn bind_counter(&self, c: &Counter, flags: BindFlags) -> Result<()> {
        let rma =
            BindFlags::READ | BindFlags::WRITE | BindFlags::REMOTE_READ | BindFlags::REMOTE_WRITE;
        if flags.is_empty() || flags.contains(BindFlags::SELECTIVE_COMPLETION) {
            return Err(Error::BadFlags);
        }
        if flags.intersects(rma) {
            let caps = self.inner.info.caps;
            let need_event = flags.intersects(BindFlags::REMOTE_READ | BindFlags::REMOTE_WRITE);
            if !caps.contains(Caps::RMA) || (need_event && !caps.contains(Caps::RMA_EVENT)) {
                return Err(Error::NoSys);
            }
        }
        if c.domain != self.inner.domain.fid() {
            return Err(Error::Domain);
        }
        let mut b = self.binds_mut()?;
        if (flags.contains(BindFlags::SEND) && b.send_cntr.is_some())
            || (flags.contains(BindFlags::RECV) && b.recv_cntr.is_some())
            || (flags.contains(BindFlags::READ) && b.read_cntr.is_some())
            || (flags.contains(BindFlags::WRITE) && b.write_cntr.is_some())
            || (flags.contains(BindFlags::REMOTE_READ) && b.remote_cntrs.read.is_some())
            || (flags.contains(BindFlags::REMOTE_WRITE) && b.remote_cntrs.write.is_some())
        {
            return Err(Error::Inval);
        }
        if flags.contains(BindFlags::REMOTE_READ) {
            b.remote_cntrs.read = Some(c.shared.clone());
        }
        if flags.contains(BindFlags::REMOTE_WRITE) {
            b.remote_cntrs.write = Some(c.shared.clone());
        }
        if flags.contains(BindFlags::READ) {
            b.read_cntr = Some(c.shared.clone());
        }
        if flags.contains(BindFlags::WRITE) {
            b.write_cntr = Some(c.shared.clone());
        }
        if flags.contains(BindFlags::SEND) {
            b.send_cntr = Some(c.shared.clone());
        }
        if flags.contains(BindFlags::RECV) {
            b.recv_cntr = Some(c.shared.clone());
        }
        Ok(())
    }

    /// Binds a shared receive context (before enable): the endpoint then
    /// takes every message it receives into the context's receives, and
    /// receives posted on the endpoint go there. `NoSys` for endpoints
    /// whose offer has no shared contexts (`max_ep_srx_ctx` 0), `Domain`
    /// for another domain's context, `Inval` for a second one.
    pub fn bind_srx(&self, srx: &SharedRxContext) -> Result<()> {
        if self.inner.info.domain_attr.max_ep_srx_ctx == 0 {
            return Err(Error::NoSys);
        }
        srx.inner.state.bindable(self.inner.domain.fid())?;
        let mut b = self.binds_mut()?;
        if b.srx.is_some() {
            return Err(Error::Inval);
        }
        srx.inner.state.bind();
        b.srx = Some(srx.clone());
        Ok(())
    }

    /// The shared transmit context half of `bind_stx` (`stx.rs`).
    pub(crate) fn set_stx(&self, stx: &crate::stx::SharedTxContext) -> Result<()> {
        let mut b = self.binds_mut()?;
        if b.stx.is_some() {
            return Err(Error::Inval);
        }
        stx.inner.state.bind();
        b.stx = Some(stx.clone());
        Ok(())
    }

    /// Chooses how the endpoint makes progress (before enable).
    pub fn set_wait_mode(&self, wait: WaitMode) -> Result<()> {
        self.binds_mut()?.wait = wait;
        Ok(())
    }

    /// Sets the local address to bind (raw bytes), before enable.
    pub fn set_src_addr(&self, addr: Vec<u8>) -> Result<()> {
        self.binds_mut()?.src_addr = Some(addr);
        Ok(())
    }

    /// Sets what peers may make this endpoint hold (connections, buffered
    /// bytes, idle and stall timeouts), before enable. Without it the
    /// endpoint takes [`ConnLimits::from_env`] at enable.
    pub fn set_conn_limits(&self, limits: ConnLimits) -> Result<()> {
        self.binds_mut()?.limits = Some(limits);
        Ok(())
    }

    /// Sets the context reported with this endpoint's EQ events.
    pub fn set_context(&self, context: u64) -> Result<()> {
        self.binds_mut()?.context = context;
        Ok(())
    }

    /// `FI_SETOPSFLAG`: default flags for `TRANSMIT` xor `RECV` operations.
    pub fn set_op_flags(&self, side: OpFlags, flags: OpFlags) -> Result<()> {
        let mut b = lock(&self.inner.binds);
        match (
            side.contains(OpFlags::TRANSMIT),
            side.contains(OpFlags::RECV),
        ) {
            (true, false) if self.inner.info.tx_attr.op_flags_supported.contains(flags) => {
                b.tx_op_flags = flags;
                if let Some(l) = self.inner.live.get() {
                    l.tx_op_flags.store(flags.bits(), Ordering::Release);
                }
            }
            (false, true) if self.inner.info.rx_attr.op_flags_supported.contains(flags) => {
                b.rx_op_flags = flags;
                if let Some(l) = self.inner.live.get() {
                    l.rx_op_flags.store(flags.bits(), Ordering::Release);
                }
            }
            (true, false) | (false, true) => return Err(Error::BadFlags),
            _ => return Err(Error::Inval),
        }
        Ok(())
    }

    /// `FI_GETOPSFLAG` for `TRANSMIT` xor `RECV`.
    pub fn op_flags(&self, side: OpFlags) -> Result<OpFlags> {
        let b = lock(&self.inner.binds);
        match (
            side.contains(OpFlags::TRANSMIT),
            side.contains(OpFlags::RECV),
        ) {
            (true, false) => Ok(b.tx_op_flags),
            (false, true) => Ok(b.rx_op_flags),
            _ => Err(Error::Inval),
        }
    }

    /// `FI_OPT_CM_DATA_SIZE` (read-only).
    pub fn cm_data_size(&self) -> usize {
        self.inner.info.ep_attr.cm_data_size
    }

    /// `fi_getopt` at `FI_OPT_ENDPOINT` level. An option the endpoint does
    /// not have is `NoProtoOpt`: `CmDataSize` exists on connection-oriented
    /// endpoints; `MinMultiRecv` on endpoints with `FI_MULTI_RECV` (16 KiB
    /// unless set), and the `Buffered*` options need the
    /// `FI_BUFFERED_RECV` mode, which no offer has yet.
    pub fn getopt(&self, opt: EpOpt) -> Result<usize> {
        let info = &self.inner.info;
        match opt {
            EpOpt::CmDataSize if info.ep_attr.ep_type.is_connected() => {
                Ok(info.ep_attr.cm_data_size)
            }
            EpOpt::MinMultiRecv if info.caps.contains(Caps::MULTI_RECV) => {
                Ok(self.min_multi_recv())
            }
            EpOpt::CmDataSize | EpOpt::MinMultiRecv | EpOpt::BufferedMin | EpOpt::BufferedLimit => {
                Err(Error::NoProtoOpt)
            }
        }
    }

    /// `fi_setopt` at `FI_OPT_ENDPOINT` level: `NoSys` for the read-only
    /// `CmDataSize`, `NoProtoOpt` for an option the endpoint does not
    /// have (see [`getopt`](Self::getopt)). `MinMultiRecv` applies to
    /// multi-receives posted after it (before or after enable), and takes
    /// 0 up to `max_msg_size` (`MsgSize` above).
    pub fn setopt(&self, opt: EpOpt, value: usize) -> Result<()> {
        let info = &self.inner.info;
        match opt {
            EpOpt::CmDataSize if info.ep_attr.ep_type.is_connected() => Err(Error::NoSys),
            EpOpt::MinMultiRecv if info.caps.contains(Caps::MULTI_RECV) => {
                if value > info.ep_attr.max_msg_size {
                    return Err(Error::MsgSize);
                }
                self.inner.min_multi_recv.store(value, Ordering::Release);
                Ok(())
            }
            EpOpt::CmDataSize | EpOpt::MinMultiRecv | EpOpt::BufferedMin | EpOpt::BufferedLimit => {
                Err(Error::NoProtoOpt)
            }
        }
    }

    /// The `FI_OPT_MIN_MULTI_RECV` in force now.
    pub(crate) fn min_multi_recv(&self) -> usize {
        self.inner.min_multi_recv.load(Ordering::Acquire)
    }

    /// The runtime of the endpoint's domain.
    pub(crate) fn domain_rt(&self) -> tokio::runtime::Handle {
        self.inner.domain.rt().clone()
    }

    pub(crate) fn live(&self) -> Result<&Live> {
        if self.inner.state.load(Ordering::Acquire) != ENABLED || self.inner.fault.is_raised() {
            return Err(Error::OpBadState);
        }
        self.inner.live.get().ok_or(Error::OpBadState)
    }

    /// The bound local address, raw bytes (after enable).
    /// (In the string form on an `FI_ADDR_STR` domain.)
    pub fn local_addr(&self) -> Result<Vec<u8>> {
        let raw = self.live()?.prov.local_addr();
        Ok(crate::addrfmt::to_user(&self.inner.info, raw))
    }

    /// What the endpoint holds on its peers' behalf now (connections,
    /// parked readers, buffered unexpected bytes), after enable.
    pub fn stats(&self) -> Result<EpStats> {
        Ok(self.live()?.prov.stats())
    }

    /// The connected peer's address (MSG, once connected).
    pub fn peer_addr(&self) -> Result<Vec<u8>> {
        let raw = self.live()?.prov.peer_addr().ok_or(Error::NotConn)?;
        Ok(crate::addrfmt::to_user(&self.inner.info, raw))
    }

    /// Room in the transmit queue (deprecated in libfabric, kept).
    pub fn tx_size_left(&self) -> Result<usize> {
        Ok(self.live()?.prov.tx_size_left())
    }

    /// Room in the receive queue.
    pub fn rx_size_left(&self) -> Result<usize> {
        Ok(self.live()?.prov.rx_size_left())
    }

    /// MSG: connects to `dest` (raw address) with CM data; resolves with the
    /// peer's CM data. A `Connected` event is queued on the EQ as well.
    pub async fn connect(&self, dest: Vec<u8>, cm_data: Vec<u8>) -> Result<Vec<u8>> {
        if !self.inner.info.ep_attr.ep_type.is_connected() {
            return Err(Error::NoSys);
        }
        self.enable_if_disabled()?;
        let dest = crate::addrfmt::to_raw(&self.inner.info, &dest)?;
        let prov = self.live()?.prov.clone();
        prov.connect(dest, cm_data).await
    }

    /// MSG: accepts the request this endpoint was created for.
    pub async fn accept(&self, cm_data: Vec<u8>) -> Result<()> {
        if self.inner.conn.is_none() {
            return Err(Error::Inval);
        }
        self.enable_if_disabled()?;
        let prov = self.live()?.prov.clone();
        prov.accept(cm_data).await
    }

    /// fi_endpoint(3): `connect` and `accept` enable an endpoint that is
    /// not enabled yet (with `enable`'s checks and errors).
    fn enable_if_disabled(&self) -> Result<()> {
        if self.inner.state.load(Ordering::Acquire) != DISABLED {
            return Ok(());
        }
        match self.enable() {
            // Enabled meanwhile by another caller: what we wanted.
            Err(Error::OpBadState) if self.inner.state.load(Ordering::Acquire) == ENABLED => Ok(()),
            r => r,
        }
    }

    /// MSG: orderly shutdown; the peer gets a `Shutdown` event.
    pub fn shutdown(&self) -> Result<()> {
        self.live()?.prov.shutdown()
    }

    /// `fi_close`: outstanding operations are discarded without
    /// completions. Closing twice is `OpBadState`.
    pub fn close(&self) -> Result<()> {
        let prev = self.inner.state.swap(CLOSED, Ordering::AcqRel);
        if prev == CLOSED {
            return Err(Error::OpBadState);
        }
        if let Some(l) = self.inner.live.get() {
            l.prov.close();
        }
        let mut b = lock(&self.inner.binds);
        if let Some(av) = b.av.take() {
            av.inner.bound_eps.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(srx) = b.srx.take() {
            srx.inner.state.unbind();
        }
        if let Some(stx) = b.stx.take() {
            stx.inner.state.unbind();
        }
        b.holds.clear();
        b.sep_hold = None;
        Ok(())
    }
}
