//! Connection establishment: lazy RDM connections with simultaneous-connect
//! resolution, and MSG connect / accept / reject over a passive endpoint.
//! The frames are described in `docs/wire.md`.

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Handle;
use weft_core::addr::{decode_sockaddr, encode_sockaddr};
use weft_core::attr::EpType;
use weft_core::auth::{AuthKey, ConnKind};
use weft_core::eventq::{ConnHandle, EqEvent, EqEventKind, EqShared};
use weft_core::hash::FastMap;
use weft_core::limits::ConnLimits;
use weft_core::provider::ProviderPassive;
use weft_core::sync::lock;
use weft_core::wire::auth::{decode_keyed_hello, encode_conn_req, encode_keyed_hello};
use weft_core::wire::claim::{fresh_nonce, Claim};
use weft_core::wire::{FrameKind, Header};
use weft_core::{Error, Result};

use crate::conn::{fail_frame_done, Conn};
use crate::endpoint::{EpShared, PeerState};
use crate::frame::{read_frame, read_frame_of, write_frame, TxFrame};
use crate::keys::{ConnAuth, EpKeys, Source};
use crate::tls::{HsStream, TlsContext};
use crate::verify::OpenClaim;
use weft_core::limits::ConnSlot;

/// Binds a listening socket. Must run inside the runtime.
pub fn listen(addr: SocketAddr, backlog: u32) -> Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    Ok(sock.listen(backlog.max(1))?)
}

