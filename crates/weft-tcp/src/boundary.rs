//! `TcpEndpoint`, the provider-boundary handle of an endpoint: the
//! `ProviderEndpoint` operations, each handing over to the shared state
//! (`endpoint.rs`), and closing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use weft_core::addr::{encode_sockaddr, FI_ADDR_UNSPEC};
use weft_core::attr::EpType;
use weft_core::completion::Returned;
use weft_core::progress::Progress;
use weft_core::provider::{EpStats, Iov, ProviderEndpoint, RecvReq, Rejected, RmaReq, SendReq};
use weft_core::sync::lock;
use weft_core::wire::{FrameKind, Header};
use weft_core::{Error, Result};

use crate::conn::Conn;
use crate::driver::InlineProgress;
use crate::endpoint::EpShared;
use crate::frame::TxFrame;

/// The `ProviderEndpoint` handle.
#[derive(Debug)]
pub struct TcpEndpoint {
    pub shared: Arc<EpShared>,
    /// Inline progress of this endpoint (queues hold it weakly).
    pub inline: Arc<dyn Progress>,
}

impl TcpEndpoint {
    pub fn new(shared: Arc<EpShared>) -> TcpEndpoint {
        let inline: Arc<dyn Progress> = Arc::new(InlineProgress::new(shared.clone()));
        TcpEndpoint { shared, inline }
    }
}

impl ProviderEndpoint for TcpEndpoint {
    fn take_byte_stream(&self) -> Result<Box<dyn weft_core::provider::ByteStream>> {
        if self.shared.ep_type != EpType::SockStream {
            return Err(Error::NoSys);
        }
        self.shared.sock.take()
    }

    fn post_send(&self, req: SendReq) -> std::result::Result<(), Rejected<SendReq>> {
        if self.shared.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.shared.send(req)
    }

    fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
        if self.shared.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        if req.src != FI_ADDR_UNSPEC && self.shared.ep_type.is_connected() {
            return Err(Rejected {
                err: Error::Inval,
                req,
            });
        }
        self.shared.recv(req)
    }

    fn post_rma(&self, req: RmaReq) -> std::result::Result<(), Rejected<RmaReq>> {
        if self.shared.is_closed() {
            return Err(Rejected {
                err: Error::OpBadState,
                req,
            });
        }
        self.shared.rma(req)
    }

    fn atomic_valid(
        &self,
        kind: weft_core::atomic::AtomicKind,
        op: weft_core::atomic::AtomicOp,
        datatype: weft_core::atomic::Datatype,
    ) -> Result<usize> {
        crate::atomic::valid(self.shared.max_msg, kind, op, datatype)
    }

    fn give_back(&self, r: Returned) {
        self.shared.take_back(r, false);
    }

    fn give_back_after(&self, r: Returned) {
        self.shared.take_back(r, true);
    }

    fn cancel(&self, context: u64) -> bool {
        let r = lock(&self.shared.matcher).cancel(context);
        match r {
            Some((_, req)) => {
                weft_core::recv_completion::cancel_recv(&*self.shared, req);
                true
            }
            None => false,
        }
    }

    fn local_addr(&self) -> Vec<u8> {
        encode_sockaddr(&self.shared.local)
    }

    fn peer_addr(&self) -> Option<Vec<u8>> {
        lock(&self.shared.msg_conn)
            .as_ref()
            .map(|c| encode_sockaddr(&c.peer))
    }

    fn progress_hook(&self) -> Option<Arc<dyn Progress>> {
        Some(self.inline.clone())
    }

    fn tx_size_left(&self) -> usize {
        self.shared.tx.left()
    }

    fn rx_size_left(&self) -> usize {
        self.shared.rx.left()
    }

    /// A MSG endpoint that connected (not one made to accept a request)
    /// forgets its dead connection and may connect again.
    fn reenable(&self) -> Result<()> {
        let ep = &self.shared;
        if ep.ep_type != EpType::Msg || ep.cfg.conn.is_some() || ep.is_closed() {
            return Err(Error::NoSys);
        }
        *lock(&ep.msg_conn) = None;
        ep.msg_dead.store(false, Ordering::Release);
        Ok(())
    }

    fn stats(&self) -> EpStats {
        let ep = &self.shared;
        let mut s = EpStats::default();
        s.conns = ep.conn_count.load(Ordering::Acquire);
        s.parked = ep.parked.len();
        s.unexpected_bytes = ep.unexp_charged.load(Ordering::Acquire);
        s.peers = lock(&ep.peers).len();
        s.rx_bad_ctx = ep.ctxs.dropped.load(Ordering::Relaxed);
        s
    }

    fn tx_context(
        &self,
        index: usize,
        cfg: weft_core::provider::EpConfig,
    ) -> Result<Arc<dyn ProviderEndpoint>> {
        if !self.shared.ctxs.scalable() {
            return Err(Error::NoSys);
        }
        crate::scalable::tx_context(&self.shared, index, &cfg)
    }

    fn rx_context(
        &self,
        index: usize,
        cfg: weft_core::provider::EpConfig,
    ) -> Result<Arc<dyn ProviderEndpoint>> {
        if !self.shared.ctxs.scalable() {
            return Err(Error::NoSys);
        }
        crate::scalable::rx_context(&self.shared, index, cfg)
    }

    fn connect(&self, dest: Vec<u8>, cm_data: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>>> {
        let ep = self.shared.clone();
        async move { crate::connect::msg_connect(ep, dest, cm_data).await }.boxed()
    }

    fn accept(&self, cm_data: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        let ep = self.shared.clone();
        async move { crate::connect::msg_accept(ep, cm_data).await }.boxed()
    }

    fn shutdown(&self) -> Result<()> {
        let conn = lock(&self.shared.msg_conn).clone().ok_or(Error::NotConn)?;
        conn.send(TxFrame::new(
            Header::new(FrameKind::Shutdown),
            Iov::new(),
            None,
        ));
        Ok(())
    }

    fn close(&self) {
        let ep = &self.shared;
        if ep.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(c) = lock(&ep.msg_conn).take() {
            c.send(TxFrame::new(
                Header::new(FrameKind::Shutdown),
                Iov::new(),
                None,
            ));
        }
        let conns: Vec<Arc<Conn>> = lock(&ep.conns).drain(..).collect();
        for c in &conns {
            c.abort();
        }
        if let Some(l) = &ep.srx {
            l.core.leave(&l.member, &conns);
        }
        drop(conns);
        lock(&ep.peers).clear();
        // Outstanding operations are discarded without completions; their
        // room goes back (to a shared transmit context's other endpoints).
        ep.tx.release_all();
        let posted = lock(&ep.matcher).drain_posted();
        drop(posted);
        ep.parked.wake_all();
        // A parked busy-poll thread sees the close now, not when the hold ends.
        ep.hold.waiter_idle();
        crate::connect::stop_listener(ep);
        // The AV's keys may be removed once no open endpoint holds them.
        ep.keys.release();
    }
}

impl Drop for TcpEndpoint {
    fn drop(&mut self) {
        self.close();
    }
}
