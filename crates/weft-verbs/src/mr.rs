//! Memory regions of a verbs domain: `ibv_reg_mr` on memory the domain
//! allocates, on application buffers registered where they are, and on
//! parts of either (sub-regions with their own keys and rights).
//!
//! Keys are the device's (`FI_MR_PROV_KEY`) and addresses virtual
//! (`FI_MR_VIRT_ADDR`), so a requested key is ignored. Registration flags
//! need what a verbs device cannot do: `FI_RMA_EVENT` and
//! `FI_MR_SINGLE_USE` would need the target to see remote accesses,
//! which one-sided RDMA never shows it; they are `BadFlags`.

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use weft_core::flags::MrAccess;
use weft_core::provider::{MrMemory, MrRequest, ProviderMr, Rejected};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::sys::{AccessFlags, OwnedMr, ProtectionDomain};

/// Registers what `req` asks for on `pd`. `atomics`: the device does
/// 64-bit atomics, so remote-writable regions admit them too.
pub(crate) fn register(
    pd: &Arc<ProtectionDomain>,
    atomics: bool,
    req: MrRequest,
) -> std::result::Result<Arc<dyn ProviderMr>, Rejected<MrRequest>> {
    let flags = access_flags(req.access, atomics);
    // The domain's mr_iov_limit is 1: an ibv_mr covers one range.
    let made = match req.memory {
        _ if !req.flags.is_empty() => Err((Error::BadFlags, req.memory)),
        MrMemory::Alloc(len) => OwnedMr::new(pd, len, flags)
            .map(|mr| (mr, false))
            .map_err(|e| (e, MrMemory::Alloc(len))),
        MrMemory::Buffers(mut bufs) if bufs.len() == 1 => match bufs.pop() {
            Some(buf) => OwnedMr::from_buffer(pd, buf, flags)
                .map(|mr| (mr, true))
                .map_err(|(e, buf)| (e, MrMemory::Buffers(vec![buf]))),
            None => Err((Error::Inval, MrMemory::Buffers(bufs))),
        },
        other => Err((Error::Inval, other)),
    };
    match made {
        Ok((mr, buffers)) => Ok(Arc::new(VerbsMr::new(mr, pd.clone(), atomics, buffers))),
        Err((err, memory)) => Err(Rejected {
            err,
            req: MrRequest { memory, ..req },
        }),
    }
}

/// Verbs rights for libfabric access bits. The device writes the region
/// for remote writes and for reads or receives landing in it, and verbs
/// wants local write whenever remote write is given. As in libfabric's
/// verbs provider, remote write also admits atomics (libfabric has no
/// separate bit) when the device has them.
fn access_flags(a: MrAccess, atomics: bool) -> AccessFlags {
    let mut f = AccessFlags::NONE;
    if a.intersects(MrAccess::WRITE | MrAccess::RECV | MrAccess::REMOTE_WRITE) {
        f |= AccessFlags::LOCAL_WRITE;
    }
    if a.contains(MrAccess::REMOTE_WRITE) {
        f |= AccessFlags::REMOTE_WRITE;
        if atomics {
            f |= AccessFlags::REMOTE_ATOMIC;
        }
    }
    if a.contains(MrAccess::REMOTE_READ) {
        f |= AccessFlags::REMOTE_READ;
    }
    f
}

/// A region of a verbs domain. The memory lives (and stays registered)
/// until `close`; copies in and out go through the registration, which
/// never hands out a reference.
#[derive(Debug)]
struct VerbsMr {
    key: u64,
    addr: u64,
    len: usize,
    desc: u64,
    /// Registered on an application buffer (`take_buffers` applies).
    buffers: bool,
    pd: Arc<ProtectionDomain>,
    atomics: bool,
    mr: Mutex<Option<OwnedMr>>,
}

impl VerbsMr {
    fn new(mr: OwnedMr, pd: Arc<ProtectionDomain>, atomics: bool, buffers: bool) -> VerbsMr {
        VerbsMr {
            key: u64::from(mr.rkey()),
            addr: mr.addr(),
            len: mr.len(),
            desc: u64::from(mr.lkey()),
            buffers,
            pd,
            atomics,
            mr: Mutex::new(Some(mr)),
        }
    }
}

impl ProviderMr for VerbsMr {
    fn key(&self) -> u64 {
        self.key
    }

    fn addr(&self) -> u64 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn desc(&self) -> u64 {
        self.desc
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        lock(&self.mr)
            .as_ref()
            .ok_or(Error::Canceled)?
            .read_at(offset, out)
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        lock(&self.mr)
            .as_mut()
            .ok_or(Error::Canceled)?
            .write_at(offset, data)
    }

    fn close(&self) {
        // Deregistration happens in OwnedMr's drop (which leaks the memory
        // rather than free it if the device refuses). Memory that
        // sub-regions cover stays with them.
        drop(lock(&self.mr).take());
    }

    fn sub_region(
        &self,
        offset: usize,
        len: usize,
        access: MrAccess,
        _requested_key: u64,
    ) -> Result<Arc<dyn ProviderMr>> {
        // FI_MR_PROV_KEY: the device picks the key.
        let guard = lock(&self.mr);
        let base = guard.as_ref().ok_or(Error::Canceled)?;
        let sub = base.sub(&self.pd, offset, len, access_flags(access, self.atomics))?;
        Ok(Arc::new(VerbsMr::new(
            sub,
            self.pd.clone(),
            self.atomics,
            false,
        )))
    }

    fn take_buffers(&self) -> Result<Vec<BytesMut>> {
        if !self.buffers {
            return Err(Error::Inval);
        }
        let mr = lock(&self.mr).take().ok_or(Error::Canceled)?;
        Ok(vec![mr.into_buffer()?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_map_to_verbs_rights() {
        let r = access_flags(MrAccess::REMOTE_READ, true);
        assert_eq!(r.bits(), AccessFlags::REMOTE_READ.bits());
        let w = access_flags(MrAccess::REMOTE_WRITE, false);
        assert!(w.contains(AccessFlags::REMOTE_WRITE) && w.contains(AccessFlags::LOCAL_WRITE));
        assert!(!w.contains(AccessFlags::REMOTE_ATOMIC));
        let wa = access_flags(MrAccess::REMOTE_WRITE, true);
        assert!(wa.contains(AccessFlags::REMOTE_ATOMIC));
        assert!(access_flags(MrAccess::WRITE, true).contains(AccessFlags::LOCAL_WRITE));
        assert_eq!(
            access_flags(MrAccess::SEND | MrAccess::READ, true).bits(),
            0
        );
    }
}
