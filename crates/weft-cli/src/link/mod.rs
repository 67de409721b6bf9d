//! One side of a benchmark, [`Link`], and its data path: the shims that
//! hide the tagged (RDM) versus untagged (MSG, DGRAM) distinction from
//! the benchmarks. Bringing a link up, in the three topologies the
//! benchmarks run in (server, client, and both in one process with
//! `--self`; the two cross-process ones are driven by `control`), is in
//! the submodules: `offer` picks the provider's offer, `fabric` opens
//! its objects and endpoints, `setup` makes links of them, `addr`
//! resolves the control connection's addresses; `reaper` reads
//! completions and `buffers` recycles receive buffers.
//!
//! DGRAM is set up like RDM (connectionless: an AV, the peer's address
//! from the TCP control connection) and used like MSG (no tags: the
//! control conversation is lockstep). Datagrams are not retransmitted, so
//! on a DGRAM link every wait for a completion gives up after
//! [`DGRAM_IDLE`] without one instead of waiting for a lost one forever.

mod addr;
mod buffers;
mod fabric;
mod offer;
mod reaper;
mod setup;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpStream;
use weft::{
    AddressVector, CompletionQueue, CqEntry, CqErrEntry, Domain, Endpoint, EpType, EventQueue,
    FiAddr, PassiveEndpoint, WaitMode, FI_ADDR_UNSPEC,
};

pub(crate) use addr::{resolve, unmap};
pub use buffers::{payload, payload_keep, reclaim, recycle};
pub use fabric::Fab;
pub(crate) use fabric::CONNECT_PATIENCE;
pub use offer::has_rma;
pub use reaper::{Reaper, Received};
pub use setup::self_pair;
pub(crate) use setup::{conn_req, connless_link};

use crate::fail::{Context, Failure, Res};

/// Benchmark payloads.
pub const DATA_TAG: u64 = 0x1;
/// Parameters and acknowledgements; a separate tag keeps them from ever
/// matching a data receive on RDM. MSG has no tags: there the protocol
/// is lockstep, so order alone keeps them apart.
pub const CTRL_TAG: u64 = 0x2;

/// Room for any control message (the parameter block is the largest).
pub const CTRL_CAP: usize = 4096;

/// How long a DGRAM link waits for a completion before it takes the
/// message for lost. Generous: the slowest step between two messages is
/// the peer's address resolution at start-up.
pub const DGRAM_IDLE: Duration = Duration::from_secs(10);

/// One side of a benchmark: an enabled endpoint, its CQ, and the peer.
#[derive(Debug)]
pub struct Link {
    pub ep: Endpoint,
    pub cq: CompletionQueue,
    pub peer: FiAddr,
    /// The endpoint's domain, where `--rma` allocates its region.
    pub domain: Domain,
    pub ep_type: EpType,
    tagged: bool,
    mode: WaitMode,
    /// DGRAM: how long to wait for any completion (see [`DGRAM_IDLE`]).
    idle: Option<Duration>,
    // Objects the endpoint depends on that it does not itself keep alive.
    _av: Option<AddressVector>,
    _eq: Option<EventQueue>,
    /// Shared with the server's listener, which outlives a client that
    /// turns out not to be one.
    _pep: Option<Arc<PassiveEndpoint>>,
    /// RDM and DGRAM across processes: the control connection the
    /// addresses came over. Such an endpoint has no connection whose end
    /// it would see, so this one tells the run that the peer process is
    /// gone.
    pub ctrl: Option<TcpStream>,
}

impl Link {
    /// A pool of `count` registered buffers of `size` bytes (at least
    /// one: a pool has no empty buffers; a 0-byte message goes as a
    /// buffer cut to nothing), for `--api pool`.
    pub fn buffer_pool(&self, count: usize, size: usize) -> Res<weft::BufferPool> {
        self.domain
            .buffer_pool(count, size.max(1))
            .ctx("open the buffer pool")
    }

    pub fn reaper(&self) -> Reaper {
        Reaper::new(self.cq.clone(), self.mode == WaitMode::BusyPoll, self.idle)
    }

