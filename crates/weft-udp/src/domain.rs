//! The udp domain: nothing to register (no RMA), only shared receive
//! contexts to open.

use std::sync::Arc;

use weft_core::attr::RxAttr;
use weft_core::provider::{MrRequest, ProviderDomain, ProviderMr, ProviderSrx, Rejected};
use weft_core::soft_srx::{SoftSrx, SrxHandle};
use weft_core::{Error, Result};

use crate::endpoint::EpShared;

/// The domain object.
#[derive(Debug, Default)]
pub struct UdpDomain;

impl ProviderDomain for UdpDomain {
    fn mr_reg(
        &self,
        req: MrRequest,
    ) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
        Err(Rejected {
            err: Error::NoSys,
            req,
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn srx_open(&self, size: usize) -> Result<Arc<dyn ProviderSrx>> {
        self.srx_open_attr(&RxAttr {
            size,
            ..RxAttr::default()
        })
    }

    fn srx_open_attr(&self, attr: &RxAttr) -> Result<Arc<dyn ProviderSrx>> {
        let c = SoftSrx::<EpShared>::open(attr, crate::BUFFERED_RECV, crate::IOV_LIMIT);
        Ok(Arc::new(SrxHandle(c)))
    }
}
