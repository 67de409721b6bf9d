//! Memory regions: memory registered for RMA, its key handed to peers.
//!
//! The provider allocates and owns the bytes. While a region is
//! registered, the device may write it on a peer's behalf at any moment,
//! so no Rust reference to those bytes is ever handed out; the
//! application copies in and out instead. Closing (or dropping) the
//! region deregisters it: the key stops working at once.

use std::sync::Arc;

use weft_core::flags::MrAccess;
use weft_core::provider::ProviderMr;
use weft_core::Result;

use crate::fabric::next_fid;

/// A registered memory region (`fid_mr`).
#[derive(Debug)]
pub struct MemoryRegion {
    prov: Arc<dyn ProviderMr>,
    access: MrAccess,
    fid: u64,
    domain: u64,
}

impl MemoryRegion {
    pub(crate) fn new(prov: Arc<dyn ProviderMr>, access: MrAccess, domain: u64) -> MemoryRegion {
        let fid = next_fid();
        tracing::debug!(fid, len = prov.len(), key = prov.key(), "mr registered");
        MemoryRegion {
            prov,
            access,
            fid,
            domain,
        }
    }

    /// The object id.
    pub fn fid(&self) -> u64 {
        self.fid
    }

    /// The object id of the domain it belongs to.
    pub fn domain_fid(&self) -> u64 {
        self.domain
    }

    /// `fi_mr_key`: what a peer passes as the key of RMA operations on
    /// this region (chosen by the provider: `FI_MR_PROV_KEY`).
    pub fn key(&self) -> u64 {
        self.prov.key()
    }

    /// The region's first byte as an RMA target address
    /// (`FI_MR_VIRT_ADDR`): a peer addresses byte `i` as `addr() + i`.
    pub fn addr(&self) -> u64 {
        self.prov.addr()
    }

    /// `fi_mr_desc`: the local descriptor.
    pub fn desc(&self) -> u64 {
        self.prov.desc()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.prov.len()
    }

    /// True for an empty region (never: regions have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.prov.is_empty()
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> MrAccess {
        self.access
    }

    /// Copies `out.len()` bytes starting at `offset` out of the region.
    /// `Inval` if the range does not fit; `Canceled` once closed. Bytes
    /// a peer is writing at the same moment may be seen half-written:
    /// synchronise through a message or remote CQ data, as with any RMA.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.prov.read_at(offset, out)
    }

    /// Copies `data` into the region at `offset`. `Inval` if it does not
    /// fit; `Canceled` once closed.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.prov.write_at(offset, data)
    }

    /// The whole region, copied.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v)?;
        Ok(v)
    }

    /// `fi_close`: deregisters now. Peers' operations with the key fail
    /// with `Access` from here on; local copies fail with `Canceled`.
    pub fn close(&self) {
        self.prov.close();
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.prov.close();
    }
}
