//! Connections to peers: the listener, connects on first use, the
//! simultaneous-connect rule, and the end of a connection.
//!
//! What a peer may make the endpoint hold (see the module docs of
//! [`super`] for the rules): every connection, inbound or outbound, from
//! its request or connect on, holds a [`ConnSlot`] until its QP and id are
//! destroyed; an inbound request finds one free or is rejected. Each
//! handshake is bounded by `limits.handshake_timeout`. A peer's entry
//! lives while it has a connection, a connect in progress or queued work.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;
use weft_core::addr::encode_sockaddr;
use weft_core::auth::ConnKind;
use weft_core::credits::Credits;
use weft_core::hash::FastMap;
use weft_core::sync::lock;
use weft_core::{Error, Result};

use super::{rx, Conn, Deferred, PeerState, RdmShared, ReadJob, Unexp, QP_INLINE, QP_SEND_WR};
use crate::cm_data::{cm_decode, cm_encode, keyed_hello, parse_hello, parse_keyed_hello};
use crate::cm_events;
use crate::keyproof::dial::{self, OpeningId};
use crate::keyproof::{payload, Dialer, Verdict};
use crate::sys::{CmEvent, CmEventKind, CmId, ConnParam, PortSpace, QpCaps, QpInitAttr, QpType};
use weft_core::flags::OpFlags;
use weft_core::limits::ConnSlot;

/// Rejection data meaning "we are connecting to you too, and ours wins".
const SIMULTANEOUS: &[u8] = b"weft-rdm: crossing connect";
/// After losing a crossing connect, how long to wait for the winner's
/// request before trying again.
const CROSSING_RETRY: Duration = Duration::from_millis(100);

type Events = UnboundedReceiver<CmEvent>;
/// A failed attempt: the error, the peer's CM data (a rejection's reason)
/// and the connection if one was built.
type Failed = (Error, Vec<u8>, Option<Arc<Conn>>);
/// How a connect or accept attempt ended.
type Attempt = std::result::Result<Arc<Conn>, Failed>;

/// Starts accepting connection requests on the endpoint's listener.
pub(super) fn listen(ep: &Arc<RdmShared>) {
    let mut events = ep.cm.subscribe(ep.listener.token());
    let w = Arc::downgrade(ep);
    let t = ep.rt.spawn(async move {
        while let Some(mut ev) = events.recv().await {
            if ev.kind != CmEventKind::ConnectRequest {
                continue;
            }
            let Some(id) = ev.new_id.take() else { continue };
            let Some(ep) = w.upgrade() else { return };
            on_request(&ep, id, &ev.private_data);
        }
    });
    lock(&ep.tasks).push(t.abort_handle());
}

/// Our CM data: where we listen, which incarnation of the endpoint this
/// is, and what we take (the feature byte).
fn hello(ep: &RdmShared) -> Result<Vec<u8>> {
    crate::cm_data::hello(&ep.local, ep.nonce, ep.res.lanes.features())
}

impl RdmShared {
    /// Reports a connection the endpoint refused or dropped on its EQ,
    /// with the requester's address (where its request came from, not
    /// the address its hello claims). Bounded by the EQ's size.
    fn report(&self, err: Error, from: Option<SocketAddr>) {
        if let Some(a) = from {
            self.cfg.eq_peer_error(err, encode_sockaddr(&a));
        }
    }
}

/// Rejects a request: the id is destroyed (dropped) here, so its route
/// on the channel goes too.
fn refuse(ep: &RdmShared, id: CmId, data: &[u8]) {
    let _ = id.reject(data);
    ep.cm.unsubscribe(id.token());
}

