//! Per-key resources of an RDM endpoint ("lanes").
//!
//! A key is enforced by its protection domain (`crate::domain`): the
//! queue pair of a connection that proved K lives in K's, and so must
//! everything its work requests name — the shared receive queue and its
//! receive slots, the send and read slots, and registrations (rxe checks
//! a receive's local key against the queue pair's protection domain). An
//! endpoint holding one key (or none) has one lane, made when it opens;
//! an endpoint holding an AV's keys (`FI_AV_AUTH_KEY`) has one per key,
//! made when a connection under that key first needs it, so keys that
//! never see a connection cost nothing. The CQ and completion channel are
//! the endpoint's, shared by every lane.
//!
//! Receive slots are numbered across lanes: slot `lane * SLOTS + i` is
//! slot `i` of that lane, and offsets into the receive slots likewise
//! (`lane * STRIDE + offset`), so a slot number or offset alone says
//! where its bytes are.

use std::sync::{Arc, Mutex, OnceLock};

use weft_core::addr::FiAddr;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::{RdmShared, RDM_SLOT};
use crate::slot_pool::{SlotPool, SLOTS};
use crate::sys::{AccessFlags, Context, DeviceAttr, ProtectionDomain, Srq};

/// Receive (and send) slots of a lane of an AV-keyed endpoint: the
/// endpoint's CQ takes every lane's receives, and each lane pins its
/// slots, so a lane is smaller than a single-key endpoint's one.
pub(crate) const KEYED_SLOTS: usize = 64;
// A lane's slots fit the numbering's span.
const _: () = assert!(KEYED_SLOTS <= SLOTS);
/// Bytes of the receive slot numbering a lane spans.
const STRIDE: usize = SLOTS * RDM_SLOT;

/// The lane of slot number `slot` and its number in the lane.
fn split_slot(slot: u32) -> (usize, u32) {
    let s = slot as usize;
    (s / SLOTS, (s % SLOTS) as u32)
}

/// Where slot number `slot` starts in the numbering of all lanes'
/// receive slots.
fn slot_offset(slot: u32) -> usize {
    let (idx, local) = split_slot(slot);
    idx * STRIDE + local as usize * RDM_SLOT
}

/// The lane of offset `off` and the offset in its receive slots.
fn split_offset(off: usize) -> (usize, usize) {
    (off / STRIDE, off % STRIDE)
}

/// The verbs objects of the connections under one key.
pub(crate) struct Lane {
    /// 0: the endpoint's own key (or none); `1 + i`: its `i`-th AV key.
    pub idx: usize,
    /// The AV key handle (`FI_AV_AUTH_KEY` lanes).
    pub handle: Option<FiAddr>,
    pub pd: Arc<ProtectionDomain>,
    /// The registration cache of `pd` (the domain's, or its key's).
    pub cache: Option<Arc<crate::user_bufs::SourceCache>>,
    pub srq: Arc<Srq>,
    pub send_pool: SlotPool,
    pub recv_pool: SlotPool,
    /// Slots for small RDMA reads.
    pub read_pool: Arc<SlotPool>,
    /// Staging slots for rendezvous reads up to [`STAGE_MAX`], made at
    /// the first such read (`None` once making them failed).
    stage: OnceLock<Option<Arc<SlotPool>>>,
    /// Slots rendezvous sources up to [`STAGE_MAX`] are copied into and
    /// read from through windows (`None` where windows are off).
    pub sources: Option<Arc<super::windows::SourceSlots>>,
}

/// The largest rendezvous read landed in a staging slot and copied into
/// the receive's buffers, rather than read into them registered for it.
/// Registering and deregistering a receive's buffers cost two system
/// calls that pin and unpin its pages, more than copying this much
/// (`docs/benchmarks.md`, "verbs RDM: staged rendezvous reads");
/// libfabric's rxm copies through bounce buffers below 128 KiB too.
pub(crate) const STAGE_MAX: usize = 128 << 10;
/// Staging slots per lane: 512 KiB pinned, once used. Reads that find
/// none free register their receive's buffers as larger ones do.
const STAGE_SLOTS: usize = 4;

impl Lane {
    /// The lane's staging slots, made on first use; `None` when they
    /// could not be (the locked-memory limit): reads then register.
    pub(crate) fn stage_pool(&self) -> Option<&Arc<SlotPool>> {
        self.stage
            .get_or_init(|| {
                match SlotPool::with_slot(&self.pd, STAGE_SLOTS, STAGE_MAX, AccessFlags::LOCAL_WRITE) {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        tracing::debug!(lane = self.idx, error = %e, "no staging slots: reads register");
                        None
                    }
                }
            })
            .as_ref()
    }
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("idx", &self.idx)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// An endpoint's lanes, made on first use.
#[derive(Debug)]
pub(crate) struct Lanes {
    ctx: Arc<Context>,
    all: Box<[OnceLock<Arc<Lane>>]>,
    /// One maker at a time: a lane's slots are posted once.
    making: Mutex<()>,
    /// Slots per lane.
    slots: usize,
    /// Rendezvous sources go through memory windows ([`super::windows`]).
    windows: bool,
}

