//! Target-visible RMA access: what a region does beyond taking peers'
//! accesses — waiting for its bindings (`FI_MR_ENDPOINT`,
//! `FI_MR_RMA_EVENT`), answering only through the endpoint it is bound
//! to, counting completed accesses on counters bound to it or to the
//! endpoint (`FI_RMA_EVENT`), and dying after one access
//! (`FI_MR_SINGLE_USE`). See `docs/design.md`, "RMA events,
//! endpoint-bound regions and single-use keys".
//!
//! The common access pays one test for all of it: a region's state word
//! ([`Region::admit`](crate::mr::Region::admit)) is 0 when it is open and
//! nothing watches it, and an endpoint without remote counters adds
//! nothing to it; anything else takes [`admit_watched`], which hands the
//! access a [`Ticket`] to present when it completes. A ticket is a plain
//! value (nothing to drop), so carrying an empty one costs nothing.
//! (Measured: `docs/design.md`, same section.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use weft_core::counter::CounterShared;
use weft_core::flags::{BindFlags, MrAccess};
use weft_core::provider::RemoteCntrs;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::mr::{Region, Regions};

/// State bit: the region was closed (local copies refuse too).
pub const CLOSED: u8 = 1;
/// State bit: the region waits for `fi_mr_enable`.
pub const DISABLED: u8 = 2;
/// State bit (of regions and of endpoints): accesses need a ticket — the
/// region is bound to an endpoint or counters, or single-use; the
/// endpoint has remote counters.
pub const WATCHED: u8 = 4;

/// What an access does to a region, for its rights and its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// An RMA write (with or without remote CQ data).
    Write,
    /// An RMA read.
    Read,
    /// An atomic: `writes` unless its operation only reads
    /// (`FI_ATOMIC_READ`), `fetches` in the fetching and compare forms.
    Atomic { writes: bool, fetches: bool },
}

impl AccessKind {
    /// The rights it needs: `REMOTE_WRITE` to change memory,
    /// `REMOTE_READ` to return it.
    pub fn needs(self) -> MrAccess {
        let mut need = MrAccess::empty();
        if self.modifies() {
            need |= MrAccess::REMOTE_WRITE;
        }
        if self.returns() {
            need |= MrAccess::REMOTE_READ;
        }
        need
    }

    /// A region's `FI_REMOTE_WRITE` counter counts it (fi_mr(3): an RMA
    /// write, or an atomic that may modify the region).
    fn modifies(self) -> bool {
        match self {
            AccessKind::Write => true,
            AccessKind::Read => false,
            AccessKind::Atomic { writes, .. } => writes,
        }
    }

    /// A region's `FI_REMOTE_READ` counter counts it: an RMA read, or an
    /// atomic that returns the region's values.
    fn returns(self) -> bool {
        match self {
            AccessKind::Write => false,
            AccessKind::Read => true,
            AccessKind::Atomic { fetches, .. } => fetches,
        }
    }

    /// An endpoint's `FI_REMOTE_READ` counter counts it rather than its
    /// `FI_REMOTE_WRITE` one (fi_endpoint(3): reads and the fetching and
    /// compare atomics; writes and plain atomics count as writes).
    fn counts_as_read(self) -> bool {
        match self {
            AccessKind::Write => false,
            AccessKind::Read => true,
            AccessKind::Atomic { fetches, .. } => fetches,
        }
    }
}

/// A single-use region's entry in its domain's table, removed when its
/// one access is admitted.
#[derive(Debug)]
struct SingleUse {
    key: u64,
    regions: Weak<Regions>,
    /// An access was admitted: no other ever will be.
    taken: AtomicBool,
}

/// Bindings and enabling, one at a time.
#[derive(Debug, Default)]
struct Ctl {
    /// `fi_mr_enable` was called: no more bindings.
    sealed: bool,
}

/// A region's bindings and what it was registered for.
#[derive(Debug, Default)]
pub struct RegionEvents {
    /// Registered with `FI_RMA_EVENT`: counters may be bound.
    counts: bool,
    /// The domain confines regions to endpoints (`FI_MR_ENDPOINT`):
    /// enabling needs one bound.
    needs_ep: bool,
    ep: OnceLock<u64>,
    write: OnceLock<Arc<CounterShared>>,
    read: OnceLock<Arc<CounterShared>>,
    single_use: Option<SingleUse>,
    ctl: Mutex<Ctl>,
}