fn on_request(ep: &Arc<RdmShared>, id: CmId, private: &[u8]) {
    let from = id.peer_addr();
    // The key first: a keyed listener challenges openings and takes only
    // proven requests (whose hello is the proof's data); refusals are
    // reported with the requester's address.
    let here = id.local_addr().unwrap_or(ep.local);
    let (claimed, lane) =
        match ep
            .gate
            .on_request(private, from.map(|a| a.ip()), here, Instant::now())
        {
            Verdict::Plain => (parse_hello(private), 0),
            Verdict::Proven(data, k) => (
                from.ok_or(Error::Inval)
                    .and_then(|f| parse_keyed_hello(&data, f.ip())),
                ep.keys.lane_of_proven(k),
            ),
            Verdict::Reject { data, report } => {
                refuse(ep, id, &data);
                if let Some(err) = report {
                    tracing::debug!(peer = ?from, "verbs rdm: key not proven; request refused");
                    ep.key_rejected.fetch_add(1, Ordering::Relaxed);
                    ep.report(err, from);
                }
                return;
            }
        };
    // Before anything is built for it: a flood of requests must cost a
    // rejection each, not a QP each.
    let Some(slot) = ConnSlot::try_take(&ep.conn_count, ep.cfg.limits.max_conns) else {
        tracing::debug!(peer = ?from, "verbs rdm connection limit reached; request refused");
        refuse(ep, id, &[]);
        ep.report(Error::ConnRefused, from);
        return;
    };
    let Ok((peer, nonce, features)) = claimed else {
        // Not a Weft RDM endpoint: it did not say where it listens.
        tracing::debug!(peer = ?from, "verbs rdm request without a hello; refused");
        refuse(ep, id, &[]);
        ep.report(Error::Io, from);
        return;
    };
    let mut peers = lock(&ep.peers);
    let p = peers.entry(peer).or_default();
    if p.lane != lane && !p.is_empty() {
        // The peer's address is connected (or connecting) under another
        // key: one connection per address, and this one would cross jobs.
        drop(peers);
        refuse(ep, id, &payload::refused());
        tracing::debug!(peer = ?from, "verbs rdm: another key than the peer's connection");
        ep.key_rejected.fetch_add(1, Ordering::Relaxed);
        ep.report(Error::KeyRejected, from);
        return;
    }
    p.lane = lane;
    let ours_wins = p.connecting && p.conn.is_none() && ep.local_raw < encode_sockaddr(&peer);
    // The same incarnation asking again while connected: a retry that
    // crossed our own connection, not a restart; keep the one we have.
    let duplicate = p
        .conn
        .as_ref()
        .is_some_and(|u| u.peer_nonce() == nonce && !u.is_dead());
    if p.accepting || ours_wins || duplicate {
        // Each of these has something in the entry: it stays.
        drop(peers);
        refuse(ep, id, &cm_encode(SIMULTANEOUS).unwrap_or_default());
        return;
    }
    p.accepting = true;
    drop(peers);
    let ep2 = ep.clone();
    let t = ep.rt.spawn(async move {
        let token = id.token();
        let mut events = ep2.cm.subscribe(token);
        let r = accept(&ep2, id, (peer, lane), (nonce, features), slot, &mut events).await;
        conn_done(&ep2, peer, false, r, events, Some(token));
    });
    lock(&ep.tasks).push(t.abort_handle());
}

/// Waits for `Established`, at most the handshake timeout: a peer that
/// never completes its side must not hold a QP.
async fn established(
    ep: &RdmShared,
    events: &mut Events,
) -> std::result::Result<CmEvent, (Error, Vec<u8>)> {
    let t = ep.cfg.limits.handshake_timeout;
    tokio::time::timeout(t, cm_events::expect(events, CmEventKind::Established))
        .await
        .unwrap_or(Err((Error::TimedOut, Vec::new())))
}

async fn accept(
    ep: &Arc<RdmShared>,
    id: CmId,
    (peer, lane): (SocketAddr, usize),
    (nonce, features): (u64, u8),
    slot: ConnSlot,
    events: &mut Events,
) -> Attempt {
    if let Some(t) = ep.tos {
        id.set_tos(t).map_err(|e| (e, Vec::new(), None))?;
    }
    let conn = new_conn(ep, id, (peer, lane), (nonce, features), slot)
        .map_err(|e| (e, Vec::new(), None))?;
    let fail = |e: Error, d: Vec<u8>| (e, d, Some(conn.clone()));
    let pd = hello(ep).map_err(|e| fail(e, Vec::new()))?;
    conn.id
        .accept(&ConnParam::new(&pd))
        .map_err(|e| fail(e, Vec::new()))?;
    established(ep, events).await.map_err(|(e, d)| fail(e, d))?;
    Ok(conn)
}

