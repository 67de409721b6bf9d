//! Shared transmit contexts (`fi_stx_context`): one transmit queue that
//! the endpoints bound to it post into.
//!
//! Operations are still posted through the endpoints and complete on
//! each endpoint's own CQ and counters; what the endpoints share is the
//! queue's room (`tx_attr.size`): one endpoint's operations in flight
//! leave that much less for the others (`tx_size_left` of every bound
//! endpoint is the context's). Offered where `max_ep_stx_ctx` is 1 (tcp
//! RDM and MSG); getinfo matches hints with `tx_ctx_cnt =
//! FI_SHARED_CONTEXT` there.

use std::sync::Arc;

use weft_core::attr::TxAttr;
use weft_core::provider::ProviderStx;
use weft_core::{Error, Result};

use crate::endpoint::Endpoint;
use crate::fabric::Domain;
use crate::srx::CtxState;

/// A shared transmit context.
#[derive(Debug, Clone)]
pub struct SharedTxContext {
    pub(crate) inner: Arc<StxInner>,
}

#[derive(Debug)]
pub(crate) struct StxInner {
    pub(crate) state: CtxState,
    pub(crate) prov: Arc<dyn ProviderStx>,
    attr: TxAttr,
}

impl Domain {
    /// `fi_stx_context` with its `fi_tx_attr`: `size` (operations in
    /// flight across every bound endpoint) and `iov_limit`, 0 taking the
    /// domain's; the rest is the domain's. Default `op_flags` are not
    /// supported (`BadFlags`). `NoSys` when the domain's endpoints cannot
    /// share a transmit context (`max_ep_stx_ctx` 0).
    pub fn stx_context(&self, attr: &TxAttr) -> Result<SharedTxContext> {
        let info = self.info();
        if info.domain_attr.max_ep_stx_ctx == 0 {
            return Err(Error::NoSys);
        }
        if !attr.op_flags.is_empty() {
            return Err(Error::BadFlags);
        }
        let dom = &info.tx_attr;
        let pick = |v: usize, d: usize| if v == 0 { d } else { v };
        let attr = TxAttr {
            size: pick(attr.size, dom.size),
            iov_limit: pick(attr.iov_limit, dom.iov_limit),
            ..dom.clone()
        };
        let prov = self.inner.prov.as_ref().ok_or(Error::NoSys)?;
        let prov = prov.stx_open(&attr)?;
        Ok(SharedTxContext {
            inner: Arc::new(StxInner {
                state: CtxState::open(self.fid(), "stx", attr.size),
                prov,
                attr,
            }),
        })
    }
}

impl SharedTxContext {
    /// The object id.
    pub fn fid(&self) -> u64 {
        self.inner.state.fid()
    }

    /// The attributes it was opened with.
    pub fn attr(&self) -> &TxAttr {
        &self.inner.attr
    }

    /// Operations that can still be posted, by any bound endpoint.
    pub fn tx_size_left(&self) -> Result<usize> {
        self.inner.state.live()?;
        Ok(self.inner.prov.tx_size_left())
    }

    /// `fi_close`: `Busy` while endpoints are bound to it.
    pub fn close(&self) -> Result<()> {
        self.inner.state.close().map(|_| ())
    }
}

impl Endpoint {
    /// Binds a shared transmit context (before enable): the endpoint's
    /// transmit operations then take their room in the context's queue.
    /// `NoSys` for endpoints whose offer has no shared transmit contexts
    /// (`max_ep_stx_ctx` 0), `Domain` for another domain's context,
    /// `Inval` for a second one, `OpBadState` for a closed one or after
    /// enable.
    pub fn bind_stx(&self, stx: &SharedTxContext) -> Result<()> {
        if self.info().domain_attr.max_ep_stx_ctx == 0 {
            return Err(Error::NoSys);
        }
        stx.inner.state.bindable(self.domain_fid())?;
        self.set_stx(stx)
    }
}
