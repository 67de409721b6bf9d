//! One TCP connection: the transmit queue (direct non-blocking writes from
//! the posting thread, a writer task for the rest) and the receive state.
//!
//! The socket is held twice: as a `std` stream for direct syscalls (the
//! posting thread's fast path, the busy-poll thread) and as a duplicate
//! registered with Tokio for readiness in interrupt mode. Both name the
//! same open file, so bytes are never split between two streams.
//!
//! A connection of an endpoint that runs TLS also holds its session
//! (`tls::Session`): reads and writes go through it instead of the
//! socket. Plain connections pay one predictable branch for it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use weft_core::completion::OpDone;
use weft_core::hash::{fast_map, FastMap};
use weft_core::sync::lock;
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::frame::TxFrame;
use crate::keys::{ConnAuth, Source};
use crate::rma::PendingRead;
use crate::rx::RxMachine;
use crate::tls::{HsStream, Session};
use weft_core::limits::ConnSlot;

mod acks;
pub(crate) mod congestion;
mod liveness;
mod read;
mod tclass;
mod write;

use liveness::SweepMark;
pub(crate) use tclass::mark;
pub(crate) use write::{fail_frame_done, MAX_IOV};

#[derive(Debug, Default)]
struct TxState {
    queue: VecDeque<TxFrame>,
    /// The writer task owns the head of the stream (a frame is partly out).
    writer_active: bool,
    closed: Option<Error>,
    seq: u64,
    /// Encoded `Ack` frames waiting to ride with the next frame to the
    /// peer (see [`Conn::answer`]).
    acks_out: Vec<u8>,
    /// RDM: this end sends no more requests here: it queued a `Shutdown`
    /// (it retired the connection while idle), or read the peer's.
    /// Requests posted after that go over a new connection.
    retired: bool,
    /// RDM: the peer retired the connection. Once what is queued is out
    /// (a request part-way out included), this end half-closes; it reads
    /// on until the peer closes, for the acks and answers still owed.
    fin: bool,
    fin_sent: bool,
    /// RDM: the peer half-closed a connection this end retired: close
    /// once what is queued (acks, read answers) is out.
    close_when_out: bool,
}

/// A connection to one peer.
#[derive(Debug)]
pub struct Conn {
    pub peer: SocketAddr,
    /// The identity used for matching and AV lookups: the peer's listening
    /// address (RDM) or its socket address (MSG).
    pub peer_key: SocketAddr,
    /// What the connection proved at set-up.
    pub auth: ConnAuth,
    pub ep: Weak<EpShared>,
    std: std::net::TcpStream,
    pub tio: tokio::net::TcpStream,
    /// The TLS session, when the endpoint runs TLS.
    tls: Option<Box<Session>>,
    tx: Mutex<TxState>,
    tx_kick: Notify,
    pub rx: Mutex<RxMachine>,
    /// Completions waiting for the peer's `Ack`, with the length they
    /// report.
    acks: Mutex<FastMap<u64, (OpDone, usize)>>,
    /// RMA reads and atomics waiting for their answer, by request sequence
    /// number.
    reads: Mutex<FastMap<u64, Box<PendingRead>>>,
    dead: AtomicBool,
    /// `TxState::acks_out` holds acks (read without the lock by drivers).
    acks_pending: AtomicBool,
    /// Bytes read, and writes made: the sweeper compares them between
    /// passes instead of the data path reading a clock.
    rx_bytes: AtomicU64,
    tx_ops: AtomicU64,
    /// Unexpected-message bytes this connection holds buffered.
    pub charged: Arc<AtomicUsize>,
    /// Its share of its endpoint's shared receive context's budget, when
    /// the endpoint is bound to one (read under the context's parked
    /// list's lock, where the endpoint may not be reached).
    pub srx_cap: usize,
    /// In the endpoint's parked list (see `parked.rs`).
    pub parked: AtomicBool,
    /// Wakes the reader of a parked connection, or one that was failed.
    pub kick: Notify,
    /// Closing after an idle spell: `Shutdown` sent, reading until the
    /// peer closes too.
    pub retiring: AtomicBool,
    /// Of an RDM endpoint: connections are retired while idle and made
    /// again on demand (MSG connections end for good).
    rdm: bool,
    /// Notified (all waiters) once the connection is dead: a new
    /// connection to the same peer waits for a retiring one to end.
    ended: Notify,
    /// The reader and writer tasks, stopped with the endpoint.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// The sweeper's view: activity seen, since when, and since when the
    /// peer has been gone.
    sweep: Mutex<SweepMark>,
    _slot: ConnSlot,
}

impl Conn {
    /// The peer as matching and AV lookups know it.
    pub fn source(&self) -> Source {
        Source {
            addr: self.peer_key,
            key: self.auth.av_key,
        }
    }

