//! A listening rdma_cm id: connection requests become `ConnReq` events.
//!
//! Each request holds a QP-less id (kernel state, no device resources)
//! and a place in the passive endpoint's count until the application
//! lets go of it (drops the event or request, rejected or not, or the
//! endpoint that accepted it: the tcp provider counts the same way). At
//! `limits.max_conns` places (`PassiveEndpoint::set_conn_limits`, else
//! `FI_TCP_MAX_CONNS`) more requests are rejected at once and each is
//! reported on the EQ with the requester's address, in the EQ's room
//! only, so a flood cannot grow the queue. A request the
//! application does not answer waits for it as long as it likes (as with
//! libfabric's verbs provider); the accepting endpoint's handshake is
//! bounded by its `handshake_timeout`.
//!
//! A listener with an authorization key (`crate::keyproof`) answers a
//! keyed opening with a challenge and reports `FI_CONNREQ` only for a
//! request that proved the key; any other request (another key, no key,
//! a forged, replayed or late proof) is rejected as `FI_EKEYREJECTED` and
//! reported with the requester's address, before it counts against the
//! pending requests. A listener without a key refuses keyed requests the
//! same way.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::runtime::Handle;
use weft_core::addr::encode_sockaddr;
use weft_core::auth::{effective_key, AuthKey, ConnKind};
use weft_core::eventq::{ConnHandle, EqErrEntry, EqEvent, EqEventKind, EqShared};
use weft_core::provider::{PassiveConfig, ProviderPassive};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::cm_events::CmChannel;
use crate::keyproof::{Gate, Verdict};
use crate::msg::{cm_decode, cm_encode};
use crate::sys::{CmEventKind, CmId, PortSpace};
use weft_core::limits::ConnSlot;

/// A connection request waiting for accept or reject: the new id, which
/// reports on the listener's channel.
#[derive(Debug)]
pub struct PendingReq {
    id: Mutex<Option<CmId>>,
    chan: Arc<CmChannel>,
    /// The key the request proved (`None`: a listener without one).
    proven: Option<AuthKey>,
    /// Its place among the passive endpoint's requests.
    _slot: ConnSlot,
}

impl Drop for PendingReq {
    fn drop(&mut self) {
        // Never answered: the id is destroyed (which rejects it) and its
        // route on the channel goes with it.
        if let Some(id) = lock(&self.id).take() {
            self.chan.unsubscribe(id.token());
        }
    }
}

impl PendingReq {
    /// Takes the id (once: a second accept or reject is `OpBadState`).
    pub fn take(&self) -> Result<(CmId, Arc<CmChannel>)> {
        let id = lock(&self.id).take().ok_or(Error::OpBadState)?;
        Ok((id, self.chan.clone()))
    }

    /// The key the request proved, if the listener held one.
    pub fn proven(&self) -> Option<&AuthKey> {
        self.proven.as_ref()
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
    /// Binds `addr` (an address of an RDMA device's netdev) and listens,
    /// with the limits of the environment and the IP TOS `tos`.
    pub fn open(
        addr: SocketAddr,
        cfg: PassiveConfig,
        tos: Option<u8>,
        rt: Handle,
    ) -> Result<VerbsPassive> {
        let PassiveConfig {
            info,
            backlog,
            eq,
            fid,
            context,
            limits,
            ..
        } = cfg;
        let key = effective_key(
            info.ep_attr.auth_key.as_deref(),
            info.domain_attr.auth_key.as_deref(),
        )?;
        let gate = Gate::new(key, ConnKind::Msg, limits.handshake_timeout)?;
        let chan = CmChannel::open(&rt)?;
        let id = CmId::new(&chan.ch, PortSpace::Tcp)?;
        if let Some(t) = tos {
            // rdma_cm copies it to the listener's per-device ids; the
            // endpoint that accepts a request sets its own on the new id.
            id.set_tos(t)?;
        }
        id.bind_addr(addr)?;
        id.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
        let local = id.local_addr().unwrap_or(addr);
        let mut events = chan.subscribe(id.token());
        let eq_w: Weak<EqShared> = Arc::downgrade(&eq);
        let ch = chan.clone();
        let pending = Arc::new(AtomicUsize::new(0));
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
                // Written, not pushed: dropped once the EQ is full.
                let report = |err: Error| {
                    if let Some(p) = peer {
                        let _ = eq.write(Err(EqErrEntry {
                            fid,
                            context,
                            data: 0,
                            err,
                            prov_errno: err.code(),
                            err_data: Vec::new(),
                            peer_addr: Some(encode_sockaddr(&p)),
                        }));
                    }
                };
                let here = new_id.local_addr().unwrap_or(local);
                let (cm_data, proven) = match gate.on_request(
                    &ev.private_data,
                    peer.map(|p| p.ip()),
                    here,
                    Instant::now(),
                ) {
                    Verdict::Plain => (cm_decode(&ev.private_data), None),
                    Verdict::Proven(data, k) => (data, gate.proven(k).cloned()),
                    Verdict::Reject { data, report: why } => {
                        let _ = new_id.reject(&data);
                        ch.unsubscribe(new_id.token());
                        if let Some(err) = why {
                            tracing::debug!(?peer, "verbs: key not proven; request refused");
                            report(err);
                        }
                        continue;
                    }
                };
                let Some(slot) = ConnSlot::try_take(&pending, limits.max_conns) else {
                    tracing::debug!(
                        ?peer,
                        "verbs: pending connection requests at the limit; refused"
                    );
                    let _ = new_id.reject(&[]);
                    ch.unsubscribe(new_id.token());
                    report(Error::ConnRefused);
                    continue;
                };
                let req: ConnHandle = Arc::new(PendingReq {
                    id: Mutex::new(Some(new_id)),
                    chan: ch.clone(),
                    proven,
                    _slot: slot,
                });
                let mut e = EqEvent::new(EqEventKind::ConnReq, fid, context, 0);
                e.cm_data = cm_data;
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
        let req = request_of(conn)?;
        let data = cm_encode(&data)?;
        let (id, chan) = req.take()?;
        let r = id.reject(&data);
        chan.unsubscribe(id.token());
        r
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