/// Connects to `peer` proving the key of `lane` (the caller has marked
/// the peer `active`).
pub(super) fn connect(ep: &RdmShared, peer: SocketAddr, lane: usize) {
    let Some(ep) = ep.me.upgrade() else { return };
    // Counted from now, never refused: the application asked for it.
    let slot = ConnSlot::take(&ep.conn_count);
    let ep2 = ep.clone();
    let t = ep.rt.spawn(async move {
        let id = match CmId::new(&ep2.cm.ch, PortSpace::Tcp) {
            Ok(id) => id,
            Err(e) => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                drop(tx);
                conn_done(&ep2, peer, true, Err((e, Vec::new(), None)), rx, None);
                return;
            }
        };
        let token = id.token();
        let mut events = ep2.cm.subscribe(token);
        let r = active(&ep2, id, (peer, lane), slot, &mut events).await;
        conn_done(&ep2, peer, true, r, events, Some(token));
    });
    lock(&ep.tasks).push(t.abort_handle());
}

async fn active(
    ep: &Arc<RdmShared>,
    id: CmId,
    (peer, lane): (SocketAddr, usize),
    slot: ConnSlot,
    events: &mut Events,
) -> Attempt {
    let plain = |(e, d): (Error, Vec<u8>)| (e, d, None);
    let bare = |e: Error| (e, Vec::new(), None);
    if let Some(t) = ep.tos {
        // Before route resolution, which makes it the QP's traffic class.
        id.set_tos(t).map_err(bare)?;
    }
    // A keyed connect opens on an id of its own, resolved beside the one
    // that will carry the connection.
    let mut opening = match ep.keys.key_of(lane) {
        Some(k) => Some((
            Dialer::new(k.clone(), ConnKind::Rdm).map_err(bare)?,
            OpeningId::new(&ep.cm, ep.tos).map_err(bare)?,
        )),
        None => None,
    };
    let src = SocketAddr::new(ep.local.ip(), 0);
    match &mut opening {
        Some((_, o)) => {
            let (a, b) = tokio::join!(
                cm_events::resolve(&id, events, Some(src), peer),
                o.resolve(Some(src), peer)
            );
            a.and(b).map_err(plain)?;
        }
        None => cm_events::resolve(&id, events, Some(src), peer)
            .await
            .map_err(plain)?,
    }
    // The peer's hello comes with the accept: set once established.
    let conn = new_conn(ep, id, (peer, lane), (0, 0), slot).map_err(bare)?;
    let fail = |e: Error, d: Vec<u8>| (e, d, Some(conn.clone()));
    let pd = match opening {
        Some((d, o)) => {
            let t = ep.cfg.limits.handshake_timeout;
            let qpn = conn.qp.qp_num();
            let data = keyed_hello(ep.local.port(), ep.nonce, ep.res.lanes.features());
            dial::prove(&d, o, &conn.id, events, qpn, peer, &data, t)
                .await
                .map_err(|e| fail(e, Vec::new()))?
        }
        None => hello(ep).map_err(|e| fail(e, Vec::new()))?,
    };
    conn.id
        .connect(&ConnParam::new(&pd))
        .map_err(|e| fail(e, Vec::new()))?;
    let ev = established(ep, events)
        .await
        .map_err(|(e, d)| fail(payload::rejection(e, &d), d))?;
    let (_, nonce, features) = parse_hello(&ev.private_data).map_err(|e| fail(e, Vec::new()))?;
    conn.peer_hello_set(nonce, features);
    Ok(conn)
}

