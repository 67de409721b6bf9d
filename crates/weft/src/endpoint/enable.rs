//! Enabling an endpoint: the checks of fi_enable, the provider's
//! configuration, and how each kind of endpoint (plain, scalable, a
//! scalable endpoint's context) is opened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use weft_core::attr::EpType;
use weft_core::completion::WaitMode;
use weft_core::limits::ConnLimits;
use weft_core::provider::{EpConfig, ProviderEndpoint};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::{Endpoint, Live, Role, ENABLED};

impl Endpoint {
    /// Enables the endpoint. Connectionless endpoints need an AV (`NoAv`);
    /// every endpoint needs a transmit and a receive CQ or counter
    /// (`NoCq`); connection-oriented ones need an EQ (`NoEq`). A scalable
    /// endpoint's context needs its own direction's CQ or counter only,
    /// and its scalable endpoint enabled first (`OpBadState`); both run
    /// in `WaitMode::Interrupt` only, without shared contexts (`Inval`).
    ///
    /// After a critical error (a MSG connection's fatal fault, reported on
    /// the EQ) the endpoint is disabled: its operations are `OpBadState`
    /// and `enable` re-enables it where the provider can (tcp: an endpoint
    /// that connected may connect again; an accepting endpoint cannot be
    /// re-enabled, nor can verbs endpoints: `NoSys`).
    pub fn enable(&self) -> Result<()> {
        let _span = tracing::debug_span!("ep_enable", fid = self.inner.fid).entered();
        if self.inner.fault.is_raised() {
            let l = self.inner.live.get().ok_or(Error::OpBadState)?;
            l.prov.reenable()?;
            self.inner.fault.clear();
            return Ok(());
        }
        let b = self.binds_mut()?;
        let ep_type = self.inner.info.ep_attr.ep_type;
        let role = &self.inner.role;
        let is_ctx = matches!(role, Role::Ctx { .. });
        if !ep_type.is_connected() && b.av.is_none() && !is_ctx {
            return Err(Error::NoAv);
        }
        let no_tx = b.tx_cq.is_none() && b.send_cntr.is_none();
        let no_rx = b.rx_cq.is_none() && b.recv_cntr.is_none();
        let no_cq = match role {
            // A socket-style stream endpoint moves its data through its
            // stream, never through a queue.
            Role::Plain => ep_type != EpType::SockStream && (no_tx || no_rx),
            // Its contexts complete on their own queues.
            Role::Scalable => false,
            Role::Ctx { tx, .. } => (*tx && no_tx) || (!*tx && no_rx),
        };
        if no_cq {
            return Err(Error::NoCq);
        }
        if ep_type.is_connected() && b.eq.is_none() {
            return Err(Error::NoEq);
        }
        // A context's receives complete through whichever endpoint a
        // message reaches; in inline mode nothing would drive that one
        // while the application awaits the context. Likewise the
        // contexts of a scalable endpoint are fed by its readers.
        if (b.srx.is_some() || !matches!(role, Role::Plain)) && b.wait != WaitMode::Interrupt {
            return Err(Error::Inval);
        }
        // A scalable endpoint's contexts are its receive and transmit
        // queues: shared ones have no place there.
        if !matches!(role, Role::Plain) && (b.srx.is_some() || b.stx.is_some()) {
            return Err(Error::Inval);
        }
        let info = &self.inner.info;
        let src_addr = b
            .src_addr
            .as_deref()
            .map(|a| crate::addrfmt::to_raw(info, a))
            .transpose()?;
        let av = match role {
            Role::Ctx { sep, .. } => sep.av_table(),
            _ => b.av.as_ref().map(|a| a.inner.table.clone()),
        };
        let cfg = EpConfig {
            fid: self.inner.fid,
            context: b.context,
            info: crate::addrfmt::provider_info(info)?,
            av,
            eq: b.eq.clone(),
            wait: b.wait,
            src_addr,
            conn: self.inner.conn.clone(),
            domain: self.inner.domain.inner.prov.clone(),
            rx_cq: b.rx_cq.as_ref().map(|(c, _)| c.clone()),
            rx_cntr: b.recv_cntr.clone(),
            remote_cntrs: b.remote_cntrs.clone(),
            srx: b.srx.as_ref().map(|s| s.inner.prov.clone()),
            stx: b.stx.as_ref().map(|s| s.inner.prov.clone()),
            limits: b.limits.unwrap_or_else(ConnLimits::from_env),
            fault: self.inner.fault.clone(),
        };
        let prov = {
            let _rt = self.inner.domain.rt().enter();
            let prov = self.inner.domain.fabric().prov();
            match role {
                Role::Plain => prov.open_endpoint(cfg)?,
                Role::Scalable => prov.open_scalable(cfg)?,
                Role::Ctx { sep, tx, index } => sep.open_ctx(*tx, *index, cfg)?,
            }
        };
        // Busy-poll waiters drive progress too: the provider's spinning
        // thread parks while they do (weft_core::progress::SpinHold).
        let inline = if b.wait != WaitMode::Interrupt {
            prov.progress_hook()
        } else {
            None
        };
        if let Some(h) = &inline {
            for (cq, _) in [&b.tx_cq, &b.rx_cq].into_iter().flatten() {
                cq.add_progress(h);
            }
        }
        let live = Live {
            prov,
            tx_cq: b.tx_cq.clone(),
            rx_cq: b.rx_cq.clone(),
            send_cntr: b.send_cntr.clone(),
            recv_cntr: b.recv_cntr.clone(),
            read_cntr: b.read_cntr.clone(),
            write_cntr: b.write_cntr.clone(),
            tx_op_flags: AtomicU64::new(b.tx_op_flags.bits()),
            rx_op_flags: AtomicU64::new(b.rx_op_flags.bits()),
            inline,
            srx: b.srx.clone(),
        };
        drop(b);
        self.inner.live.set(live).map_err(|_| Error::OpBadState)?;
        self.inner.state.store(ENABLED, Ordering::Release);
        Ok(())
    }

    /// A context's hold on its scalable endpoint, kept until it closes.
    pub(crate) fn set_sep_hold(&self, hold: crate::scalable::CtxHold) {
        lock(&self.inner.binds).sep_hold = Some(hold);
    }

    /// The provider endpoint, once enabled (`OpBadState` before).
    pub(crate) fn prov(&self) -> Result<Arc<dyn ProviderEndpoint>> {
        Ok(self.live()?.prov.clone())
    }

    /// The bound AV's table.
    pub(crate) fn av_table(&self) -> Option<Arc<std::sync::Mutex<weft_core::av::AvTable>>> {
        lock(&self.inner.binds)
            .av
            .as_ref()
            .map(|a| a.inner.table.clone())
    }
}
