//! A listening rdma_cm id: connection requests become `ConnReq` events.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::Handle;
use weft_core::addr::encode_sockaddr;
use weft_core::eventq::{ConnHandle, EqEvent, EqEventKind, EqShared};
use weft_core::provider::ProviderPassive;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::cmchan::CmChannel;
use crate::msg::{cm_decode, cm_encode};
use crate::sys::{CmEventKind, CmId, PortSpace};

/// A connection request waiting for accept or reject: the new id, which
/// reports on the listener's channel.
#[derive(Debug)]
pub struct PendingReq {
    id: Mutex<Option<CmId>>,
    chan: Arc<CmChannel>,
}

impl PendingReq {
    /// Takes the id (once: a second accept or reject is `OpBadState`).
    pub fn take(&self) -> Result<(CmId, Arc<CmChannel>)> {
        let id = lock(&self.id).take().ok_or(Error::OpBadState)?;
        Ok((id, self.chan.clone()))
    }
}

/// The request behind a `ConnReq` event's handle.
pub fn request_of(h: &ConnHandle) -> Result<Arc<PendingReq>> {
    h.clone().downcast::<PendingReq>().map_err(|_| Error::Inval)
}

/// The passive endpoint.
#[derive(Debug)]
pub struct VerbsPassive {
    chan: Arc<CmChannel>,
    id: CmId,
    local: SocketAddr,
    task: tokio::task::AbortHandle,
}

impl VerbsPassive {
    /// Binds `addr` (an address of an RDMA device's netdev) and listens.
    pub fn open(
        addr: SocketAddr,
        backlog: u32,
        eq: Arc<EqShared>,
        fid: u64,
        context: u64,
        rt: Handle,
    ) -> Result<VerbsPassive> {
        let chan = CmChannel::open(&rt)?;
        let id = CmId::new(&chan.ch, PortSpace::Tcp)?;
        id.bind_addr(addr)?;
        id.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
        let local = id.local_addr().unwrap_or(addr);
        let mut events = chan.subscribe(id.token());
        let eq_w: Weak<EqShared> = Arc::downgrade(&eq);
        let ch = chan.clone();
        let task = rt.spawn(async move {
            while let Some(mut ev) = events.recv().await {
                if ev.kind != CmEventKind::ConnectRequest {
                    continue;
                }
                let Some(new_id) = ev.new_id.take() else {
                    continue;
                };
                let Some(eq) = eq_w.upgrade() else { return };
                let peer = new_id.peer_addr();
                let req: ConnHandle = Arc::new(PendingReq {
                    id: Mutex::new(Some(new_id)),
                    chan: ch.clone(),
                });
                let mut e = EqEvent::new(EqEventKind::ConnReq, fid, context, 0);
                e.cm_data = cm_decode(&ev.private_data);
                e.conn = Some(req);
                e.peer_addr = peer.map(|p| encode_sockaddr(&p));
                eq.push(Ok(e));
            }
        });
        Ok(VerbsPassive {
            chan,
            id,
            local,
            task: task.abort_handle(),
        })
    }
}

impl ProviderPassive for VerbsPassive {
    fn local_addr(&self) -> Vec<u8> {
        encode_sockaddr(&self.local)
    }

    fn reject(&self, conn: &ConnHandle, data: Vec<u8>) -> Result<()> {
        let (id, _) = request_of(conn)?.take()?;
        id.reject(&cm_encode(&data)?)
    }

    fn set_backlog(&self, _backlog: usize) -> Result<()> {
        // rdma_listen fixed it.
        Err(Error::OpBadState)
    }

    fn close(&self) {
        self.task.abort();
        self.chan.unsubscribe(self.id.token());
    }
}

impl Drop for VerbsPassive {
    fn drop(&mut self) {
        self.close();
    }
}