/// A QP for `id` on the endpoint's CQ and the protection domain and
/// shared receive queue of `lane`'s key; `(nonce, features)` is the
/// peer's hello, (0, 0) until it is known.
fn new_conn(
    ep: &RdmShared,
    id: CmId,
    (peer, lane): (SocketAddr, usize),
    (nonce, features): (u64, u8),
    slot: ConnSlot,
) -> Result<Arc<Conn>> {
    let info = &ep.cfg.info;
    let sge = info.tx_attr.iov_limit.max(info.rx_attr.iov_limit) as u32;
    let lane = ep.lane(lane)?;
    let qp = id.create_qp(
        &lane.pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: ep.res.cq.clone(),
            recv_cq: ep.res.cq.clone(),
            srq: Some(lane.srq.clone()),
            caps: QpCaps {
                // A write with remote CQ data, and a request-to-send
                // behind its window's bind, take two work requests on
                // one credit.
                max_send_wr: 2 * QP_SEND_WR as u32,
                max_recv_wr: 0,
                max_send_sge: sge,
                max_recv_sge: 1,
                max_inline_data: (info.tx_attr.inject_size + weft_core::wire::rdm::HDR)
                    .min(QP_INLINE) as u32,
            },
            sq_sig_all: false,
        },
    )?;
    let conn = Arc::new(Conn {
        id,
        qp,
        peer,
        peer_nonce_cell: std::sync::atomic::AtomicU64::new(nonce),
        peer_features: std::sync::atomic::AtomicU8::new(features),
        sq: Credits::new(QP_SEND_WR),
        dead: std::sync::atomic::AtomicBool::new(false),
        reads: std::sync::atomic::AtomicUsize::new(0),
        orphans: std::sync::Mutex::new(Vec::new()),
        lane,
        probe: crate::liveness::Probe::default(),
        parked: std::sync::Mutex::new(Vec::new()),
        _slot: slot,
    });
    lock(&ep.by_qp).insert(conn.qp.qp_num(), conn.clone());
    Ok(conn)
}

/// Removes `peer`'s entry if nothing is kept for it any more (and gives
/// the map's room back after a crowd of peers has gone).
pub(crate) fn prune(peers: &mut FastMap<SocketAddr, PeerState>, peer: &SocketAddr) {
    if peers.get(peer).is_some_and(PeerState::is_empty) {
        peers.remove(peer);
        let len = peers.len();
        if peers.capacity() > 64 && len * 4 < peers.capacity() {
            peers.shrink_to(len * 2);
        }
    }
}

/// The end of a connect or accept attempt. `token` is the attempt's id's
/// route on the channel: a failed attempt's goes with it.
fn conn_done(
    ep: &Arc<RdmShared>,
    peer: SocketAddr,
    was_active: bool,
    r: Attempt,
    events: Events,
    token: Option<u64>,
) {
    if ep.is_closed() {
        return;
    }
    if let (Err(_), Some(t)) = (&r, token) {
        ep.cm.unsubscribe(t);
    }
    let mut peers = lock(&ep.peers);
    let p = peers.entry(peer).or_default();
    if was_active {
        p.connecting = false;
    } else {
        p.accepting = false;
    }
    match r {
        Ok(conn)
            if p.conn
                .as_ref()
                .is_some_and(|u| !u.is_dead() && u.peer_nonce() == conn.peer_nonce()) =>
        {
            // Both of a crossing pair came up: one connection is enough,
            // and the one already carrying traffic stays.
            drop(peers);
            kill(ep, &conn, Error::Already);
        }
        Ok(conn) => {
            p.lane = conn.lane.idx;
            let old = p.conn.replace(conn.clone());
            ep.flush_locked(p);
            drop(peers);
            if let Some(old) = old {
                // The peer came back with a new connection (it restarted
                // at the same address): the old one is dead.
                kill(ep, &old, Error::ConnReset);
            }
            tracing::debug!(%peer, active = was_active, "verbs rdm connection up");
            watch(ep, conn, events);
        }
        Err((err, data, conn)) => {
            let crossing = was_active && cm_decode(&data) == SIMULTANEOUS;
            let waiting = p.conn.is_none() && !p.pending.is_empty();
            let retry = crossing && waiting && !p.accepting;
            let give_up = !crossing && waiting && !p.connecting && !p.accepting;
            let failed: Vec<Deferred> = if give_up {
                let n = p.pending.len();
                ep.backlogged.fetch_sub(n, Ordering::AcqRel);
                p.pending.drain(..).collect()
            } else {
                Vec::new()
            };
            if retry {
                p.connecting = true;
            }
            prune(&mut peers, &peer);
            drop(peers);
            if let Some(c) = &conn {
                forget(ep, c);
                if !was_active && err == Error::TimedOut {
                    tracing::debug!(%peer, "verbs rdm handshake timed out; connection dropped");
                    ep.report(err, c.id.peer_addr());
                }
            }
            if !crossing {
                tracing::debug!(%peer, error = %err, "verbs rdm connect failed");
            }
            if was_active && err == Error::KeyRejected {
                // The acceptor reports it too, with our address.
                ep.key_rejected.fetch_add(1, Ordering::Relaxed);
                ep.report(err, Some(peer));
            }
            for item in failed {
                ep.fail_item(item, err);
            }
            if retry {
                let w = Arc::downgrade(ep);
                let t = ep.rt.spawn(async move {
                    tokio::time::sleep(CROSSING_RETRY).await;
                    let Some(ep) = w.upgrade() else { return };
                    let go = {
                        let mut peers = lock(&ep.peers);
                        let p = peers.entry(peer).or_default();
                        let go = p.conn.is_none() && !p.accepting && !p.pending.is_empty();
                        p.connecting = go;
                        let lane = p.lane;
                        prune(&mut peers, &peer);
                        go.then_some(lane)
                    };
                    if let Some(lane) = go {
                        connect(&ep, peer, lane);
                    }
                });
                lock(&ep.tasks).push(t.abort_handle());
            }
        }
    }
}

