//! Multicast on a DGRAM endpoint (`FI_MULTICAST`, `fi_join`): each
//! joined group is an rdma_cm id of its own, bound to the endpoint's
//! device address, that joined the group (`rdma_join_multicast`); its
//! `MulticastJoin` event gives the group's address vector, QPN
//! (0xFFFFFF) and Q_Key. The endpoint's queue pair is attached to the
//! group's GID, so group datagrams land in the same receive slots as any
//! other; sends go to the group through an address handle of its own.
//! See `docs/design.md`, "Multicast on verbs DGRAM".

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use weft_core::addr::{decode_sockaddr, mc_index, mc_insert, FiAddr};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::DgramShared;
use crate::cm_events::{self, CmChannel};
use crate::sys::{AddressHandle, AhAttr, CmEventKind, CmId, Gid, PortSpace, UDP_QKEY};

/// The destination QPN of every multicast datagram.
const MC_QPN: u32 = 0x00ff_ffff;

/// One joined group.
struct Group {
    addr: SocketAddr,
    /// The id that joined; destroying it would leave the group too.
    id: CmId,
    mgid: Gid,
    mlid: u16,
    ah: Arc<AddressHandle>,
    qkey: u32,
}

/// The groups an endpoint joined, by index (the low bits of their
/// address); a slot is reused once its group is left.
#[derive(Default)]
pub(super) struct Groups(Mutex<Vec<Option<Group>>>);

impl Groups {
    /// The address handle, QPN and Q_Key a send to group address `mc`
    /// goes out with; `None` if `mc` is no group's address,
    /// `AddrNotAvail` if it is one not (or no longer) joined.
    pub(super) fn dest(&self, mc: FiAddr) -> Option<Result<(Arc<AddressHandle>, u32, u32)>> {
        let i = mc_index(mc)?;
        Some(
            lock(&self.0)
                .get(i)
                .and_then(Option::as_ref)
                .map(|g| (g.ah.clone(), MC_QPN, g.qkey))
                .ok_or(Error::AddrNotAvail),
        )
    }
}

/// Routes an id's events while held.
struct Subscription<'a> {
    cm: &'a CmChannel,
    token: u64,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        self.cm.unsubscribe(self.token);
    }
}

impl DgramShared {
    /// `fi_join` of `group` (raw address bytes: a multicast IP of the
    /// endpoint's family; the port is not used, RoCE and IB groups are
    /// GIDs). Resolves with the address that sends to the group.
    pub(super) fn join(self: &Arc<Self>, group: Vec<u8>) -> BoxFuture<'static, Result<FiAddr>> {
        let me = self.clone();
        Box::pin(async move { me.join_group(&group).await })
    }

    async fn join_group(&self, raw: &[u8]) -> Result<FiAddr> {
        let group = decode_sockaddr(raw).map_err(|_| Error::Inval)?;
        if !is_group_for(group.ip(), self.local.ip()) {
            return Err(Error::Inval);
        }
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        let id = CmId::new(&self.cm.ch, PortSpace::Udp)?;
        let mut events = self.cm.subscribe(id.token());
        let _sub = Subscription {
            cm: &self.cm,
            token: id.token(),
        };
        id.bind_addr(SocketAddr::new(self.local.ip(), 0))?;
        id.join_multicast(group)?;
        let ev = cm_events::expect(&mut events, CmEventKind::MulticastJoin)
            .await
            .map_err(|(e, _)| e)?;
        let ud = ev.ud.ok_or(Error::Io)?;
        let mgid = ud.ah_attr.dgid.ok_or(Error::Io)?;
        // The queue pair takes datagrams of one Q_Key, the one rdma_cm
        // gives the UDP port space (and so its groups).
        if ud.qkey != UDP_QKEY {
            tracing::warn!(%group, qkey = ud.qkey, "verbs dgram: a group of another Q_Key");
            return Err(Error::Io);
        }
        let attr = AhAttr {
            traffic_class: self.tos.unwrap_or(ud.ah_attr.traffic_class),
            ..ud.ah_attr
        };
        let ah = AddressHandle::new(self.resolver.pd(), &attr)?;
        let mlid = ud.ah_attr.dlid;
        let mut list = lock(&self.groups.0);
        // Checked under the list's lock: a close either sees this group
        // or is seen here.
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        self.res.qp.attach_mcast(mgid, mlid)?;
        let g = Group {
            addr: group,
            id,
            mgid,
            mlid,
            ah,
            qkey: ud.qkey,
        };
        let mc = mc_insert(&mut list, g);
        tracing::debug!(%group, mgid = ?mgid.to_ip(), "verbs dgram: joined");
        Ok(mc)
    }

    /// Leaves the group joined as `mc`; `Inval` if it is none.
    pub(super) fn leave(&self, mc: FiAddr) -> Result<()> {
        let i = mc_index(mc).ok_or(Error::Inval)?;
        self.leave_slot(|list| list.get_mut(i).and_then(Option::take))
            .unwrap_or(Err(Error::Inval))
    }

    /// Leaves every group (the endpoint closes).
    pub(super) fn leave_all(&self) {
        while self
            .leave_slot(|list| list.iter_mut().find_map(Option::take))
            .is_some()
        {}
    }

    /// Leaves the group `pick` takes out of the list, if any. The queue
    /// pair stays attached to the group's GID while another handle of the
    /// endpoint joined the same group (an attachment is per queue pair
    /// and GID, not per join).
    fn leave_slot(
        &self,
        pick: impl FnOnce(&mut Vec<Option<Group>>) -> Option<Group>,
    ) -> Option<Result<()>> {
        let (g, detached) = {
            let mut list = lock(&self.groups.0);
            let g = pick(&mut list)?;
            let shared = list.iter().flatten().any(|o| o.mgid == g.mgid);
            // Detached first, so nothing of the group arrives once it is
            // left.
            let detached = if shared {
                Ok(())
            } else {
                self.res.qp.detach_mcast(g.mgid, g.mlid)
            };
            (g, detached)
        };
        let left = g.id.leave_multicast(g.addr);
        tracing::debug!(group = %g.addr, "verbs dgram: left");
        Some(detached.and(left))
    }
}

/// Whether `ip` may be a group of an endpoint bound to `local`.
fn is_group_for(ip: IpAddr, local: IpAddr) -> bool {
    ip.is_multicast() && ip.is_ipv4() == local.is_ipv4()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_addresses_are_marked_and_others_are_not() {
        let g = Groups::default();
        assert!(g.dest(5).is_none(), "an AV handle is not a group");
        assert!(g.dest(u64::MAX).is_none(), "FI_ADDR_UNSPEC is not a group");
        let first = mc_insert(&mut Vec::<Option<()>>::new(), ());
        assert!(matches!(g.dest(first), Some(Err(Error::AddrNotAvail))));
    }

    #[test]
    fn only_multicast_of_the_family_is_a_group() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(is_group_for("239.1.2.3".parse().unwrap(), v4));
        assert!(!is_group_for("10.0.0.2".parse().unwrap(), v4));
        assert!(!is_group_for("ff02::1".parse().unwrap(), v4));
    }
}