    /// A DGRAM link: messages may be lost (and, in principle, reordered),
    /// and nothing holds a sender back from outrunning the receiver.
    pub fn lossy(&self) -> bool {
        self.idle.is_some()
    }

    /// Awaits an operation; on a DGRAM link only for so long.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        op: impl Future<Output = Result<T, CqErrEntry>>,
    ) -> Res<T> {
        match self.idle {
            None => op.await.ctx(what),
            Some(d) => match tokio::time::timeout(d, op).await {
                Ok(r) => r.ctx(what),
                Err(_) => Err(lost(what, d)),
            },
        }
    }

    /// `fi_tsend` / `fi_send`, waiting out a full transmit queue.
    pub async fn post_send(&self, buf: Bytes, ctx: u64) -> Res<()> {
        match self.post_send_now(&buf, ctx) {
            Err(weft::Error::Again) => self.post_send_full(buf, ctx).await,
            r => r.ctx("post send"),
        }
    }

    /// [`post_send`](Self::post_send)'s first try, outside any future:
    /// on the latency path the queue has room, and building and polling
    /// the futures cost about 40 instructions a message. `Again`: wait
    /// with [`post_send_full`](Self::post_send_full).
    pub fn post_send_now(&self, buf: &Bytes, ctx: u64) -> weft::Result<()> {
        if self.tagged {
            self.ep.post_tsend(self.peer, buf.clone(), DATA_TAG, ctx)
        } else {
            self.ep.post_send(self.peer, buf.clone(), ctx)
        }
    }

    /// `fi_inject` / `fi_tinject` of `buf`: no completion.
    pub fn inject_now(&self, buf: &Bytes) -> weft::Result<()> {
        if self.tagged {
            self.ep.tinject(self.peer, buf.clone(), DATA_TAG)
        } else {
            self.ep.inject(self.peer, buf.clone())
        }
    }

    /// Posts `buf` once the transmit queue has room.
    pub async fn post_send_full(&self, buf: Bytes, ctx: u64) -> Res<()> {
        weft::post_when_room(|| self.post_send_now(&buf, ctx))
            .await
            .ctx("post send")
    }

    /// `fi_trecv` / `fi_recv` into `iov` (each buffer's length is its
    /// capacity), waiting out a full receive queue. The `Vec` comes back
    /// in the completion's `bufs`: posting it again (see [`reclaim`])
    /// keeps allocation off the latency path.
    pub async fn post_recv(&self, iov: Vec<BytesMut>, ctx: u64) -> Res<()> {
        match self.post_recv_now(iov, ctx) {
            Err((weft::Error::Again, back)) => self.post_recv_full(back, ctx).await,
            r => r.map_err(|(e, _)| Failure::new("post receive", e)),
        }
    }

    /// [`post_recv`](Self::post_recv)'s first try, outside any future, as
    /// [`post_send_now`](Self::post_send_now); `Again` hands the buffers
    /// back for [`post_recv_full`](Self::post_recv_full).
    pub fn post_recv_now(
        &self,
        bufs: Vec<BytesMut>,
        ctx: u64,
    ) -> Result<(), (weft::Error, Vec<BytesMut>)> {
        let msg = weft::RecvMsg {
            src: FI_ADDR_UNSPEC,
            bufs,
            tagged: self.tagged,
            tag: DATA_TAG,
            ignore: 0,
            context: ctx,
        };
        self.ep.post_recvmsg(msg, weft::OpFlags::empty())
    }

    /// Posts `iov` once the receive queue has room.
    pub async fn post_recv_full(&self, iov: Vec<BytesMut>, ctx: u64) -> Res<()> {
        weft::post_when_room_with(iov, |b| self.post_recv_now(b, ctx))
            .await
            .map_err(|(e, _)| Failure::new("post receive", e))
    }

    pub async fn send(&self, buf: Bytes) -> Res<CqEntry> {
        self.bounded("send", self.send_tagged(buf, DATA_TAG)).await
    }

    pub async fn recv(&self, buf: BytesMut) -> Res<CqEntry> {
        self.bounded("receive", self.recv_tagged(buf, DATA_TAG))
            .await
    }

    /// `fi_tsend` / `fi_send` of a pool buffer, once, outside any future
    /// (as [`post_send_now`](Self::post_send_now)); the buffer goes back
    /// to its pool when the send ends. A refusal hands it back frozen:
    /// `Again` is waited out with [`post_send_full`](Self::post_send_full).
    pub fn post_send_pooled_now(
        &self,
        buf: weft::PoolBuf,
        ctx: u64,
    ) -> Result<(), weft::SendRefused> {
        if self.tagged {
            self.ep.post_tsend_pooled(self.peer, buf, DATA_TAG, ctx)
        } else {
            self.ep.post_send_pooled(self.peer, buf, ctx)
        }
    }

    /// `fi_trecv` / `fi_recv` into a pool buffer, once, outside any
    /// future; the completion carries the buffer back (see
    /// [`weft::BufferPool::reclaim`]). A refusal hands it back.
    pub fn post_recv_pooled_now(
        &self,
        buf: weft::PoolBuf,
        ctx: u64,
    ) -> Result<(), weft::RecvRefused> {
        if self.tagged {
            self.ep
                .post_trecv_pooled(buf, FI_ADDR_UNSPEC, DATA_TAG, 0, ctx)
        } else {
            self.ep.post_recv_pooled(buf, ctx)
        }
    }

    /// Posts a pool receive once the receive queue has room.
    pub async fn post_recv_pooled_full(&self, buf: weft::PoolBuf, ctx: u64) -> Res<()> {
        let mut buf = buf;
        loop {
            match self.post_recv_pooled_now(buf, ctx) {
                Ok(()) => return Ok(()),
                Err((weft::Error::Again, Some(back))) => buf = back,
                Err((e, _)) => return Err(Failure::new("post receive", e)),
            }
            tokio::task::yield_now().await;
        }
    }

    /// Sends a pool buffer (it goes back to its pool when the send ends).
    pub async fn send_pooled(&self, buf: weft::PoolBuf) -> Res<CqEntry> {
        let op = async {
            if self.tagged {
                self.ep.tsend_pooled(self.peer, buf, DATA_TAG).await
            } else {
                self.ep.send_pooled(self.peer, buf).await
            }
        };
        self.bounded("send", op).await
    }

    /// Receives into a pool buffer.
    pub async fn recv_pooled(&self, buf: weft::PoolBuf) -> Res<weft::Received> {
        let op = async {
            if self.tagged {
                self.ep.trecv_pooled(buf, FI_ADDR_UNSPEC, DATA_TAG, 0).await
            } else {
                self.ep.recv_pooled(buf).await
            }
        };
        self.bounded("receive", op).await
    }

    async fn send_tagged(&self, buf: Bytes, tag: u64) -> Result<CqEntry, CqErrEntry> {
        if self.tagged {
            self.ep.tsend(self.peer, buf, tag).await
        } else {
            self.ep.send(self.peer, buf).await
        }
    }

    async fn recv_tagged(&self, buf: BytesMut, tag: u64) -> Result<CqEntry, CqErrEntry> {
        if self.tagged {
            self.ep.trecv(buf, FI_ADDR_UNSPEC, tag, 0).await
        } else {
            self.ep.recv(buf).await
        }
    }

    /// Control messages always use the awaited forms: they then never
    /// show up on the CQ the `post` benchmarks read.
    pub async fn send_ctrl(&self, buf: Bytes) -> Res<()> {
        self.bounded("send control message", self.send_tagged(buf, CTRL_TAG))
            .await
            .map(|_| ())
    }

    pub async fn recv_ctrl(&self) -> Res<Bytes> {
        let e = self
            .bounded(
                "receive control message",
                self.recv_tagged(BytesMut::zeroed(CTRL_CAP), CTRL_TAG),
            )
            .await?;
        Ok(payload(e))
    }
}

/// The failure of a DGRAM wait that saw nothing complete for `d`.
fn lost(what: &str, d: Duration) -> Failure {
    Failure::new(
        what,
        format!(
            "nothing completed for {} s: a datagram was probably lost \
             (FI_EP_DGRAM does not retransmit), or the peer stopped",
            d.as_secs()
        ),
    )
}