/// Waits for the end of an established connection.
fn watch(ep: &Arc<RdmShared>, conn: Arc<Conn>, mut events: Events) {
    let w = Arc::downgrade(ep);
    let t = ep.rt.spawn(async move {
        while let Some(ev) = events.recv().await {
            match ev.kind {
                CmEventKind::Disconnected
                | CmEventKind::DeviceRemoval
                | CmEventKind::TimewaitExit => {
                    if let Some(ep) = w.upgrade() {
                        kill(&ep, &conn, Error::ConnReset);
                    }
                    return;
                }
                _ => {}
            }
        }
    });
    lock(&ep.tasks).push(t.abort_handle());
}

/// Drops a connection that never came up (its route is already gone).
fn forget(ep: &RdmShared, c: &Arc<Conn>) {
    c.dead.store(true, Ordering::Release);
    remove_qp(ep, c);
}

fn remove_qp(ep: &RdmShared, c: &Arc<Conn>) {
    let mut g = lock(&ep.by_qp);
    if g.get(&c.qp.qp_num()).is_some_and(|x| Arc::ptr_eq(x, c)) {
        g.remove(&c.qp.qp_num());
    }
}

/// Work queued for the peer that needed connection `c` (reads and pulls
/// of what it announced): it can no longer be done.
fn cut_off(ep: &RdmShared, p: &mut PeerState, c: &Arc<Conn>) -> Vec<Deferred> {
    let needs_c = |d: &Deferred| match d {
        Deferred::Read(job) => Arc::ptr_eq(&job.conn, c),
        Deferred::Pull(_, _, from) => Arc::ptr_eq(from, c),
        _ => false,
    };
    if !p.pending.iter().any(needs_c) {
        return Vec::new();
    }
    let (cut, keep): (Vec<Deferred>, _) = p.pending.drain(..).partition(needs_c);
    p.pending = keep.into();
    ep.backlogged.fetch_sub(cut.len(), Ordering::AcqRel);
    cut
}

