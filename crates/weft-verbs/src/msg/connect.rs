//! The connecting side of a MSG endpoint's connection setup, and what
//! both sides share: the wait for `Established` and the start of the
//! connection's drivers.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use weft_core::addr::decode_sockaddr;
use weft_core::auth::ConnKind;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::{cm_decode, cm_encode, stream, Link, MsgShared};
use crate::cm_events::{self, CmChannel};
use crate::cq_poller;
use crate::keyproof::dial::{self, OpeningId};
use crate::keyproof::payload;
use crate::keyproof::Dialer;
use crate::sys::{CmEventKind, CmId, ConnParam, PortSpace};

/// Waits for `Established` on `events`, at most the endpoint's handshake
/// timeout.
pub(super) async fn established(
    ep: &MsgShared,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<crate::sys::CmEvent>,
) -> std::result::Result<crate::sys::CmEvent, (Error, Vec<u8>)> {
    let t = ep.cfg.limits.handshake_timeout;
    tokio::time::timeout(t, cm_events::expect(events, CmEventKind::Established))
        .await
        .unwrap_or(Err((Error::TimedOut, Vec::new())))
}

/// Resolves, builds the link, proves the key (if any) and connects to
/// `dest`: the peer's CM data. An error after the link was built lets
/// it go (`MsgShared::give_up_link`).
pub(super) async fn active_connect(
    ep: Arc<MsgShared>,
    dest: SocketAddr,
    cm: Vec<u8>,
) -> Result<Vec<u8>> {
    let tos = crate::tos_of(&ep.cfg.info)?;
    let chan = CmChannel::open(&ep.rt)?;
    let id = CmId::new(&chan.ch, PortSpace::Tcp)?;
    if let Some(t) = tos {
        // Before route resolution, which turns it into the route's (and
        // so the QP's) traffic class.
        id.set_tos(t)?;
    }
    let mut events = chan.subscribe(id.token());
    *lock(&ep.cm) = Some(chan.clone());
    let src = ep
        .cfg
        .src_addr
        .as_deref()
        .or(ep.cfg.info.src_addr.as_deref())
        .and_then(|a| decode_sockaddr(a).ok());
    // A keyed connect opens on an id of its own, resolved beside the one
    // that will carry the connection.
    let mut opening = match &ep.key {
        Some(k) => Some((
            Dialer::new(k.clone(), ConnKind::Msg)?,
            OpeningId::new(&chan, tos)?,
        )),
        None => None,
    };
    match &mut opening {
        Some((_, o)) => {
            let (a, b) = tokio::join!(
                cm_events::resolve(&id, &mut events, src, dest),
                o.resolve(src, dest)
            );
            a.and(b).map_err(|(e, _)| e)?;
        }
        None => cm_events::resolve(&id, &mut events, src, dest)
            .await
            .map_err(|(e, _)| e)?,
    }
    // A failure to build drops the id: its route goes with it.
    let token = id.token();
    let link = ep
        .build_link(id, ep.key.as_ref())
        .inspect_err(|_| chan.unsubscribe(token))?;
    // Every exit from here on with an error goes through one arm, which
    // lets the link go: the error, and what the EQ hears of it (if
    // anything: the CM data of a rejection).
    let r = async {
        let pd = match opening {
            Some((d, o)) => {
                let t = ep.cfg.limits.handshake_timeout;
                let qpn = link.qp.qp_num();
                dial::prove(&d, o, &link.id, &mut events, qpn, dest, &cm, t)
                    .await
                    .map_err(|e| (e, Some(Vec::new())))?
            }
            None => cm_encode(&cm).map_err(|e| (e, None))?,
        };
        link.id
            .connect(&ConnParam::new(&pd))
            .map_err(|e| (e, None))?;
        let ev = established(&ep, &mut events).await.map_err(|(e, data)| {
            // A keyed listener refuses an unkeyed request, or a proof
            // that does not hold, with a rejection of its own.
            (payload::rejection(e, &data), Some(cm_decode(&data)))
        })?;
        Ok(cm_decode(&ev.private_data))
    }
    .await
    .and_then(|peer_cm| {
        ep.start(&link, events).map_err(|e| (e, None))?;
        Ok(peer_cm)
    });
    match r {
        Ok(peer_cm) => Ok(peer_cm),
        Err((e, heard)) => {
            ep.give_up_link(&chan);
            if let Some(data) = heard {
                ep.report_failed(e, data);
            }
            Err(e)
        }
    }
}

impl MsgShared {
    /// Starts the completion driver and the connection watcher.
    pub(super) fn start(
        self: &Arc<Self>,
        link: &Arc<Link>,
        mut events: tokio::sync::mpsc::UnboundedReceiver<crate::sys::CmEvent>,
    ) -> Result<()> {
        if self.is_closed() {
            return Err(Error::OpBadState);
        }
        let h = cq_poller::start(
            &self.rt,
            self.cfg.wait,
            (link.cq.clone(), link.chan.clone()),
            self,
            &self.poller,
        )?;
        lock(&self.tasks).extend(h);
        let me = Arc::downgrade(self);
        let t = self.rt.spawn(async move {
            while let Some(ev) = events.recv().await {
                let Some(ep) = me.upgrade() else { return };
                match ev.kind {
                    CmEventKind::Disconnected => {
                        ep.peer_gone();
                        return;
                    }
                    // The device went away, or rdma_cm reports the
                    // established connection broken: nothing orderly.
                    CmEventKind::DeviceRemoval
                    | CmEventKind::ConnectError
                    | CmEventKind::Unreachable => {
                        ep.critical(ev.error().unwrap_or(Error::ConnAborted));
                        return;
                    }
                    _ => {}
                }
            }
        });
        lock(&self.tasks).push(t.abort_handle());
        // A close that came meanwhile may have drained the tasks before
        // ours were pushed, and stopped the poller slot before the driver
        // filled it. It marks the endpoint closed before it drains them,
        // so seen closed here it may have missed them (seen open, it did
        // not: it drains after our push). Its link was ours (`build_link`
        // published it), so it moved and handed off the queue pair: only
        // the driver and the watcher are left to stop.
        if self.is_closed() {
            let _ = self.stop_drivers();
            return Err(Error::OpBadState);
        }
        if !self.is_stream() {
            // A stream's probe starts with the stream.
            self.start_probe();
        }
        // From here no give-up can end this queue pair (see `give_up`):
        // sends may go unsignaled.
        self.quiet_ok.store(true, Ordering::Relaxed);
        stream::established(self);
        Ok(())
    }
}