/// RDM: starts accepting peers' connections, up to the endpoint's
/// connection limit (handshaking ones included); beyond it a connection
/// is closed at once and reported.
pub fn start_rdm_listener(ep: &Arc<EpShared>, l: TcpListener) {
    let weak = Arc::downgrade(ep);
    let t = ep.rt.spawn(async move {
        loop {
            let (s, peer) = match l.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: retrying at once
                    // would spin a core until the condition clears.
                    tracing::debug!(error = %e, "RDM accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Some(ep) = weak.upgrade() else { return };
            let Some(slot) = ConnSlot::try_take(&ep.conn_count, ep.limits.max_conns) else {
                drop(s);
                tracing::debug!(%peer, "connection limit reached; refused");
                ep.report_addr(Error::ConnRefused, &peer);
                continue;
            };
            let _ = crate::conn::mark(&s, ep.dscp);
            let rt = ep.rt.clone();
            rt.spawn(async move {
                if let Err(e) = rdm_handshake_in(ep.clone(), s, slot).await {
                    tracing::debug!(%peer, error = %e, "incoming RDM connection dropped");
                    if reported(e) {
                        ep.report_addr(e, &peer);
                    }
                }
            });
        }
    });
    lock(&ep.tasks).push(t.abort_handle());
}

pub fn stop_listener(ep: &EpShared) {
    for t in lock(&ep.tasks).drain(..) {
        t.abort();
    }
}

/// Makes `conn` the peer's connection. Returns the connection it replaced,
/// which the caller must fail once the peers lock is released: failing
/// takes that lock again (`conn_failed`).
#[must_use]
fn attach(ep: &Arc<EpShared>, p: &mut PeerState, conn: Arc<Conn>) -> Option<Arc<Conn>> {
    let old = p
        .conn
        .replace(conn.clone())
        .filter(|old| !Arc::ptr_eq(old, &conn));
    ep.add_conn(&conn);
    flush_pending(ep, p, &conn);
    old
}

/// What waits for the peer goes over `conn`.
fn flush_pending(ep: &EpShared, p: &mut PeerState, conn: &Arc<Conn>) {
    let under = p.want == conn.auth.av_key;
    for f in p.pending.drain(..) {
        if under {
            conn.send(f);
        } else {
            // Queued for the peer under another key than the one this
            // connection proved.
            fail_frame(ep, f, Error::KeyRejected);
        }
    }
}

/// Handshake failures an acceptor reports (with the socket's peer
/// address, the claim being unknown then): running out of time, and the
/// TLS refusals (a certificate refused either way, a peer that does not
/// speak this end's protocol). Other failures (garbage where a frame
/// should be, a peer that closed) are only logged, as before TLS.
fn reported(e: Error) -> bool {
    matches!(e, Error::TimedOut | Error::KeyRejected | Error::NoProtoOpt)
}

/// The stream a connector speaks the Weft handshake on: TLS first when
/// the endpoint runs it.
async fn dialled(
    s: TcpStream,
    tls: Option<&Arc<TlsContext>>,
    dest: SocketAddr,
    t: Duration,
) -> Result<HsStream> {
    match tls {
        Some(ctx) => crate::tls::connect(s, ctx, dest, t).await,
        None => Ok(HsStream::Plain(s)),
    }
}

/// The stream an acceptor reads the opening frame from: TLS first when
/// the endpoint runs it.
async fn accepted(s: TcpStream, tls: Option<&Arc<TlsContext>>, t: Duration) -> Result<HsStream> {
    match tls {
        Some(ctx) => crate::tls::accept(s, ctx, t).await,
        None => Ok(HsStream::Plain(s)),
    }
}

/// The simultaneous-connect rule: the connection initiated by the endpoint
/// whose encoded listening address is lower survives.
fn keep_mine(ep: &EpShared, peer_key: &SocketAddr) -> bool {
    encode_sockaddr(&ep.local) < encode_sockaddr(peer_key)
}

async fn rdm_handshake_in(ep: Arc<EpShared>, s: TcpStream, slot: ConnSlot) -> Result<()> {
    let t = ep.limits.handshake_timeout;
    let mut s = accepted(s, ep.tls.as_ref(), t).await?;
    let kinds = [FrameKind::Hello, FrameKind::KeyedHello, FrameKind::Verify];
    let (h, payload) = read_frame_of(&mut s, &kinds, t).await?;
    if h.kind == Some(FrameKind::Verify) {
        return crate::verify::answer(&ep, s, &payload).await;
    }
    let (claim, opening) = if h.kind == Some(FrameKind::KeyedHello) {
        let (claim, sel) = decode_keyed_hello(&payload)?;
        (claim, Some((claim.nonce, sel)))
    } else {
        (Claim::decode(&payload)?, None)
    };
    let key = claim.addr;
    // The key first: a peer without it makes this endpoint neither dial
    // out to check its claim nor change anything it knows.
    let proof = crate::keyproof::accept(&mut s, &ep.keys, opening, ConnKind::Rdm, claim.addr, t);
    let auth = match proof.await {
        Ok(a) => a,
        Err(e) => {
            let mut ack = Header::new(FrameKind::HelloAck);
            ack.data = e.code() as u64;
            let _ = write_frame(&mut s, ack, &[], t).await;
            tracing::debug!(claimed = %key, error = %e, "RDM key proof refused");
            ep.report_addr(e, &key);
            return Ok(());
        }
    };
    // The claimed address must confirm the claim before the peer is known
    // by it (and before anything about that peer changes here).
    if let Err(e) = crate::verify::confirm(&ep, &claim, s.local_addr()?).await {
        let mut ack = Header::new(FrameKind::HelloAck);
        ack.data = e.code() as u64;
        let _ = write_frame(&mut s, ack, &[], t).await;
        tracing::debug!(claimed = %key, error = %e, "RDM identity claim refused");
        ep.report_addr(e, &key);
        return Ok(());
    }
    if key == ep.local {
        // Our own connect (a send to our own address): this end only
        // receives. Our outgoing end is the peer's connection; letting this
        // one replace it would close both ends of the one socket.
        write_frame(&mut s, Header::new(FrameKind::HelloAck), &[], t).await?;
        let conn = Conn::new(s, key, &ep, slot, auth)?;
        ep.add_conn(&conn);
        return Ok(());
    }
    let refuse = {
        let mut peers = lock(&ep.peers);
        let p = peers.entry(key).or_default();
        let busy = (p.connecting && p.dialled) || p.conn.as_ref().is_some_and(|c| !c.is_dead());
        // A second handshake from the same identity while one is still
        // being set up is refused: letting both finish would leave which
        // of them survives to the order their tasks happen to attach in.
        let refuse = p.accepting || (busy && keep_mine(&ep, &key));
        if !refuse {
            p.accepting = true;
        } else if p.is_empty() {
            peers.remove(&key);
        }
        refuse
    };
    let mut ack = Header::new(FrameKind::HelloAck);
    if refuse {
        ack.data = Error::Already.code() as u64;
        let _ = write_frame(&mut s, ack, &[], t).await;
        return Ok(());
    }
    let r = async {
        write_frame(&mut s, ack, &[], t).await?;
        Conn::new(s, key, &ep, slot, auth)
    }
    .await;
    // Not read before what the peer sent on a connection this end
    // retired has been handled: messages keep their order.
    if r.is_ok() {
        ep.drained(key).await;
    }
    let replaced = {
        let mut peers = lock(&ep.peers);
        let p = peers.entry(key).or_default();
        p.accepting = false;
        let replaced = match r {
            Ok(conn) => attach(&ep, p, conn),
            Err(_) if p.conn.is_none() && !p.pending.is_empty() => {
                // What waited for this connection (requests re-sent after a
                // retirement among them) gets a dial of its own.
                let dest = Source {
                    addr: key,
                    key: p.want,
                };
                dial_if_idle(&ep, p, dest);
                None
            }
            Err(_) => None,
        };
        if p.is_empty() {
            peers.remove(&key);
            crate::endpoint::shrink_map(&mut peers);
        }
        replaced
    };
    if let Some(old) = replaced {
        old.fail(Error::ConnAborted);
    }
    Ok(())
}

fn fail_pending(ep: &EpShared, p: &mut PeerState, err: Error) {
    for f in p.pending.drain(..) {
        fail_frame(ep, f, err);
    }
}

fn fail_frame(ep: &EpShared, f: TxFrame, err: Error) {
    f.credit.give_back(ep);
    fail_frame_done(f, err);
}

/// RDM send: over the peer's connection, or queued while one is made.
/// A frame for the peer under another key than its connection (or the
/// connection being made) proves fails with `KeyRejected`.
pub fn rdm_send(ep: &Arc<EpShared>, dest: Source, frame: TxFrame) {
    let mut peers = lock(&ep.peers);
    let p = peers.entry(dest.addr).or_default();
    if let Some(c) = p.conn.as_ref().filter(|c| !c.is_dead()) {
        let c = c.clone();
        drop(peers);
        if c.auth.av_key != dest.key {
            fail_frame(ep, frame, Error::KeyRejected);
            return;
        }
        c.send(frame);
        return;
    }
    if !joins_line(p, dest) {
        drop(peers);
        fail_frame(ep, frame, Error::KeyRejected);
        return;
    }
    p.pending.push(frame);
    dial_if_idle(ep, p, dest);
}

/// Whether requests for `dest` may wait in `p`'s line for the next
/// connection: the line holds requests of one key (`want`), the first to
/// wait names it.
fn joins_line(p: &mut PeerState, dest: Source) -> bool {
    p.conn = None;
    if p.pending.is_empty() && !p.connecting {
        p.want = dest.key;
    }
    p.want == dest.key
}

/// Dials `dest` for what waits in `p`'s line, unless a connection to it
/// is being made either way already.
fn dial_if_idle(ep: &Arc<EpShared>, p: &mut PeerState, dest: Source) {
    if !p.connecting && !p.accepting {
        p.connecting = true;
        ep.rt.spawn(rdm_connect(ep.clone(), dest));
    }
}

/// RDM: `frames`, which `dead` (its peer retired it) had not begun, go
/// to the peer again, ahead of anything queued since: over the peer's
/// connection if one is already up, else first in line for the next one.
/// Called with the peers lock held (see `Conn::fail`); gives back the
/// frames that must fail instead (queued under another key).
pub fn rdm_requeue(
    ep: &Arc<EpShared>,
    peers: &mut FastMap<SocketAddr, PeerState>,
    dead: &Conn,
    frames: Vec<TxFrame>,
) -> Vec<TxFrame> {
    let dest = dead.source();
    let p = peers.entry(dest.addr).or_default();
    if p.conn
        .as_ref()
        .is_some_and(|c| std::ptr::eq(c.as_ref(), dead))
    {
        p.conn = None;
    }
    if frames.is_empty() {
        return frames;
    }
    if let Some(c) = p.conn.as_ref().filter(|c| !c.is_dead()) {
        if c.auth.av_key != dest.key {
            return frames;
        }
        for f in frames {
            c.send(f);
        }
        return Vec::new();
    }
    if !joins_line(p, dest) {
        return frames;
    }
    p.pending.splice(0..0, frames);
    dial_if_idle(ep, p, dest);
    Vec::new()
}

async fn rdm_connect(ep: Arc<EpShared>, to: Source) {
    let t = ep.limits.handshake_timeout;
    let dest = to.addr;
    // Not before a connection this end retired has ended: the peer
    // half-closes it once it has read everything up to our `Shutdown` and
    // written what it had begun, so our requests on the new connection
    // meet theirs in order there, and the peer, no longer sending on the
    // old one, takes the new one instead of refusing it as a second.
    ep.drained(dest).await;
    {
        let mut peers = lock(&ep.peers);
        let p = peers.entry(dest).or_default();
        // The peer connected meanwhile: its connection carries what waits
        // (now, or once it is set up).
        if p.accepting || p.conn.as_ref().is_some_and(|c| !c.is_dead()) {
            p.connecting = false;
            if let Some(c) = p.conn.clone().filter(|c| !c.is_dead()) {
                flush_pending(&ep, p, &c);
            }
            return;
        }
        p.dialled = true;
    }
    let r = async {
        let auth = ep.keys.for_dest(to.key)?;
        let slot = ConnSlot::take(&ep.conn_count);
        let s = tokio::time::timeout(t, TcpStream::connect(dest))
            .await
            .map_err(|_| Error::TimedOut)??;
        crate::conn::mark(&s, ep.dscp)?;
        let mut s = dialled(s, ep.tls.as_ref(), dest, t).await?;
        // Remembered until the peer has answered: it may ask us to
        // confirm the claim meanwhile.
        let claim = OpenClaim::new(&ep, dest)?;
        match &auth.key {
            Some(k) => {
                let hello = encode_keyed_hello(&claim.claim(), &k.selector(&claim.nonce())?);
                write_frame(&mut s, Header::new(FrameKind::KeyedHello), &hello, t).await?;
            }
            None => write_frame(&mut s, Header::new(FrameKind::Hello), &claim.hello(), t).await?,
        }
        if let Some(k) = &auth.key {
            let (nonce, me) = (claim.nonce(), ep.local);
            let proof = crate::keyproof::connect(
                &mut s,
                k,
                ConnKind::Rdm,
                nonce,
                me,
                dest,
                FrameKind::HelloAck,
                t,
            );
            proof.await?;
        }
        let (h, _) = read_frame(&mut s, FrameKind::HelloAck, t).await?;
        drop(claim);
        match h.data {
            0 => Ok(Some(Conn::new(s, dest, &ep, slot, auth)?)),
            c if c == Error::Already.code() as u64 => Ok(None),
            c => Err(i32::try_from(c)
                .ok()
                .and_then(Error::from_code)
                .unwrap_or(Error::ConnRefused)),
        }
    }
    .await;
    let mut peers = lock(&ep.peers);
    let p = peers.entry(dest).or_default();
    p.connecting = false;
    p.dialled = false;
    match r {
        Ok(Some(conn)) => {
            let replaced = attach(&ep, p, conn);
            drop(peers);
            if let Some(old) = replaced {
                old.fail(Error::ConnAborted);
            }
        }
        Ok(None) => {
            // Lost a simultaneous connect: the peer's connection carries
            // the queued frames once accepted. If it never comes, fail them
            // rather than hold them forever.
            if p.conn.is_none() && !p.accepting {
                let weak = Arc::downgrade(&ep);
                ep.rt.spawn(async move {
                    tokio::time::sleep(t).await;
                    if let Some(ep) = weak.upgrade() {
                        let mut peers = lock(&ep.peers);
                        if let Some(p) = peers.get_mut(&dest) {
                            if p.conn.is_none() && !p.connecting && !p.accepting {
                                fail_pending(&ep, p, Error::TimedOut);
                            }
                            if p.is_empty() {
                                peers.remove(&dest);
                            }
                        }
                    }
                });
            }
        }
        Err(e) => {
            if p.conn.is_none() && !p.accepting {
                tracing::debug!(peer = %dest, error = %e, "RDM connect failed");
                fail_pending(&ep, p, e);
            }
            if p.is_empty() {
                peers.remove(&dest);
            }
            drop(peers);
            if matches!(e, Error::KeyRejected | Error::NoProtoOpt) {
                ep.report_addr(e, &dest);
            }
        }
    }
}

/// A connection request waiting for accept or reject. It holds a place
/// in the passive endpoint's count until it is answered or dropped.
#[derive(Debug)]
pub struct PendingConn {
    stream: Mutex<Option<HsStream>>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// What the connector proved to the listener.
    auth: ConnAuth,
    _slot: ConnSlot,
}

impl PendingConn {
    fn take(&self) -> Result<HsStream> {
        lock(&self.stream).take().ok_or(Error::OpBadState)
    }
}

/// The accepting side's request, from the endpoint's configuration.
pub fn pending_of(h: &ConnHandle) -> Result<Arc<PendingConn>> {
    h.clone()
        .downcast::<PendingConn>()
        .map_err(|_| Error::Inval)
}

/// MSG: active connect.
pub async fn msg_connect(ep: Arc<EpShared>, dest: Vec<u8>, cm: Vec<u8>) -> Result<Vec<u8>> {
    if cm.len() > ep.cfg.info.ep_attr.cm_data_size {
        return Err(Error::Inval);
    }
    let addr = decode_sockaddr(&dest)?;
    if lock(&ep.msg_conn).is_some() || ep.sock.is_connected() {
        return Err(Error::IsConn);
    }
    let t = ep.limits.handshake_timeout;
    let r = async {
        let s = tokio::time::timeout(t, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::TimedOut)??;
        crate::conn::mark(&s, ep.dscp)?;
        let mut s = dialled(s, ep.tls.as_ref(), addr, t).await?;
        let auth = ep.keys.for_dest(None)?;
        match &auth.key {
            None => write_frame(&mut s, Header::new(FrameKind::ConnReq), &cm, t).await?,
            Some(k) => {
                let nonce = fresh_nonce()?;
                let req = encode_conn_req(&nonce, &k.selector(&nonce)?, &cm);
                write_frame(&mut s, Header::new(FrameKind::KeyedConnReq), &req, t).await?;
                let me = s.local_addr()?;
                let proof = crate::keyproof::connect(
                    &mut s,
                    k,
                    ConnKind::Msg,
                    nonce,
                    me,
                    addr,
                    FrameKind::ConnResp,
                    t,
                );
                proof.await?;
            }
        }
        let (h, peer_cm) = read_frame(&mut s, FrameKind::ConnResp, t).await?;
        Ok((s, h.data, peer_cm, auth))
    }
    .await;
    match r {
        Ok((s, 0, peer_cm, _)) if ep.ep_type == EpType::SockStream => {
            ep.sock.connected(s)?;
            ep.cfg.eq_connected(peer_cm.clone());
            Ok(peer_cm)
        }
        Ok((s, 0, peer_cm, auth)) => {
            let conn = Conn::new(s, addr, &ep, ConnSlot::take(&ep.conn_count), auth)?;
            *lock(&ep.msg_conn) = Some(conn.clone());
            ep.add_conn(&conn);
            ep.cfg.eq_connected(peer_cm.clone());
            Ok(peer_cm)
        }
        Ok((_, code, data, _)) => {
            // A listener that did not take our key (or our lack of one)
            // says so; every other refusal is the application's reject.
            let e = match code {
                c if c == Error::KeyRejected.code() as u64 => Error::KeyRejected,
                // A TLS listener telling a plain connector (or the
                // reverse is caught in the TLS handshake).
                c if c == Error::NoProtoOpt.code() as u64 => Error::NoProtoOpt,
                _ => Error::ConnRefused,
            };
            ep.cfg.eq_error(e, data);
            Err(e)
        }
        Err(e) => {
            ep.cfg.eq_error(e, Vec::new());
            Err(e)
        }
    }
}

/// MSG: accept the request the endpoint was opened with.
pub async fn msg_accept(ep: Arc<EpShared>, cm: Vec<u8>) -> Result<()> {
    if cm.len() > ep.cfg.info.ep_attr.cm_data_size {
        return Err(Error::Inval);
    }
    let h = ep.cfg.conn.as_ref().ok_or(Error::OpBadState)?;
    let pc = pending_of(h)?;
    let mut s = pc.take()?;
    let t = ep.limits.handshake_timeout;
    write_frame(&mut s, Header::new(FrameKind::ConnResp), &cm, t).await?;
    if ep.ep_type == EpType::SockStream {
        ep.sock.connected(s)?;
        ep.cfg.eq_connected(Vec::new());
        return Ok(());
    }
    let conn = Conn::new(
        s,
        pc.peer,
        &ep,
        ConnSlot::take(&ep.conn_count),
        pc.auth.clone(),
    )?;
    *lock(&ep.msg_conn) = Some(conn.clone());
    ep.add_conn(&conn);
    ep.cfg.eq_connected(Vec::new());
    Ok(())
}

/// A listening MSG endpoint.
#[derive(Debug)]
pub struct TcpPassive {
    local: SocketAddr,
    rt: Handle,
    task: tokio::task::AbortHandle,
}

impl TcpPassive {
    /// Binds and listens; connection requests become `ConnReq` events.
    /// Requests being read or waiting for an answer are bounded by
    /// `limits.max_conns`, and each must arrive within the handshake
    /// timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        addr: SocketAddr,
        backlog: u32,
        eq: Arc<EqShared>,
        fid: u64,
        context: u64,
        cm_data_size: usize,
        limits: ConnLimits,
        auth: Option<AuthKey>,
        tls: Option<Arc<TlsContext>>,
        rt: Handle,
    ) -> Result<TcpPassive> {
        let _g = rt.enter();
        let l = listen(addr, backlog)?;
        let local = l.local_addr()?;
        let eq_w: Weak<EqShared> = Arc::downgrade(&eq);
        let pending = Arc::new(AtomicUsize::new(0));
        let keys = Arc::new(EpKeys::single(auth));
        let t = rt.spawn(async move {
            loop {
                let (s, peer) = match l.accept().await {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors: retrying at once would spin.
                        tracing::debug!(error = %e, "MSG accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Some(slot) = ConnSlot::try_take(&pending, limits.max_conns) else {
                    tracing::debug!(%peer, "pending connection requests at the limit; refused");
                    report_refusal(&eq_w, fid, context, Error::ConnRefused, &peer);
                    continue;
                };
                let eq_w = eq_w.clone();
                let keys = keys.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let t = limits.handshake_timeout;
                    let kinds = [FrameKind::ConnReq, FrameKind::KeyedConnReq];
                    let opening = async {
                        let mut s = accepted(s, tls.as_ref(), t).await?;
                        let f = read_frame_of(&mut s, &kinds, t).await?;
                        Ok::<_, Error>((s, f))
                    };
                    let (mut s, (h, payload)) = match opening.await {
                        Ok(f) => f,
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "MSG connection request dropped");
                            if reported(e) {
                                report_refusal(&eq_w, fid, context, e, &peer);
                            }
                            return;
                        }
                    };
                    let proof = crate::keyproof::accept_msg(&mut s, &keys, &h, payload, peer, t);
                    let (cm, auth) = match proof.await {
                        Ok(r) => r,
                        Err(e) => {
                            let mut no = Header::new(FrameKind::ConnResp);
                            no.data = e.code() as u64;
                            let _ = write_frame(&mut s, no, &[], t).await;
                            tracing::debug!(%peer, error = %e, "MSG key proof refused");
                            report_refusal(&eq_w, fid, context, e, &peer);
                            return;
                        }
                    };
                    if cm.len() > cm_data_size {
                        return;
                    }
                    let Some(eq) = eq_w.upgrade() else { return };
                    let pc: ConnHandle = Arc::new(PendingConn {
                        stream: Mutex::new(Some(s)),
                        peer,
                        local,
                        auth,
                        _slot: slot,
                    });
                    let mut ev = EqEvent::new(EqEventKind::ConnReq, fid, context, 0);
                    ev.cm_data = cm;
                    ev.conn = Some(pc);
                    ev.peer_addr = Some(encode_sockaddr(&peer));
                    eq.push(Ok(ev));
                });
            }
        });
        Ok(TcpPassive {
            local,
            rt,
            task: t.abort_handle(),
        })
    }
}