/// A connection ended: what is posted on it is flushed (each operation
/// completes with an error), transfers the peer still owed a "finished"
/// fail, receives that had matched its messages go back to the posted
/// receives, its unmatched announcements are dropped, and later sends to
/// the peer connect anew.
pub(crate) fn kill(ep: &Arc<RdmShared>, c: &Arc<Conn>, err: Error) {
    if c.dead.swap(true, Ordering::AcqRel) {
        return;
    }
    let _ = c.id.disconnect();
    let _ = c.qp.to_error();
    let (reconnect, cut) = {
        let mut peers = lock(&ep.peers);
        let (reconnect, cut) = match peers.get_mut(&c.peer) {
            Some(p) => {
                let cut = cut_off(ep, p, c);
                let reconnect = if p.conn.as_ref().is_some_and(|u| Arc::ptr_eq(u, c)) {
                    p.conn = None;
                    let go = !p.pending.is_empty() && !p.connecting && !p.accepting;
                    p.connecting |= go;
                    go.then_some(p.lane)
                } else {
                    None
                };
                (reconnect, cut)
            }
            None => (None, Vec::new()),
        };
        prune(&mut peers, &c.peer);
        (reconnect, cut)
    };
    let owed: Vec<super::RndvSend> = {
        let mut g = lock(&ep.rndv);
        let keys: Vec<u64> = g
            .iter()
            .filter(|(_, r)| Arc::ptr_eq(&r.conn, c))
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter().filter_map(|k| g.remove(&k)).collect()
    };
    for r in owed {
        ep.tx.release(1);
        r.done.fail(weft_core::completion::CqErrEntry::new(
            0,
            OpFlags::SEND,
            err,
        ));
    }
    // Announcements nobody matched yet: their payloads were at the peer.
    // Dropped after the matcher's lock is let go (they hold the
    // connection).
    let gone: Vec<super::srx::Held> = {
        let mut m = lock(&ep.side.matcher);
        std::iter::from_fn(|| {
            m.remove_unexpected(|h| matches!(&h.u, Unexp::Rts { conn, .. } if Arc::ptr_eq(conn, c)))
        })
        .collect()
    };
    drop(gone);
    for item in cut {
        match item {
            Deferred::Read(job) => ep.orphan(*job),
            Deferred::Pull(pull, _, _) => pull.finish(ep, Err(err)),
            _ => {}
        }
    }
    ep.settle_orphans(c);
    tracing::debug!(peer = %c.peer, error = %err, "verbs rdm connection down");
    // The QP stays reachable by qp number until its flushed completions
    // are in; they come back through the CQ like any other.
    let ep2 = ep.clone();
    let c2 = c.clone();
    let t = ep.rt.spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        remove_qp(&ep2, &c2);
        ep2.cm.unsubscribe(c2.id.token());
    });
    lock(&ep.tasks).push(t.abort_handle());
    if let Some(lane) = reconnect {
        connect(ep, c.peer, lane);
    }
}

/// Receives cut off by the end of their sender's connection.
impl RdmShared {
    /// The message `job` was to read is gone with its connection. Safe
    /// under any lock: the receive waits in the connection's orphans
    /// until [`settle_orphans`](Self::settle_orphans) (a claim fails now).
    pub(crate) fn orphan(&self, job: ReadJob) {
        if job.req.flags.contains(OpFlags::CLAIM) {
            let at = job.rxc.as_deref().unwrap_or(self);
            rx::fail_recv(at, job.req, job.info, 0, Error::ConnReset);
            return;
        }
        lock(&job.conn.orphans).push(super::Orphan {
            seq: job.seq,
            req: job.req,
            rxc: job.rxc,
        });
    }

    /// Once no read of the dead connection `c` is outstanding, its
    /// orphaned receives go back to the head of the posted receives, in
    /// the order they had matched (a scalable endpoint's, to the
    /// receive context each was matched on). Takes the matchers' and the
    /// peers' locks: never call it holding either.
    pub(crate) fn settle_orphans(&self, c: &Conn) {
        let mut back = {
            let mut g = lock(&c.orphans);
            if g.is_empty() || c.reads.load(Ordering::Acquire) != 0 {
                return;
            }
            std::mem::take(&mut *g)
        };
        if self.is_closed() {
            // Close discards outstanding operations without completions
            // (a context's receives end instead: `closing`).
            self.cancel_orphans(back);
            return;
        }
        back.sort_by_key(|o| o.seq);
        for o in back.into_iter().rev() {
            o.rxc.as_deref().unwrap_or(self).repost_front(o.req);
        }
    }

    /// [`settle_orphans`](Self::settle_orphans) from a task, for callers
    /// that hold the peers' lock.
    pub(crate) fn settle_orphans_soon(&self, c: &Arc<Conn>) {
        let (Some(ep), c) = (self.me.upgrade(), c.clone()) else {
            return;
        };
        self.rt.spawn(async move { ep.settle_orphans(&c) });
    }
}