/// How a region is registered, as far as events go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    /// `FI_RMA_EVENT` among the registration flags.
    pub counts: bool,
    /// `FI_MR_SINGLE_USE` among the registration flags.
    pub single_use: bool,
    /// The domain's `mr_mode` has `FI_MR_ENDPOINT`.
    pub endpoint_mode: bool,
    /// The domain's `mr_mode` has `FI_MR_RMA_EVENT`.
    pub event_mode: bool,
}

impl RegionEvents {
    /// The events of a region registered as `setup` says under `key` in
    /// `regions`, and the state word it starts with: waiting for
    /// `fi_mr_enable` when the domain confines regions to endpoints, or
    /// wants regions for counters configured first (`FI_MR_RMA_EVENT`);
    /// watched when single-use.
    pub fn new(setup: Setup, key: u64, regions: &Arc<Regions>) -> (RegionEvents, u8) {
        let mut state = 0;
        if setup.endpoint_mode || (setup.event_mode && setup.counts) {
            state |= DISABLED;
        }
        if setup.single_use {
            state |= WATCHED;
        }
        let ev = RegionEvents {
            counts: setup.counts,
            needs_ep: setup.endpoint_mode,
            single_use: setup.single_use.then(|| SingleUse {
                key,
                regions: Arc::downgrade(regions),
                taken: AtomicBool::new(false),
            }),
            ..RegionEvents::default()
        };
        (ev, state)
    }
}

/// `fi_mr_bind` with endpoint `ep`: only accesses through it reach the
/// region from now on.
pub fn bind_ep(region: &Region, ep: u64) -> Result<()> {
    let ev = &region.ev;
    let ctl = lock(&ev.ctl);
    if ctl.sealed {
        return Err(Error::OpBadState);
    }
    ev.ep.set(ep).map_err(|_| Error::Inval)?;
    // Published after the binding, so an access that sees the bit sees it.
    region.state.fetch_or(WATCHED, Ordering::Release);
    Ok(())
}

/// `fi_mr_bind` with a counter for the directions in `flags`.
pub fn bind_cntr(region: &Region, cntr: Arc<CounterShared>, flags: BindFlags) -> Result<()> {
    let ev = &region.ev;
    if !ev.counts {
        return Err(Error::Inval);
    }
    let ctl = lock(&ev.ctl);
    if ctl.sealed {
        return Err(Error::OpBadState);
    }
    let write = flags.contains(BindFlags::REMOTE_WRITE);
    let read = flags.contains(BindFlags::REMOTE_READ);
    // Both directions are checked before either is bound: a refused bind
    // changes nothing.
    if (write && ev.write.get().is_some()) || (read && ev.read.get().is_some()) {
        return Err(Error::Inval);
    }
    if write {
        ev.write.set(cntr.clone()).map_err(|_| Error::Inval)?;
    }
    if read {
        ev.read.set(cntr).map_err(|_| Error::Inval)?;
    }
    region.state.fetch_or(WATCHED, Ordering::Release);
    Ok(())
}

/// `fi_mr_enable`: reachable from now on, and no more bindings.
pub fn enable(region: &Region) -> Result<()> {
    let ev = &region.ev;
    let mut ctl = lock(&ev.ctl);
    if ev.needs_ep && ev.ep.get().is_none() {
        return Err(Error::Inval);
    }
    ctl.sealed = true;
    region.state.fetch_and(!DISABLED, Ordering::Release);
    Ok(())
}

