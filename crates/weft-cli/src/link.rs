//! Bringing up one endpoint that can reach the peer, in the three
//! topologies the benchmarks run in: server, client, and both in one
//! process (`--self`; the two cross-process ones are set up by
//! `control`). Also the data-path shims that hide the tagged (RDM)
//! versus untagged (MSG, DGRAM) distinction from the benchmarks.
//!
//! DGRAM is set up like RDM (connectionless: an AV, the peer's address
//! from the TCP control connection) and used like MSG (no tags: the
//! control conversation is lockstep). Datagrams are not retransmitted, so
//! on a DGRAM link every wait for a completion gives up after
//! [`DGRAM_IDLE`] without one instead of waiting for a lost one forever.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::net::TcpStream;
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnRequest, CqAttr, CqEntry, CqErrEntry,
    CqItem, Domain, Endpoint, EpType, EqEventKind, EventQueue, Fabric, FiAddr, Info,
    PassiveEndpoint, WaitMode, FI_ADDR_UNSPEC,
};

use crate::args::PerfArgs;
use crate::fail::{timed_out, within, Context, Failure, Res};

/// Benchmark payloads.
pub const DATA_TAG: u64 = 0x1;
/// Parameters and acknowledgements; a separate tag keeps them from ever
/// matching a data receive on RDM. MSG has no tags: there the protocol
/// is lockstep, so order alone keeps them apart.
pub const CTRL_TAG: u64 = 0x2;

/// How long a client keeps retrying a server that is not listening yet,
/// so `server & client` in a script does not need a careful sleep.
pub(crate) const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

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

/// The fabric-level objects both sides of `--self` share.
#[derive(Debug)]
pub struct Fab {
    pub info: Info,
    pub fabric: Fabric,
    pub domain: Domain,
    pub mode: WaitMode,
}

/// The hints for `a`; with `rma`, asking for RMA with remote CQ data too,
/// and accepting what an RMA target must do (the region's own key and
/// virtual address, regions from the domain).
fn hints(a: &PerfArgs, rma: bool) -> Info {
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some(a.prov.clone());
    hints.ep_attr.ep_type = a.ep_type;
    hints.domain_attr.name.clone_from(&a.domain);
    hints.caps = match a.ep_type {
        // DGRAM has no tagged messages.
        EpType::Msg | EpType::Dgram => weft::Caps::MSG,
        _ => weft::Caps::TAGGED,
    };
    if rma {
        hints.caps |= weft::Caps::RMA | weft::Caps::REMOTE_CQ_DATA;
        hints.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::ALLOCATED;
        // The write pingpong's remote CQ data takes a posted receive on
        // MSG; the CLI posts them.
        hints.mode |= weft::Mode::RX_CQ_DATA;
    }
    hints
}

impl Fab {
    /// The fabric's I/O runs on `rt`. A client with `--rma` needs RMA; a
    /// server takes it when the provider has it, since the client says
    /// what to run only once connected.
    pub fn open(a: &PerfArgs, rt: tokio::runtime::Handle) -> Res<Fab> {
        let server = a.dest.is_none() && !a.self_test;
        let with_rma = (a.rma.is_some() || server)
            .then(|| weft::getinfo(Some(&hints(a, true))).ok())
            .flatten();
        let plain = hints(a, false);
        let infos = match with_rma {
            Some(v) => v,
            None => weft::getinfo(Some(&plain)).with_ctx(|| no_match(a))?,
        };
        let info = infos
            .into_iter()
            .next()
            .ok_or_else(|| Failure::new(no_match(a), weft::Error::NoData))?;
        if let Some(op) = a.rma.filter(|_| !has_rma(&info)) {
            return Err(no_rma(a, op));
        }
        let fabric = weft::Fabric::open_with(&info, rt).ctx("open fabric")?;
        let domain = fabric.domain(&info).ctx("open domain")?;
        Ok(Fab {
            info,
            fabric,
            domain,
            mode: a.mode,
        })
    }

    /// DGRAM: the longest wait for a completion before giving up.
    fn idle(&self) -> Option<Duration> {
        (self.info.ep_attr.ep_type == EpType::Dgram).then_some(DGRAM_IDLE)
    }

    fn cq(&self) -> Res<CompletionQueue> {
        self.domain
            .cq(CqAttr {
                wait: self.mode,
                ..CqAttr::default()
            })
            .ctx("open completion queue")
    }

