//! Address handles (UD destinations) and address vectors (`ibv_ah_attr`).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_create_ah, ibv_destroy_ah, ibv_global_route};
use weft_core::Error;

use super::device::Gid;
use super::last_error_or;
use super::pd::ProtectionDomain;

/// An address vector (`ibv_ah_attr`): where packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID; `Some` adds a GRH (always needed on RoCE).
    pub dgid: Option<Gid>,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// Traffic class (DSCP/ECN).
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Destination LID (IB; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port.
    pub port_num: u8,
}

impl AhAttr {
    /// A RoCE destination: GRH to `dgid`, sent from `sgid_index` of `port`,
    /// hop limit 64.
    pub fn roce(dgid: Gid, port: u8, sgid_index: u8, sl: u8) -> AhAttr {
        AhAttr {
            dgid: Some(dgid),
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            dlid: 0,
            sl,
            src_path_bits: 0,
            static_rate: 0,
            port_num: port,
        }
    }

    pub(crate) fn to_raw(self) -> ibv_ah_attr {
        let gid = self.dgid.unwrap_or_default();
        ibv_ah_attr {
            grh: ibv_global_route {
                dgid: gid.to_raw(),
                flow_label: self.flow_label,
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                traffic_class: self.traffic_class,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: u8::from(self.dgid.is_some()),
            port_num: self.port_num,
        }
    }

    pub(crate) fn from_raw(a: &ibv_ah_attr) -> AhAttr {
        AhAttr {
            dgid: (a.is_global != 0).then(|| Gid::from_raw(&a.grh.dgid)),
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
            flow_label: a.grh.flow_label,
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            port_num: a.port_num,
        }
    }
}

/// An address handle (`ibv_ah`) for UD sends. Holds its PD alive.
///
/// Providers copy the address into the work request at post time, but keep
/// the handle alive until the send completes anyway (e.g. in an AV table).
pub struct AddressHandle {
    ah: NonNull<ibv_ah>,
    attr: AhAttr,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: an AH is immutable after creation and verbs using it are
// thread-safe.
unsafe impl Send for AddressHandle {}
// SAFETY: see `Send`.
unsafe impl Sync for AddressHandle {}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("attr", &self.attr)
            .finish()
    }
}

impl AddressHandle {
    /// `ibv_create_ah`.
    pub fn new(pd: &Arc<ProtectionDomain>, attr: &AhAttr) -> Result<Arc<AddressHandle>, Error> {
        let mut raw = attr.to_raw();
        // SAFETY: the PD is alive; `raw` is a valid, fully initialised
        // attribute struct that the call only reads.
        let ah = unsafe { ibv_create_ah(pd.as_ptr(), &mut raw) };
        let ah = NonNull::new(ah).ok_or_else(|| last_error_or(Error::Inval))?;
        Ok(Arc::new(AddressHandle {
            ah,
            attr: *attr,
            pd: Arc::clone(pd),
        }))
    }

    /// The attributes it was created from.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// Its protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_ah {
        self.ah.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_ah, destroyed once.
        let ret = unsafe { ibv_destroy_ah(self.ah.as_ptr()) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_ah failed");
        }
    }
}