/// The checks of an access that is not the common one (the region or
/// the endpoint `ep` is watched, or the region is closed or disabled): a
/// closed or disabled region, another endpoint than the bound one, or a
/// single-use key already taken is `Access`; otherwise the access gets
/// its ticket. A single-use key is taken here, by one access of any
/// number racing for it, and leaves the domain's table at once: the
/// access that took it completes or fails, and either way no other is
/// admitted (memory may be half written by a failed one, and a second
/// chance would let a peer retry by dropping its connection).
#[cold]
#[inline(never)]
pub fn admit_watched(region: &Arc<Region>, ep: u64, kind: AccessKind) -> Result<Ticket> {
    if region.state.load(Ordering::Acquire) & (CLOSED | DISABLED) != 0 {
        return Err(Error::Access);
    }
    let ev = &region.ev;
    if ev.ep.get().is_some_and(|&bound| bound != ep) {
        return Err(Error::Access);
    }
    if let Some(su) = &ev.single_use {
        if su.taken.swap(true, Ordering::AcqRel) {
            return Err(Error::Access);
        }
        if let Some(regions) = su.regions.upgrade() {
            regions.remove(su.key, region);
        }
    }
    Ok(Ticket { kind })
}

/// An admitted access to a watched region or through a watched endpoint:
/// presented with its region when the access completes, it counts it;
/// dropped without completing (the region closed part-way, the
/// connection ended), it counts nothing.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    kind: AccessKind,
}