    /// An enabled RDM or DGRAM endpoint bound to `src` (its IP is what
    /// the peer will send to, so it must be reachable from there).
    pub(crate) fn connless(
        &self,
        src: SocketAddr,
    ) -> Res<(Endpoint, CompletionQueue, AddressVector)> {
        let av = self
            .domain
            .av(AvAttr::default())
            .ctx("open address vector")?;
        let cq = self.cq()?;
        let ep = self.domain.endpoint(&self.info).ctx("create endpoint")?;
        ep.bind_av(&av).ctx("bind address vector")?;
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .ctx("bind completion queue")?;
        ep.set_wait_mode(self.mode).ctx("set wait mode")?;
        ep.set_src_addr(weft::encode_sockaddr(&src))
            .ctx("set source address")?;
        ep.enable().ctx("enable endpoint")?;
        Ok((ep, cq, av))
    }

    /// A MSG endpoint, enabled: fresh for connecting, or for `req`.
    fn msg(&self, req: Option<&ConnRequest>) -> Res<(Endpoint, CompletionQueue, EventQueue)> {
        let eq = self.fabric.eq(64).ctx("open event queue")?;
        let cq = self.cq()?;
        let ep = match req {
            Some(r) => self.domain.accept_endpoint(&self.info, r),
            None => self.domain.endpoint(&self.info),
        }
        .ctx("create endpoint")?;
        ep.bind_eq(&eq).ctx("bind event queue")?;
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .ctx("bind completion queue")?;
        ep.set_wait_mode(self.mode).ctx("set wait mode")?;
        ep.enable().ctx("enable endpoint")?;
        Ok((ep, cq, eq))
    }

    pub(crate) fn listen(&self, addr: SocketAddr) -> Res<(PassiveEndpoint, EventQueue)> {
        let eq = self.fabric.eq(64).ctx("open event queue")?;
        let pep = self
            .fabric
            .passive_endpoint(&self.info, Some(weft::encode_sockaddr(&addr)))
            .ctx("create passive endpoint")?;
        pep.bind_eq(&eq).ctx("bind event queue")?;
        pep.listen().with_ctx(|| format!("listen on {addr}"))?;
        Ok((pep, eq))
    }

    /// MSG server half: accepts `req`, waiting at most `limit` for the
    /// connection to come up.
    pub(crate) async fn accept_req(
        &self,
        req: &ConnRequest,
        pep: Arc<PassiveEndpoint>,
        limit: Duration,
    ) -> Res<Link> {
        let (ep, cq, eq) = self.msg(Some(req))?;
        let accept = async { ep.accept(Vec::new()).await.ctx("accept connection") };
        within(limit, "accept connection", accept).await?;
        Ok(Link {
            ep,
            cq,
            peer: FI_ADDR_UNSPEC,
            domain: self.domain.clone(),
            ep_type: EpType::Msg,
            tagged: false,
            mode: self.mode,
            idle: None,
            _av: None,
            _eq: Some(eq),
            _pep: Some(pep),
            ctrl: None,
        })
    }

    /// MSG client half; each attempt may take `limit` (a peer that
    /// accepts the connection and never completes it is given up on).
    pub(crate) async fn connect(&self, dest: SocketAddr, limit: Duration) -> Res<Link> {
        let deadline = Instant::now() + CONNECT_PATIENCE;
        loop {
            // A failed connect leaves the endpoint unusable: a new one
            // per attempt.
            let (ep, cq, eq) = self.msg(None)?;
            let attempt = ep.connect(weft::encode_sockaddr(&dest), Vec::new());
            let outcome = match tokio::time::timeout(limit, attempt).await {
                Ok(r) => r,
                Err(_) => return Err(timed_out(&format!("connect to {dest}"), limit)),
            };
            match outcome {
                Ok(_) => {
                    return Ok(Link {
                        ep,
                        cq,
                        peer: FI_ADDR_UNSPEC,
                        domain: self.domain.clone(),
                        ep_type: EpType::Msg,
                        tagged: false,
                        mode: self.mode,
                        idle: None,
                        _av: None,
                        _eq: Some(eq),
                        _pep: None,
                        ctrl: None,
                    })
                }
                Err(weft::Error::ConnRefused) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(Failure::new(format!("connect to {dest}"), e)),
            }
        }
    }
}

