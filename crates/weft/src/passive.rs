//! Passive endpoints: listen for MSG connection requests.

use std::sync::{Arc, Mutex};

use weft_core::attr::{EpType, Info};
use weft_core::eventq::EqShared;
use weft_core::provider::{PassiveConfig, ProviderPassive};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::eq::{ConnRequest, EventQueue};
use crate::fabric::{next_fid, Fabric};

/// A listening endpoint. Bind an EQ, `listen`, then read `ConnReq`
/// events from the EQ; accept through `Domain::accept_endpoint` or
/// `reject`.
#[derive(Debug)]
pub struct PassiveEndpoint {
    fid: u64,
    fabric: Fabric,
    info: Info,
    addr: Option<Vec<u8>>,
    /// The bound EQ, and the binding that keeps it from being closed
    /// under the listener.
    eq: Mutex<Option<(Arc<EqShared>, weft_core::sync::Bound)>>,
    backlog: Mutex<u32>,
    limits: Mutex<Option<weft_core::limits::ConnLimits>>,
    prov: Mutex<Option<Arc<dyn ProviderPassive>>>,
    context: u64,
}

impl PassiveEndpoint {
    pub(crate) fn new(
        fabric: Fabric,
        info: Info,
        addr: Option<Vec<u8>>,
    ) -> Result<PassiveEndpoint> {
        if !matches!(info.ep_attr.ep_type, EpType::Msg | EpType::SockStream) {
            return Err(Error::Inval);
        }
        // The listener's key is what connecting endpoints must prove.
        crate::fabric::check_keys(
            fabric.prov(),
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        crate::fabric::check_tls(fabric.prov(), &info)?;
        Ok(PassiveEndpoint {
            fid: next_fid(),
            fabric,
            info,
            addr,
            eq: Mutex::new(None),
            backlog: Mutex::new(128),
            limits: Mutex::new(None),
            prov: Mutex::new(None),
            context: 0,
        })
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.fid
    }

    /// The endpoint info.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// Binds the EQ that receives connection requests.
    pub fn bind_eq(&self, eq: &EventQueue) -> Result<()> {
        if lock(&self.prov).is_some() {
            return Err(Error::OpBadState);
        }
        *lock(&self.eq) = Some((eq.shared.clone(), eq.shared.bound.hold()));
        Ok(())
    }

    /// `FI_BACKLOG`: pending-connection limit, before `listen`.
    pub fn set_backlog(&self, backlog: u32) -> Result<()> {
        if backlog == 0 {
            return Err(Error::Inval);
        }
        if let Some(p) = lock(&self.prov).as_ref() {
            return p.set_backlog(backlog as usize);
        }
        *lock(&self.backlog) = backlog;
        Ok(())
    }

    /// Sets how many connection requests may be pending at once
    /// (`max_conns`) and how long each may take to arrive
    /// (`handshake_timeout`), before `listen`. Without it the listener
    /// takes `ConnLimits::from_env` when it starts.
    pub fn set_conn_limits(&self, limits: weft_core::limits::ConnLimits) -> Result<()> {
        if lock(&self.prov).is_some() {
            return Err(Error::OpBadState);
        }
        *lock(&self.limits) = Some(limits);
        Ok(())
    }

    /// Starts listening. Needs a bound EQ (`NoEq`).
    pub fn listen(&self) -> Result<()> {
        let _span = tracing::debug_span!("pep_listen", fid = self.fid).entered();
        let eq = lock(&self.eq)
            .as_ref()
            .map(|(eq, _)| eq.clone())
            .ok_or(Error::NoEq)?;
        let mut p = lock(&self.prov);
        if p.is_some() {
            return Err(Error::OpBadState);
        }
        let backlog = *lock(&self.backlog);
        let rt = self.fabric.inner.rt.clone();
        let addr = self
            .addr
            .as_deref()
            .map(|a| crate::addrfmt::to_raw(&self.info, a))
            .transpose()?;
        let pinfo = crate::addrfmt::provider_info(&self.info)?;
        let cfg = PassiveConfig {
            info: pinfo,
            addr,
            backlog,
            eq,
            fid: self.fid,
            context: self.context,
            limits: lock(&self.limits).unwrap_or_else(weft_core::limits::ConnLimits::from_env),
        };
        let _rt = rt.enter();
        *p = Some(self.fabric.prov().open_passive(cfg)?);
        Ok(())
    }

    /// The listening address, raw bytes (after `listen`).
    pub fn local_addr(&self) -> Result<Vec<u8>> {
        lock(&self.prov)
            .as_ref()
            .map(|p| crate::addrfmt::to_user(&self.info, p.local_addr()))
            .ok_or(Error::OpBadState)
    }

    /// Rejects a request; the peer's connect fails with `ConnRefused` and
    /// gets `data`.
    pub fn reject(&self, req: &ConnRequest, data: Vec<u8>) -> Result<()> {
        if data.len() > self.info.ep_attr.cm_data_size {
            return Err(Error::Inval);
        }
        let p = lock(&self.prov).clone().ok_or(Error::OpBadState)?;
        p.reject(&req.handle(), data)
    }

    /// Stops listening.
    pub fn close(&self) -> Result<()> {
        if let Some(p) = lock(&self.prov).take() {
            p.close();
        }
        lock(&self.eq).take();
        Ok(())
    }
}