impl Ticket {
    /// The access to `region` completed: its bytes are in place (a write,
    /// an atomic) or copied out (a read). The region's counters count it
    /// (once per counter, even one bound for both directions), then the
    /// endpoint's.
    pub fn complete(self, region: &Region, ep: &RemoteCntrs) {
        let ev = &region.ev;
        let write = self.kind.modifies().then(|| ev.write.get()).flatten();
        if let Some(c) = write {
            c.add(1);
        }
        if self.kind.returns() {
            if let Some(c) = ev.read.get() {
                if !write.is_some_and(|w| Arc::ptr_eq(w, c)) {
                    c.add(1);
                }
            }
        }
        let at_ep = if self.kind.counts_as_read() {
            &ep.read
        } else {
            &ep.write
        };
        if let Some(c) = at_ep {
            c.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn kinds_need_and_count_as_the_man_pages_say() {
        let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
        let fetch_add = AccessKind::Atomic {
            writes: true,
            fetches: true,
        };
        let plain = AccessKind::Atomic {
            writes: true,
            fetches: false,
        };
        let atomic_read = AccessKind::Atomic {
            writes: false,
            fetches: true,
        };
        assert_eq!(AccessKind::Write.needs(), MrAccess::REMOTE_WRITE);
        assert_eq!(AccessKind::Read.needs(), MrAccess::REMOTE_READ);
        assert_eq!(fetch_add.needs(), rw);
        assert_eq!(plain.needs(), MrAccess::REMOTE_WRITE);
        assert_eq!(atomic_read.needs(), MrAccess::REMOTE_READ);
        // A region counts by effect: a fetch-add modifies and returns.
        assert!(fetch_add.modifies() && fetch_add.returns());
        assert!(!atomic_read.modifies() && atomic_read.returns());
        // An endpoint counts by form: fetching and compare forms are reads.
        assert!(fetch_add.counts_as_read() && atomic_read.counts_as_read());
        assert!(!plain.counts_as_read() && !AccessKind::Write.counts_as_read());
    }

    #[test]
    fn a_region_starts_as_its_domain_and_flags_say() {
        let regions = Arc::new(Regions::default());
        let state = |s: Setup| RegionEvents::new(s, 1, &regions).1;
        assert_eq!(state(Setup::default()), 0, "the common region");
        let counts = Setup {
            counts: true,
            ..Setup::default()
        };
        assert_eq!(state(counts), 0, "no FI_MR_RMA_EVENT: reachable at once");
        let event_mode = Setup {
            event_mode: true,
            ..counts
        };
        assert_eq!(state(event_mode), DISABLED);
        let plain_in_event_mode = Setup {
            event_mode: true,
            ..Setup::default()
        };
        assert_eq!(
            state(plain_in_event_mode),
            0,
            "only FI_RMA_EVENT regions wait"
        );
        let endpoint_mode = Setup {
            endpoint_mode: true,
            ..Setup::default()
        };
        assert_eq!(state(endpoint_mode), DISABLED);
        let single = Setup {
            single_use: true,
            ..Setup::default()
        };
        assert_eq!(state(single), WATCHED);
    }

    /// A region of a domain with `mr_mode` and `flags`, as its key names
    /// it in the domain's table.
    fn registered(
        mr_mode: weft_core::flags::MrMode,
        flags: weft_core::flags::MrRegFlags,
        key: u64,
    ) -> (
        crate::mr::TcpDomain,
        Arc<dyn weft_core::provider::ProviderMr>,
        Arc<Region>,
    ) {
        use weft_core::provider::{MrMemory, MrRequest, ProviderDomain};
        let d = crate::mr::TcpDomain::new(mr_mode, None);
        let mr = d
            .mr_reg(MrRequest {
                memory: MrMemory::Alloc(64),
                access: MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE,
                requested_key: key,
                flags,
                auth_key: None,
            })
            .unwrap();
        let r = d.regions.get(key).unwrap();
        (d, mr, r)
    }

    #[test]
    fn bindings_follow_fi_mr_and_enable_seals_them() {
        use weft_core::flags::{MrMode, MrRegFlags};
        let (_d, mr, r) = registered(
            MrMode::ENDPOINT | MrMode::RMA_EVENT,
            MrRegFlags::RMA_EVENT,
            5,
        );
        let fetch_add = AccessKind::Atomic {
            writes: true,
            fetches: true,
        };
        assert_eq!(admit_watched(&r, 7, fetch_add).unwrap_err(), Error::Access);
        assert_eq!(mr.enable(), Err(Error::Inval), "no endpoint yet");
        mr.bind_ep(7).unwrap();
        assert_eq!(mr.bind_ep(8), Err(Error::Inval));
        let c = CounterShared::new(1);
        mr.bind_cntr(c.clone(), BindFlags::REMOTE_WRITE).unwrap();
        let both = BindFlags::REMOTE_WRITE | BindFlags::REMOTE_READ;
        assert_eq!(mr.bind_cntr(c.clone(), both), Err(Error::Inval));
        assert!(r.ev.read.get().is_none(), "a refused bind binds nothing");
        mr.bind_cntr(c.clone(), BindFlags::REMOTE_READ).unwrap();
        assert_eq!(admit_watched(&r, 7, fetch_add).unwrap_err(), Error::Access);
        mr.enable().unwrap();
        assert_eq!(mr.bind_ep(7), Err(Error::OpBadState));
        assert_eq!(
            mr.bind_cntr(CounterShared::new(2), BindFlags::REMOTE_WRITE),
            Err(Error::OpBadState)
        );
        assert_eq!(admit_watched(&r, 8, fetch_add).unwrap_err(), Error::Access);
        // One counter bound for both directions counts a fetch-add once;
        // the endpoint's counters count it as a read.
        let ep = RemoteCntrs {
            read: Some(CounterShared::new(3)),
            write: Some(CounterShared::new(4)),
        };
        admit_watched(&r, 7, fetch_add).unwrap().complete(&r, &ep);
        assert_eq!(c.read(), 1);
        let count = |c: &Option<Arc<CounterShared>>| c.as_ref().map(|c| c.read());
        assert_eq!((count(&ep.read), count(&ep.write)), (Some(1), Some(0)));
        admit_watched(&r, 7, AccessKind::Write)
            .unwrap()
            .complete(&r, &ep);
        assert_eq!(c.read(), 2);
        assert_eq!((count(&ep.read), count(&ep.write)), (Some(1), Some(1)));
    }

    #[test]
    fn a_single_use_key_admits_one_access_and_leaves_the_table() {
        use weft_core::flags::{MrMode, MrRegFlags};
        let (d, _mr, r) = registered(MrMode::empty(), MrRegFlags::SINGLE_USE, 9);
        let ticket = admit_watched(&r, 1, AccessKind::Read).unwrap();
        assert!(d.regions.get(9).is_none(), "the key is free at once");
        for ep in [1, 2] {
            assert_eq!(
                admit_watched(&r, ep, AccessKind::Read).unwrap_err(),
                Error::Access
            );
        }
        // Completing counts nothing here (no counters) and changes nothing.
        ticket.complete(&r, &RemoteCntrs::default());
        assert!(d.regions.get(9).is_none());
    }
}