/// The ep types `prov` (on `domain`, if given) offers with `caps`, for
/// the error when the one asked for is not among them.
fn offered_types(prov: &str, domain: Option<&str>, caps: weft::Caps) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for i in weft::all_offers() {
        if i.fabric_attr.prov_name.as_deref() != Some(prov)
            || domain.is_some_and(|d| i.domain_attr.name.as_deref() != Some(d))
            || !i.caps.contains(caps)
        {
            continue;
        }
        let n = i.ep_attr.ep_type.fi_name();
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

/// Why nothing matches `-p -e -d` as given.
fn no_match(a: &PerfArgs) -> String {
    let mut m = format!(
        "no provider matches -p {} -e {}{} (available: {})",
        a.prov,
        a.ep_type.fi_name(),
        a.domain
            .as_deref()
            .map(|d| format!(" -d {d}"))
            .unwrap_or_default(),
        weft::providers().join(", ")
    );
    let offered = offered_types(&a.prov, a.domain.as_deref(), weft::Caps::empty());
    if !offered.is_empty() {
        m.push_str(&format!(
            "; -p {} offers {} only",
            a.prov,
            offered.join(", ")
        ));
    }
    if let Some(why) = weft::provider_unavailable(&a.prov) {
        m.push_str(&format!("; {}: {why}", a.prov));
    }
    m
}

/// Whether `info` does what `--rma` needs: RMA (read and write, which
/// bare `FI_RMA` stands for) and remote CQ data.
pub fn has_rma(info: &Info) -> bool {
    use weft::Caps;
    let rw = Caps::READ | Caps::WRITE;
    info.caps.contains(Caps::RMA | Caps::REMOTE_CQ_DATA)
        && (!info.caps.intersects(rw) || info.caps.contains(rw))
}

/// The failure of `--rma` where the provider and endpoint type have none.
fn no_rma(a: &PerfArgs, op: crate::args::Rma) -> Failure {
    let with = offered_types(&a.prov, a.domain.as_deref(), weft::Caps::RMA);
    let hint = if with.is_empty() {
        format!("-p {} has no RMA at all", a.prov)
    } else {
        let eps: Vec<String> = with
            .iter()
            .map(|t| format!("-e {}", t.trim_start_matches("FI_EP_").to_lowercase()))
            .collect();
        format!("-p {} has it with {}", a.prov, eps.join(", "))
    };
    Failure::new(
        format!("--rma {}", op.name()),
        format!(
            "-p {} -e {} has no RMA with remote CQ data (FI_RMA, FI_REMOTE_CQ_DATA); {hint}",
            a.prov,
            a.ep_type
                .fi_name()
                .trim_start_matches("FI_EP_")
                .to_lowercase(),
        ),
    )
}

/// A connectionless (RDM or DGRAM) link once the peer's address is
/// known. The insert is awaited: on a verbs DGRAM domain it resolves the
/// address through rdma_cm (`insert_sync` would say `Again` there); on
/// the others it is ready at once.
pub(crate) async fn connless_link(
    fab: &Fab,
    (ep, cq, av): (Endpoint, CompletionQueue, AddressVector),
    peer: &[u8],
    ctrl: Option<TcpStream>,
) -> Res<Link> {
    let rep = av
        .insert(&[peer.to_vec()], Default::default(), 0)
        .ctx("insert peer address")?
        .await;
    match rep.results.first() {
        Some(Ok(fi)) => Ok(Link {
            ep,
            cq,
            peer: *fi,
            domain: fab.domain.clone(),
            ep_type: fab.info.ep_attr.ep_type,
            tagged: fab.info.ep_attr.ep_type != EpType::Dgram,
            mode: fab.mode,
            idle: fab.idle(),
            _av: Some(av),
            _eq: None,
            _pep: None,
            ctrl,
        }),
        Some(Err(e)) => Err(Failure::new("insert peer address", *e)),
        None => Err(Failure::new("insert peer address", "nothing inserted")),
    }
}

/// The next connection request on a passive endpoint's `eq`; other
/// events are skipped. The inner error is one request gone wrong (its
/// peer's doing, or its connection's); the outer one, the queue itself.
pub(crate) async fn conn_req(eq: &mut EventQueue) -> Res<Result<ConnRequest, String>> {
    loop {
        match eq.next().await {
            Some(Ok(ev)) if ev.kind == EqEventKind::ConnReq => {
                return Ok(ConnRequest::from_event(&ev)
                    .map_err(|e| format!("unreadable connection request: {e}")));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Ok(Err(format!("connection request failed: {}", e.err))),
            None => return Err(Failure::new("wait for connection", "event queue closed")),
        }
    }
}

/// Both sides in this process over loopback: (server, client), each on
/// its own fabric; each step of the set-up may take `limit`.
pub async fn self_pair(sfab: &Fab, cfab: &Fab, limit: Duration) -> Res<(Link, Link)> {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    match sfab.info.ep_attr.ep_type {
        EpType::Msg => {
            let (pep, mut eq) = sfab.listen(lo)?;
            let addr = pep.local_addr().ctx("passive endpoint address")?;
            let addr = weft::decode_sockaddr(&addr).ctx("passive endpoint address")?;
            let pep = Arc::new(pep);
            let server = async {
                let req = conn_req(&mut eq)
                    .await?
                    .map_err(|why| Failure::new("wait for connection", why))?;
                sfab.accept_req(&req, pep, limit).await
            };
            let (s, c) = tokio::join!(server, cfab.connect(addr, limit));
            Ok((s?, c?))
        }
        _ => {
            let (sep, scq, sav) = sfab.connless(lo)?;
            let (cep, ccq, cav) = cfab.connless(lo)?;
            let saddr = sep.local_addr().ctx("endpoint address")?;
            let caddr = cep.local_addr().ctx("endpoint address")?;
            // Both at once: each resolution (verbs DGRAM) needs the other
            // endpoint to answer, which it does as soon as it is enabled.
            let what = "insert peer address";
            let (s, c) = tokio::join!(
                within(
                    limit,
                    what,
                    connless_link(sfab, (sep, scq, sav), &caddr, None)
                ),
                within(
                    limit,
                    what,
                    connless_link(cfab, (cep, ccq, cav), &saddr, None)
                ),
            );
            Ok((s?, c?))
        }
    }
}

pub(crate) fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The provider speaks `FI_SOCKADDR_IN`, so IPv4 answers come first.
pub(crate) async fn resolve(host: &str, port: u16) -> Res<SocketAddr> {
    let what = || format!("resolve {host}:{port}");
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .with_ctx(what)?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Failure::new(what(), "no address found"))
}

impl Link {
    pub fn reaper(&self) -> Reaper {
        Reaper::new(self.cq.clone(), self.mode == WaitMode::BusyPoll, self.idle)
    }

    /// A DGRAM link: messages may be lost (and, in principle, reordered),
    /// and nothing holds a sender back from outrunning the receiver.
    pub fn lossy(&self) -> bool {
        self.idle.is_some()
    }

    /// Awaits an operation; on a DGRAM link only for so long.
    pub(crate) async fn bounded(
        &self,
        what: &str,
        op: impl Future<Output = Result<CqEntry, CqErrEntry>>,
    ) -> Res<CqEntry> {
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
        loop {
            let r = if self.tagged {
                self.ep.post_tsend(self.peer, buf.clone(), DATA_TAG, ctx)
            } else {
                self.ep.post_send(self.peer, buf.clone(), ctx)
            };
            match r {
                Err(weft::Error::Again) => tokio::task::yield_now().await,
                r => return r.ctx("post send"),
            }
        }
    }

    /// `fi_trecv` / `fi_recv` into `iov` (each buffer's length is its
    /// capacity). The `Vec` comes back in the completion's `bufs`: posting
    /// it again (see [`reclaim`]) keeps allocation off the latency path.
    pub async fn post_recv(&self, iov: Vec<BytesMut>, ctx: u64) -> Res<()> {
        let mut iov = iov;
        loop {
            let msg = weft::RecvMsg {
                src: FI_ADDR_UNSPEC,
                bufs: iov,
                tagged: self.tagged,
                tag: DATA_TAG,
                ignore: 0,
                context: ctx,
            };
            match self.ep.post_recvmsg(msg, weft::OpFlags::empty()) {
                Ok(()) => return Ok(()),
                Err((weft::Error::Again, back)) if !back.is_empty() => {
                    iov = back;
                    tokio::task::yield_now().await;
                }
                Err((e, _)) => return Err(Failure::new("post receive", e)),
            }
        }
    }

    pub async fn send(&self, buf: Bytes) -> Res<CqEntry> {
        self.bounded("send", self.send_tagged(buf, DATA_TAG)).await
    }

    pub async fn recv(&self, buf: BytesMut) -> Res<CqEntry> {
        self.bounded("receive", self.recv_tagged(buf, DATA_TAG))
            .await
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

/// The received bytes of a completion, as one buffer.
pub fn payload(e: CqEntry) -> Bytes {
    payload_keep(e).0
}

/// [`payload`], also handing back the completion's emptied `Vec` for the
/// next receive.
pub fn payload_keep(e: CqEntry) -> (Bytes, Vec<BytesMut>) {
    let mut bufs = e.bufs;
    if bufs.len() == 1 {
        let mut b = bufs.swap_remove(0);
        b.truncate(e.len);
        return (b.freeze(), bufs);
    }
    let mut out = BytesMut::with_capacity(e.len);
    for b in bufs.drain(..) {
        out.extend_from_slice(&b);
    }
    out.truncate(e.len);
    (out.freeze(), bufs)
}

/// The receive buffers of a completion, ready to post again: the first
/// buffer back at `size` bytes, in the same `Vec`.
pub fn reclaim(mut bufs: Vec<BytesMut>, size: usize) -> Vec<BytesMut> {
    bufs.truncate(1);
    if bufs.is_empty() {
        bufs.push(BytesMut::new());
    }
    bufs[0].resize(size, 0);
    bufs
}

/// Reads completions for the `post` API. Completions that are not the
/// one awaited are kept, since the order in which a send and a receive
/// complete is not fixed.
#[derive(Debug)]
pub struct Reaper {
    cq: CompletionQueue,
    stash: VecDeque<CqEntry>,
    batch: Vec<CqItem>,
    busy: bool,
    /// DGRAM: how long to wait for a completion before giving up.
    idle: Option<Duration>,
}

impl Reaper {
    fn new(cq: CompletionQueue, busy: bool, idle: Option<Duration>) -> Reaper {
        Reaper {
            busy,
            idle,
            cq,
            stash: VecDeque::new(),
            batch: Vec::with_capacity(64),
        }
    }

    /// Reads the next batch of completions (at least one) into `batch`.
    async fn read(&mut self) -> Res<()> {
        self.batch.clear();
        let deadline = self.idle.map(|d| (Instant::now() + d, d));
        if self.busy {
            // Spin on the queue, but give the CPU away now and then: the
            // provider's busy-poll thread and the peer's may need the same
            // core, and a reader that never yields starves the very thread
            // that would fill its queue (about 8 ms per message on 2 cores).
            let mut spins = 0u32;
            while self.cq.try_read_batch(&mut self.batch, 64) == 0 {
                spins = spins.wrapping_add(1);
                if spins % 64 == 0 {
                    std::thread::yield_now();
                    if let Some((at, d)) = deadline {
                        if Instant::now() >= at {
                            return Err(lost("read completion queue", d));
                        }
                    }
                }
                tokio::task::yield_now().await;
            }
        } else {
            let read = self.cq.read_batch(&mut self.batch, 64);
            let n = match deadline {
                None => read.await,
                Some((at, d)) => tokio::time::timeout_at(at.into(), read)
                    .await
                    .map_err(|_| lost("read completion queue", d))?,
            };
            if n == 0 {
                return Err(Failure::new("read completion queue", "queue closed"));
            }
        }
        Ok(())
    }

    async fn fill(&mut self) -> Res<()> {
        self.read().await?;
        for item in self.batch.drain(..) {
            match item {
                Ok(e) => self.stash.push_back(e),
                Err(e) => return Err(Failure::new("completion", e)),
            }
        }
        Ok(())
    }

    /// The next completion, whichever it is.
    pub async fn next(&mut self) -> Res<CqEntry> {
        loop {
            if let Some(e) = self.stash.pop_front() {
                return Ok(e);
            }
            self.fill().await?;
        }
    }

    /// The completion of the operation posted with `ctx`.
    pub async fn wait(&mut self, ctx: u64) -> Res<CqEntry> {
        self.wait_for(|e| e.context == ctx).await
    }

    /// The target completion of the peer's next write with remote CQ
    /// data (on MSG it completes a posted receive, on RDM it comes with
    /// no context of ours: the flags are what tell it apart).
    pub async fn wait_remote_write(&mut self) -> Res<CqEntry> {
        let f = weft::OpFlags::REMOTE_WRITE | weft::OpFlags::REMOTE_CQ_DATA;
        self.wait_for(|e| e.flags.contains(f)).await
    }

    async fn wait_for(&mut self, want: impl Fn(&CqEntry) -> bool) -> Res<CqEntry> {
        if let Some(i) = self.stash.iter().position(&want) {
            if let Some(e) = self.stash.remove(i) {
                return Ok(e);
            }
        }
        // The awaited completion goes straight from the batch to the
        // caller; only the others are kept, in order.
        loop {
            self.read().await?;
            let mut found = None;
            for item in self.batch.drain(..) {
                let e = item.map_err(|e| Failure::new("completion", e))?;
                if found.is_none() && want(&e) {
                    found = Some(e);
                } else {
                    self.stash.push_back(e);
                }
            }
            if let Some(e) = found {
                return Ok(e);
            }
        }
    }
}