    /// Wraps an established stream. Must run inside the runtime.
    pub fn new(
        stream: HsStream,
        peer_key: SocketAddr,
        ep: &Arc<EpShared>,
        slot: ConnSlot,
        auth: ConnAuth,
    ) -> Result<Arc<Conn>> {
        let (stream, tls) = stream.into_parts();
        stream.set_nodelay(true)?;
        mark(&stream, ep.dscp)?;
        let peer = stream.peer_addr()?;
        congestion::choose(&stream, peer);
        let std = stream.into_std()?;
        std.set_nonblocking(true)?;
        let dup = std.try_clone()?;
        let tio = tokio::net::TcpStream::from_std(dup)?;
        Ok(Arc::new(Conn {
            peer,
            peer_key,
            auth,
            ep: Arc::downgrade(ep),
            std,
            tio,
            tls: tls.map(|c| Box::new(Session::new(c))),
            tx: Mutex::new(TxState::default()),
            tx_kick: Notify::new(),
            rx: Mutex::new(RxMachine::new(ep.max_msg as u64)),
            acks: Mutex::new(fast_map()),
            reads: Mutex::new(fast_map()),
            dead: AtomicBool::new(false),
            acks_pending: AtomicBool::new(false),
            rx_bytes: AtomicU64::new(0),
            tx_ops: AtomicU64::new(0),
            charged: Arc::new(AtomicUsize::new(0)),
            srx_cap: ep.srx.as_ref().map_or(0, |l| l.peer_cap),
            parked: AtomicBool::new(false),
            kick: Notify::new(),
            retiring: AtomicBool::new(false),
            rdm: ep.ep_type == weft_core::attr::EpType::Rdm,
            ended: Notify::new(),
            tasks: Mutex::new(Vec::new()),
            sweep: Mutex::new(SweepMark::new()),
            _slot: slot,
        }))
    }

    /// Keeps a driver task's handle so closing the endpoint stops it.
    pub fn add_task(&self, t: tokio::task::AbortHandle) {
        lock(&self.tasks).push(t);
    }

    /// Nothing queued to send and no acknowledgement awaited.
    pub fn tx_idle(&self) -> bool {
        let idle = {
            let g = lock(&self.tx);
            g.queue.is_empty() && !g.writer_active && g.acks_out.is_empty()
        };
        idle && lock(&self.acks).is_empty() && lock(&self.reads).is_empty()
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Resolves once the connection is dead, or after `limit`.
    pub async fn ended(&self, limit: Duration) {
        let wait = async {
            loop {
                let n = self.ended.notified();
                tokio::pin!(n);
                // Registered before the check: a `fail` between the two
                // still wakes it.
                n.as_mut().enable();
                if self.is_dead() {
                    return;
                }
                n.await;
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    /// Ends the connection: queued frames and pending acks fail with `err`.
    /// Idempotent. When an RDM connection ends in order (`Shutdown`: the
    /// peer's end of the stream), requests not yet begun go to the peer
    /// again over a new connection.
    pub fn fail(&self, err: Error) {
        let ep = self.ep.upgrade();
        let requeue_to = ep
            .as_ref()
            .filter(|e| self.rdm && err == Error::Shutdown && !e.is_closed());
        // The peers lock is held from the moment this connection reads as
        // dead until what it had not begun is queued for the next one: a
        // send racing with this (it finds the connection dead and queues
        // for a new one) comes after them, never before.
        let mut peers = requeue_to.map(|e| lock(&e.peers));
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let frames: Vec<TxFrame> = {
            let mut g = lock(&self.tx);
            g.closed = Some(err);
            g.queue.drain(..).collect()
        };
        let mut again = Vec::new();
        let mut failed = Vec::new();
        for f in frames {
            if peers.is_some() && f.written == 0 && f.credit.held() {
                again.push(self.unqueued(f));
            } else {
                failed.push(f);
            }
        }
        if let (Some(peers), Some(ep)) = (peers.as_mut(), requeue_to) {
            failed.extend(crate::connect::rdm_requeue(ep, peers, self, again));
        }
        drop(peers);
        for f in failed {
            self.fail_frame(f, err);
        }
        let acks: Vec<OpDone> = lock(&self.acks).drain().map(|(_, (d, _))| d).collect();
        for d in acks {
            d.fail_with(err);
        }
        let reads: Vec<Box<PendingRead>> = lock(&self.reads).drain().map(|(_, r)| r).collect();
        for r in reads {
            (*r).fail(err);
        }
        let _ = self.std.shutdown(std::net::Shutdown::Both);
        self.tx_kick.notify_one();
        self.kick.notify_one();
        self.ended.notify_waiters();
        if let Some(ep) = ep {
            ep.parked.unpark(self);
            if let Some(l) = &ep.srx {
                l.core.parked.unpark(self);
            }
            for c in ep.ctxs.rx_open() {
                c.parked.unpark(self);
            }
            // If a driver holds the receive state it finds `dead` set once
            // it lets go, and aborts it then (see `abort_rx_if_dead`).
            if let Ok(mut rx) = self.rx.try_lock() {
                rx.abort(&ep, Error::ConnReset);
            }
            ep.conn_failed(self, err);
        }
    }

    /// Called by a driver after releasing the receive state.
    pub fn abort_rx_if_dead(&self, ep: &EpShared) -> bool {
        if !self.is_dead() {
            return false;
        }
        lock(&self.rx).abort(ep, Error::ConnReset);
        true
    }

    /// Closes without completing anything (endpoint close discards).
    pub fn abort(&self) {
        self.dead.store(true, Ordering::Release);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        {
            let mut g = lock(&self.tx);
            g.closed = Some(Error::Canceled);
            g.queue.clear();
        }
        lock(&self.acks).clear();
        lock(&self.reads).clear();
        let _ = self.std.shutdown(std::net::Shutdown::Both);
        self.tx_kick.notify_one();
        self.kick.notify_one();
    }
}

#[path = "conn_retire.rs"]
mod retire;