impl Lanes {
    /// Room for `n` lanes on device context `ctx`.
    pub(crate) fn new(ctx: Arc<Context>, n: usize) -> Lanes {
        Lanes {
            all: (0..n).map(|_| OnceLock::new()).collect(),
            making: Mutex::new(()),
            slots: if n > 1 { KEYED_SLOTS } else { SLOTS },
            windows: windows_on(&ctx),
            ctx,
        }
    }

    /// The feature byte of this endpoint's hellos.
    pub(crate) fn features(&self) -> u8 {
        if self.windows {
            crate::cm_data::FEATURES | crate::cm_data::FEAT_WINDOWS
        } else {
            crate::cm_data::FEATURES
        }
    }

    /// Whether windows are used, and answered, here.
    pub(crate) fn windows(&self) -> bool {
        self.windows
    }

    /// Receive completions all lanes together may have outstanding.
    pub(crate) fn recv_depth(&self) -> usize {
        self.slots * self.all.len()
    }

    /// Lane `idx`, if made.
    pub(crate) fn get(&self, idx: usize) -> Option<&Arc<Lane>> {
        self.all.get(idx)?.get()
    }
}

/// Whether the device binds type 2 windows and takes sends with
/// invalidate, and `WEFT_VERBS_WINDOWS` does not turn windows off (`0`).
fn windows_on(ctx: &Context) -> bool {
    if std::env::var("WEFT_VERBS_WINDOWS").as_deref() == Ok("0") {
        return false;
    }
    ctx.device_attr().is_ok_and(DeviceAttr::has_windows)
}

impl RdmShared {
    /// Lane `idx`, made (and its receive slots posted) if it was not.
    pub(crate) fn lane(&self, idx: usize) -> Result<Arc<Lane>> {
        let lanes = &self.res.lanes;
        if let Some(l) = lanes.get(idx) {
            return Ok(l.clone());
        }
        let cell = lanes.all.get(idx).ok_or(Error::Inval)?;
        let _one = lock(&lanes.making);
        if let Some(l) = cell.get() {
            return Ok(l.clone());
        }
        let key = self.keys.key_of(idx);
        let pd = crate::domain::endpoint_pd(&self.cfg, &lanes.ctx, key)?;
        let n = lanes.slots;
        let lane = Arc::new(Lane {
            idx,
            handle: self.keys.handle_of(idx),
            cache: crate::domain::endpoint_cache(&self.cfg, &pd),
            srq: Srq::new(&pd, n as u32, 1)?,
            send_pool: SlotPool::with_slot(&pd, n, RDM_SLOT, AccessFlags::NONE)?,
            recv_pool: SlotPool::with_slot(&pd, n, RDM_SLOT, AccessFlags::LOCAL_WRITE)?,
            read_pool: crate::user_bufs::read_pool(&pd)?,
            stage: OnceLock::new(),
            sources: lanes.windows.then(|| super::windows::SourceSlots::new(&pd)),
            pd,
        });
        let _ = cell.set(lane.clone());
        let base = (idx * SLOTS) as u32;
        for i in 0..n as u32 {
            self.post_slot(base + i)?;
        }
        tracing::debug!(lane = idx, "verbs rdm lane for a key");
        Ok(lane)
    }

    /// The lane of receive slot `slot` and the slot's number in it.
    pub(crate) fn slot_lane(&self, slot: u32) -> Option<(&Arc<Lane>, u32)> {
        let (idx, local) = split_slot(slot);
        Some((self.res.lanes.get(idx)?, local))
    }

    /// Where receive slot `slot` starts, in the numbering of all lanes.
    pub(crate) fn slot_offset(&self, slot: u32) -> usize {
        slot_offset(slot)
    }

    /// The lane of offset `off` (from [`slot_offset`](Self::slot_offset))
    /// and the offset in its receive slots.
    pub(crate) fn slot_region(&self, off: usize) -> Result<(&Arc<Lane>, usize)> {
        let (idx, at) = split_offset(off);
        Ok((self.res.lanes.get(idx).ok_or(Error::Inval)?, at))
    }

    /// Copies bytes at offset `off` of the receive slots into `out`.
    pub(crate) fn read_slots(&self, off: usize, out: &mut [u8]) -> Result<()> {
        let (lane, at) = self.slot_region(off)?;
        lane.recv_pool.with(|mr| mr.read_at(at, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot number, and any offset inside its slot, name one lane and
    /// the same place in that lane's slots, whatever the lane's size.
    #[test]
    fn slots_and_offsets_name_their_lane() {
        for (idx, local) in [(0, 0), (0, 255), (1, 0), (1, 63), (256, 17)] {
            let slot = (idx * SLOTS) as u32 + local;
            assert_eq!(split_slot(slot), (idx, local));
            let off = slot_offset(slot);
            assert_eq!(split_offset(off), (idx, local as usize * RDM_SLOT));
            let last = off + RDM_SLOT - 1;
            assert_eq!(split_offset(last).0, idx);
        }
        // Lanes never overlap: the next lane starts past the last slot.
        assert!(slot_offset(SLOTS as u32 - 1) + RDM_SLOT <= slot_offset(SLOTS as u32));
    }
}
