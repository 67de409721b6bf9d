//! IP multicast (`FI_MULTICAST`, `fi_join`): each joined group is a
//! socket of its own, bound to the group's address and port and a member
//! of the group on the endpoint's interface, read by a task into the
//! endpoint's receive path; sends to the group leave through the
//! endpoint's own socket. See `docs/design.md`, "Multicast on udp".

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::Interest;
use weft_core::addr::FiAddr;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::rx::pass;

/// The bit that marks a group's address among AV handles (AV handles of
/// a udp endpoint, which has one receive context, never set it).
pub const MC_BIT: u64 = weft_core::addr::MC_ADDR_BIT;

/// One joined group.
#[derive(Debug)]
struct Group {
    addr: SocketAddr,
    /// Stops the group's reader; the socket (and with it the membership)
    /// goes when the reader does.
    task: tokio::task::AbortHandle,
}

/// The groups an endpoint joined, by index (the low bits of their
/// address); a slot is reused once its group is left.
#[derive(Debug, Default)]
pub struct Groups(Mutex<Vec<Option<Group>>>);

impl Groups {
    /// Where a group's address sends to.
    pub fn dest(&self, mc: FiAddr) -> Result<SocketAddr> {
        let i = index(mc)?;
        lock(&self.0)
            .get(i)
            .and_then(|g| g.as_ref().map(|g| g.addr))
            .ok_or(Error::AddrNotAvail)
    }

    /// Leaves every group (the endpoint closes).
    pub fn leave_all(&self) {
        for g in lock(&self.0).drain(..).flatten() {
            g.task.abort();
        }
    }
}

fn index(mc: FiAddr) -> Result<usize> {
    weft_core::addr::mc_index(mc).ok_or(Error::Inval)
}

/// A socket that receives `group`'s datagrams on `local`'s interface.
fn member_socket(group: SocketAddr, local: IpAddr) -> io::Result<std::net::UdpSocket> {
    let s = Socket::new(Domain::for_address(group), Type::DGRAM, Some(Protocol::UDP))?;
    // Several endpoints of a host may join the same group and port.
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&SockAddr::from(group))?;
    match (group.ip(), local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => s.join_multicast_v4(&g, &l)?,
        // Interface 0: the kernel's choice (IPv6 names interfaces by
        // index, not address).
        (IpAddr::V6(g), IpAddr::V6(_)) => s.join_multicast_v6(&g, 0)?,
        _ => return Err(io::ErrorKind::InvalidInput.into()),
    }
    Ok(s.into())
}

impl EpShared {
    /// Joins `group` (a multicast address of this endpoint's family, with
    /// the group's port): its datagrams come to this endpoint's receives
    /// from now on. The address returned sends to the group.
    pub fn join(self: &Arc<Self>, group: SocketAddr) -> Result<FiAddr> {
        let local = self.local.ip();
        if !group.ip().is_multicast() || group.is_ipv4() != local.is_ipv4() {
            return Err(Error::Inval);
        }
        // Our own sends to the group leave by this interface, and come
        // back to members on this host.
        let out = socket2::SockRef::from(&self.sock);
        match local {
            IpAddr::V4(l) => {
                if !l.is_unspecified() {
                    out.set_multicast_if_v4(&l)?;
                }
                out.set_multicast_loop_v4(true)?;
            }
            IpAddr::V6(_) => out.set_multicast_loop_v6(true)?,
        }
        let sock = member_socket(group, local)?;
        let _g = self.rt.enter();
        let tio = tokio::net::UdpSocket::from_std(sock)?;
        let weak = Arc::downgrade(self);
        let task = self.rt.spawn(async move {
            loop {
                if tio.readable().await.is_err() {
                    return;
                }
                let Some(ep) = weak.upgrade() else { return };
                if ep.is_closed() {
                    return;
                }
                let _ = tio.try_io(Interest::READABLE, || {
                    let mut st = lock(&ep.rx_state);
                    let o = pass(&ep, &mut st, group, |b| tio.try_recv_from(b));
                    if o.drained {
                        Err(io::ErrorKind::WouldBlock.into())
                    } else {
                        Ok(())
                    }
                });
                drop(ep);
                tokio::task::yield_now().await;
            }
        });
        let g = Group {
            addr: group,
            task: task.abort_handle(),
        };
        let mc = weft_core::addr::mc_insert(&mut lock(&self.groups.0), g);
        tracing::debug!(%group, "udp: joined");
        Ok(mc)
    }

    /// Leaves the group joined as `mc`.
    pub fn leave(&self, mc: FiAddr) -> Result<()> {
        let i = index(mc)?;
        let g = lock(&self.groups.0)
            .get_mut(i)
            .and_then(Option::take)
            .ok_or(Error::Inval)?;
        g.task.abort();
        tracing::debug!(group = %g.addr, "udp: left");
        Ok(())
    }
}
