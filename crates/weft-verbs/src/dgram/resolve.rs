//! Resolving a DGRAM address: an AV insert turns the IP and port of a
//! peer's rdma_cm id into an address handle, queue pair number and Q_Key.
//!
//! rdma_cm does the work: address resolution (which device and GID reach
//! the IP), route resolution, then a service ID resolution request (SIDR)
//! that the peer endpoint answers with its queue pair. Each step is an
//! event on the domain's event channel, so an insert is a real future and
//! many of them run at once.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::runtime::Handle;
use weft_core::addr::decode_sockaddr;
use weft_core::hash::FastMap;
use weft_core::provider::AddrResolver;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::cm_events::{self, CmChannel};
use crate::sys::{AddressHandle, CmEventKind, CmId, ConnParam, PortSpace, ProtectionDomain};

/// What a send to one resolved address needs.
#[derive(Debug)]
pub struct UdPeer {
    /// On the domain's protection domain, as the endpoints' queue pairs.
    pub ah: Arc<AddressHandle>,
    /// The peer's queue pair.
    pub qpn: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

#[derive(Default)]
struct Peers {
    by_addr: FastMap<Vec<u8>, Arc<UdPeer>>,
    /// (peer IP, queue pair) → address bytes: how a datagram's source
    /// (GRH and source QP) finds its AV entry.
    by_qp: FastMap<(IpAddr, u32), Vec<u8>>,
}

/// The DGRAM domain's resolver and the peers it resolved.
pub struct UdResolver {
    me: Weak<UdResolver>,
    /// The domain's device address: resolutions start from it.
    src_ip: IpAddr,
    pd: Arc<ProtectionDomain>,
    chan: Mutex<Option<Arc<CmChannel>>>,
    peers: Mutex<Peers>,
}

impl std::fmt::Debug for UdResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdResolver")
            .field("src_ip", &self.src_ip)
            .field("peers", &lock(&self.peers).by_addr.len())
            .finish()
    }
}

impl UdResolver {
    /// A resolver for a domain whose device owns `src_ip`.
    pub fn new(src_ip: IpAddr, pd: Arc<ProtectionDomain>) -> Arc<UdResolver> {
        Arc::new_cyclic(|me| UdResolver {
            me: me.clone(),
            src_ip,
            pd,
            chan: Mutex::new(None),
            peers: Mutex::new(Peers::default()),
        })
    }

    /// The protection domain address handles (and so the endpoints'
    /// queue pairs) live on.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The peer at `addr` (raw AV bytes), once resolved.
    pub fn peer(&self, addr: &[u8]) -> Option<Arc<UdPeer>> {
        lock(&self.peers).by_addr.get(addr).cloned()
    }

    /// The AV bytes of the resolved peer that sends from queue pair `qpn`
    /// at `ip`.
    pub fn source(&self, ip: IpAddr, qpn: u32) -> Option<Vec<u8>> {
        lock(&self.peers).by_qp.get(&(ip, qpn)).cloned()
    }

    /// The event channel, opened on the runtime of the first resolution.
    fn channel(&self) -> Result<Arc<CmChannel>> {
        let mut g = lock(&self.chan);
        if let Some(c) = g.as_ref() {
            return Ok(c.clone());
        }
        let rt = Handle::try_current().map_err(|_| Error::NoDev)?;
        let c = CmChannel::open(&rt)?;
        *g = Some(c.clone());
        Ok(c)
    }

    async fn resolve_one(self: Arc<Self>, addr: Vec<u8>) -> Result<()> {
        let dest = decode_sockaddr(&addr)?;
        let chan = self.channel()?;
        let id = CmId::new(&chan.ch, PortSpace::Udp)?;
        let token = id.token();
        let mut events = chan.subscribe(token);
        let r = async {
            let src = SocketAddr::new(self.src_ip, 0);
            cm_events::resolve(&id, &mut events, Some(src), dest)
                .await
                .map_err(|(e, _)| e)?;
            id.connect(&ConnParam::new(&[]))?;
            let ev = cm_events::expect(&mut events, CmEventKind::Established)
                .await
                .map_err(|(e, _)| match e {
                    // The host answered, but no endpoint listens at that
                    // port (rxe reports the SIDR reply's status as EPERM).
                    Error::TimedOut => Error::TimedOut,
                    _ => Error::ConnRefused,
                })?;
            ev.ud.ok_or(Error::Io)
        }
        .await;
        chan.unsubscribe(token);
        drop(id);
        let ud = r?;
        let ah = AddressHandle::new(&self.pd, &ud.ah_attr)?;
        tracing::debug!(peer = %dest, qpn = ud.qp_num, "verbs dgram address resolved");
        let peer = Arc::new(UdPeer {
            ah,
            qpn: ud.qp_num,
            qkey: ud.qkey,
        });
        let mut g = lock(&self.peers);
        if let Some(old) = g.by_addr.insert(addr.clone(), peer) {
            g.by_qp.remove(&(dest.ip(), old.qpn));
        }
        g.by_qp.insert((dest.ip(), ud.qp_num), addr);
        Ok(())
    }
}

impl AddrResolver for UdResolver {
    fn resolve(&self, addr: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        match self.me.upgrade() {
            Some(me) => me.resolve_one(addr).boxed(),
            // The domain is being torn down.
            None => async { Err(Error::Canceled) }.boxed(),
        }
    }

    fn forget(&self, addr: &[u8]) {
        let mut g = lock(&self.peers);
        if let Some(p) = g.by_addr.remove(addr) {
            if let Ok(a) = decode_sockaddr(addr) {
                g.by_qp.remove(&(a.ip(), p.qpn));
            }
        }
    }
}