/// A connection the listener refused or dropped, on its EQ with the
/// peer's address.
fn report_refusal(eq: &Weak<EqShared>, fid: u64, context: u64, err: Error, peer: &SocketAddr) {
    if let Some(eq) = eq.upgrade() {
        eq.report_peer(fid, context, err, encode_sockaddr(peer));
    }
}

impl ProviderPassive for TcpPassive {
    fn local_addr(&self) -> Vec<u8> {
        encode_sockaddr(&self.local)
    }

    fn reject(&self, conn: &ConnHandle, data: Vec<u8>) -> Result<()> {
        let pc = pending_of(conn)?;
        let mut s = pc.take()?;
        self.rt.spawn(async move {
            let mut h = Header::new(FrameKind::ConnResp);
            h.data = Error::ConnRefused.code() as u64;
            let _ = write_frame(&mut s, h, &data, Duration::from_secs(1)).await;
            // Give the peer a moment to read the answer before the close.
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        Ok(())
    }

    fn set_backlog(&self, _backlog: usize) -> Result<()> {
        // The backlog is fixed when listening starts.
        Err(Error::OpBadState)
    }

    fn close(&self) {
        self.task.abort();
    }
}

impl Drop for TcpPassive {
    fn drop(&mut self) {
        self.task.abort();
    }
}
