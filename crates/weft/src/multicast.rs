//! `fi_join` on connectionless endpoints: a joined group is a
//! [`Multicast`] handle, whose address sends to every member
//! (`fi_mc_addr`) and whose drop leaves the group.

use std::sync::atomic::{AtomicBool, Ordering};

use weft_core::addr::FiAddr;
use weft_core::eventq::{EqEvent, EqEventKind};
use weft_core::flags::Caps;
use weft_core::{Error, Result};

use crate::Endpoint;

/// A multicast group this endpoint joined. Datagrams sent to the group by
/// anyone arrive at the endpoint's receives as long as it is held;
/// dropping it (or [`close`](Self::close)) leaves the group.
#[derive(Debug)]
pub struct Multicast {
    ep: Endpoint,
    addr: FiAddr,
    fid: u64,
    left: AtomicBool,
}

impl Endpoint {
    /// `fi_join`: joins the multicast group at `group` (an address in the
    /// endpoint's format, with the group's port), then queues
    /// `FI_JOIN_COMPLETE` (the handle's fid, `context`) on the bound EQ,
    /// if any. `NoSys` without the `FI_MULTICAST` capability; `Inval` for
    /// an address that is not a multicast group of the endpoint's family.
    pub async fn join(&self, group: &[u8], context: u64) -> Result<Multicast> {
        let info = self.info();
        if !info.caps.contains(Caps::MULTICAST) {
            return Err(Error::NoSys);
        }
        let raw = crate::addrfmt::to_raw(info, group)?;
        let prov = self.live()?.prov.clone();
        let addr = prov.join(raw).await?;
        let fid = crate::fabric::next_fid();
        if let Some(eq) = self.bound_eq() {
            eq.push(Ok(EqEvent::new(EqEventKind::JoinComplete, fid, context, 0)));
        }
        Ok(Multicast {
            ep: self.clone(),
            addr,
            fid,
            left: AtomicBool::new(false),
        })
    }
}

impl Multicast {
    /// `fi_mc_addr`: the address that sends to the group.
    pub fn fi_addr(&self) -> FiAddr {
        self.addr
    }

    /// The handle's object id (the fid of its `FI_JOIN_COMPLETE` event).
    pub fn fid(&self) -> u64 {
        self.fid
    }

    /// Leaves the group now, with the provider's answer.
    pub fn close(self) -> Result<()> {
        self.leave()
    }

    fn leave(&self) -> Result<()> {
        if self.left.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.ep.live()?.prov.leave(self.addr)
    }
}

impl Drop for Multicast {
    fn drop(&mut self) {
        // An endpoint closed first has left every group with its socket.
        let _ = self.leave();
    }
}
