//! The fabric-level objects of one side, and the endpoints made from
//! them: connectionless ones bound to an address, MSG ones connecting or
//! accepting, and the MSG listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnRequest, CqAttr, Domain, Endpoint,
    EpType, EventQueue, Fabric, Info, PassiveEndpoint, WaitMode, FI_ADDR_UNSPEC,
};

use super::offer::{has_rma, hints, no_match, no_rma};
use super::{Link, DGRAM_IDLE};
use crate::args::PerfArgs;
use crate::fail::{timed_out, within, Context, Failure, Res};

/// How long a client keeps retrying a server that is not listening yet,
/// so `server & client` in a script does not need a careful sleep.
pub(crate) const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// The fabric-level objects both sides of `--self` share.
#[derive(Debug)]
pub struct Fab {
    pub info: Info,
    pub fabric: Fabric,
    pub domain: Domain,
    pub mode: WaitMode,
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
    pub(super) fn idle(&self) -> Option<Duration> {
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
    /// the peer will send to, so it must be reachable from there), where
    /// the provider's addresses are socket addresses.
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
        // Named addresses (shm: `fi_shm://<name>`) are the provider's to
        // choose; only socket addresses are bound to `src`.
        if self.info.addr_format != weft::AddrFormat::Str {
            ep.set_src_addr(weft::encode_sockaddr(&src))
                .ctx("set source address")?;
        }
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
        Ok(self.msg_link(ep, cq, eq, Some(pep)))
    }

    /// The link of a connected MSG endpoint.
    fn msg_link(
        &self,
        ep: Endpoint,
        cq: CompletionQueue,
        eq: EventQueue,
        pep: Option<Arc<PassiveEndpoint>>,
    ) -> Link {
        Link {
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
            _pep: pep,
            ctrl: None,
        }
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
                Ok(_) => return Ok(self.msg_link(ep, cq, eq, None)),
                Err(weft::Error::ConnRefused) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(Failure::new(format!("connect to {dest}"), e)),
            }
        }
    }
}
