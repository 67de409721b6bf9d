//! Shared helpers of the integration tests: a [`Provider`] description, the
//! list of providers every conformance test runs against ([`providers`]),
//! and a [`Harness`] that builds fabric, domain, AVs, queues and endpoints
//! for one provider.
//!
//! Every helper that awaits something bounds the wait with [`TIMEOUT`], so a
//! bug fails a test quickly instead of hanging it.

// Test helpers: failing loudly (panicking) is their job.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod av_change;
pub mod av_keys;
pub mod campaign;
pub mod child;
pub mod identity;
pub mod rxe_net;
pub mod shared_av;
pub mod soak;
pub mod srx;
pub mod tls;

pub use soak::{under_timeout, Rng, SoakWindow, Until};

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnLimits, ConnRequest, CqAttr, CqItem,
    Domain, EpType, EqItem, Error, EventQueue, Fabric, FiAddr, Info,
};

/// How long any single await in a test may take before the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// How long a test waits to be reasonably sure something does *not* happen
/// (an entry that must not appear). Never used to assert speed.
pub const QUIET: Duration = Duration::from_millis(200);

/// The providers every conformance test is instantiated for. The verbs
/// instances need an RDMA device: without one they print why they are
/// skipped (see [`Provider::usable`]). udp has neither RDM nor MSG: its
/// instances are the tests that apply to a connectionless endpoint, run
/// on `FI_EP_DGRAM` ([`Provider::connless_type`]). shm has RDM only: its
/// instances are the RDM tests that need no MSG endpoints, RMA or
/// memory registration.
pub fn providers() -> Vec<&'static str> {
    vec!["tcp", "verbs", "udp", "shm"]
}

/// The RDMA device the verbs conformance tests use (`WEFT_VERBS_DOMAIN`,
/// default rxe1: rdma_cm cannot use rxe0, which sits on loopback).
pub fn verbs_domain() -> String {
    std::env::var("WEFT_VERBS_DOMAIN").unwrap_or_else(|_| "rxe1".into())
}

/// A provider under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    /// The provider's name, as in `fabric_attr.prov_name`.
    pub name: &'static str,
}

impl Provider {
    /// The provider called `name`.
    pub fn named(name: &'static str) -> Provider {
        Provider { name }
    }

    /// Whether this run can test the provider: always for software
    /// providers; verbs needs its device, and its tests are compiled to
    /// run only in a verbs build (a missing device fails them there).
    pub fn usable(&self) -> bool {
        self.name != "verbs" || verbs_offer(&verbs_domain(), EpType::Rdm).is_some()
    }

    /// The connectionless endpoint type the provider's conformance tests
    /// run on: RDM, or DGRAM for udp, which has only that.
    pub fn connless_type(&self) -> EpType {
        if self.name == "udp" {
            EpType::Dgram
        } else {
            EpType::Rdm
        }
    }

    /// The provider's offer for `ep_type`, or `None` if it has none.
    pub fn try_info(&self, ep_type: EpType) -> Option<Info> {
        let mut hints = Info::default();
        hints.ep_attr.ep_type = ep_type;
        hints.fabric_attr.prov_name = Some(self.name.to_string());
        if self.name == "verbs" {
            hints.domain_attr.name = Some(verbs_domain());
        }
        weft::getinfo(Some(&hints))
            .ok()
            .and_then(|mut v| (!v.is_empty()).then(|| v.remove(0)))
    }

    /// The provider's offer for `ep_type` (panics if there is none).
    pub fn info(&self, ep_type: EpType) -> Info {
        self.try_info(ep_type)
            .unwrap_or_else(|| panic!("provider {} offers no {:?}", self.name, ep_type))
    }

    /// The provider's offer for `ep_type` with hints tuned by `tune`, or
    /// `None` if nothing matches.
    pub fn try_info_with(&self, ep_type: EpType, tune: impl FnOnce(&mut Info)) -> Option<Info> {
        let mut hints = Info::default();
        hints.ep_attr.ep_type = ep_type;
        hints.fabric_attr.prov_name = Some(self.name.to_string());
        if self.name == "verbs" {
            hints.domain_attr.name = Some(verbs_domain());
        }
        tune(&mut hints);
        weft::getinfo(Some(&hints))
            .ok()
            .and_then(|mut v| (!v.is_empty()).then(|| v.remove(0)))
    }

    /// The offer with RMA: hints asking for messages and RMA, accepting
    /// every registration mode the providers require (verbs: provider
    /// keys, virtual addresses, local registration) and `FI_RX_CQ_DATA`.
    /// An application written this way runs on both, reading keys and
    /// addresses from its regions.
    pub fn rma_info(&self, ep_type: EpType) -> Info {
        self.try_info_with(ep_type, |h| {
            h.caps = weft::Caps::MSG | weft::Caps::RMA;
            h.domain_attr.mr_mode =
                weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
            h.mode = weft::Mode::RX_CQ_DATA;
        })
        .unwrap_or_else(|| panic!("provider {} offers no RMA on {:?}", self.name, ep_type))
    }
}

/// Awaits `fut`, failing the test if it takes longer than [`TIMEOUT`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    within_for(TIMEOUT, what, fut).await
}

/// [`within`] with a limit of the caller's.
pub async fn within_for<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Waits until `ep`'s statistics satisfy `ok` (its drivers run on their
/// own), failing the test after [`TIMEOUT`].
pub async fn stats_until(ep: &weft::Endpoint, what: &str, ok: impl Fn(&weft::EpStats) -> bool) {
    let start = std::time::Instant::now();
    loop {
        let s = ep.stats().unwrap();
        if ok(&s) {
            return;
        }
        assert!(start.elapsed() < TIMEOUT, "{what}: stats stuck at {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends `msg` from `from` to `dest` while `to` receives it (a buffer of
/// its size); checks the bytes and returns the source the receive
/// reports (`FI_SOURCE`).
pub async fn delivered(
    from: &weft::Endpoint,
    to: &weft::Endpoint,
    dest: FiAddr,
    msg: Bytes,
) -> FiAddr {
    let recv = to.recv(bytes::BytesMut::zeroed(msg.len().max(1)));
    let (got, sent) = within("delivery", async {
        tokio::join!(recv, from.send(dest, msg.clone()))
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    let src = got.src;
    assert_eq!(&got.into_bytes()[..], &msg[..]);
    src
}

/// Authorization keys of the wrong size (empty, or one byte past
/// `MAX_KEY_LEN`) are `Inval` when an endpoint of `d` for `info` is
/// created with one, and when a domain for `info` is opened with one.
pub fn bad_keys_refused_at_open(d: &Domain, info: &Info) {
    for bad in [Vec::new(), vec![7; weft_core::auth::MAX_KEY_LEN + 1]] {
        let mut i = info.clone();
        i.ep_attr.auth_key = Some(bad.clone());
        assert_eq!(d.endpoint(&i).unwrap_err(), Error::Inval, "{}", bad.len());
        let mut i = info.clone();
        i.domain_attr.auth_key = Some(bad);
        assert_eq!(
            Fabric::open(&i).unwrap().domain(&i).unwrap_err(),
            Error::Inval
        );
    }
}

/// The unexpected bytes `ep` still holds once they stop falling to 0, or
/// after a second: charges an endpoint gives back when a write finishes
/// can trail the completion its peer already saw.
pub async fn settled_unexpected_bytes(ep: &weft::Endpoint) -> usize {
    let mut held = usize::MAX;
    for _ in 0..100 {
        held = ep.stats().map_or(usize::MAX, |s| s.unexpected_bytes);
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held
}

/// The next item of a completion queue (fails the test on timeout).
pub async fn next_cq(cq: &CompletionQueue) -> CqItem {
    match cq.next_timeout(TIMEOUT).await {
        Some(it) => it,
        None => panic!("no completion within {TIMEOUT:?}"),
    }
}

/// The next item of an event queue (fails the test on timeout).
pub async fn next_eq(eq: &EventQueue) -> EqItem {
    match eq.next_timeout(TIMEOUT).await {
        Ok(it) => it,
        Err(e) => panic!("no event within {TIMEOUT:?}: {e}"),
    }
}

/// Asserts that `cq` stays empty for [`QUIET`].
pub async fn assert_cq_quiet(cq: &CompletionQueue, what: &str) {
    if let Some(it) = cq.next_timeout(QUIET).await {
        panic!("{what}: unexpected completion {it:?}");
    }
}

/// Fabric, domain and the info they were opened with, for one provider and
/// endpoint type.
#[derive(Debug, Clone)]
pub struct Harness {
    /// The provider under test.
    pub provider: Provider,
    /// The provider's offer for the endpoint type.
    pub info: Info,
    /// The fabric.
    pub fabric: Fabric,
    /// The domain.
    pub domain: Domain,
}

/// An enabled connectionless endpoint with its own AV and CQ (bound for
/// both directions).
#[derive(Debug, Clone)]
pub struct RdmEp {
    /// The endpoint.
    pub ep: weft::Endpoint,
    /// Its address vector.
    pub av: AddressVector,
    /// Its CQ (transmit and receive).
    pub cq: CompletionQueue,
}

impl RdmEp {
    /// The endpoint's raw address.
    pub fn addr(&self) -> Vec<u8> {
        self.ep.local_addr().expect("local_addr")
    }

    /// Inserts `peer`'s address into this endpoint's AV; returns the handle.
    pub fn insert(&self, peer: &RdmEp) -> FiAddr {
        let r = self
            .av
            .insert_sync(&[peer.addr()], Default::default())
            .expect("insert");
        assert_eq!(r.count, 1, "insert of a peer address");
        r.fi_addrs[0]
    }
}

impl Harness {
    /// Opens fabric and domain of `provider` for `ep_type`. Must run inside a
    /// Tokio runtime.
    pub fn new(provider: &Provider, ep_type: EpType) -> Harness {
        let info = provider.info(ep_type);
        let fabric = Fabric::open(&info).expect("fabric open");
        assert_eq!(fabric.provider(), provider.name);
        let domain = fabric.domain(&info).expect("domain open");
        Harness {
            provider: *provider,
            info,
            fabric,
            domain,
        }
    }

    /// Opens fabric and domain of `provider` for `info`. Must run inside a
    /// Tokio runtime.
    pub fn with_info(provider: &Provider, info: Info) -> Harness {
        let fabric = Fabric::open(&info).expect("fabric open");
        let domain = fabric.domain(&info).expect("domain open");
        Harness {
            provider: *provider,
            info,
            fabric,
            domain,
        }
    }

    /// RDM harness.
    pub fn rdm(provider: &Provider) -> Harness {
        Harness::new(provider, EpType::Rdm)
    }

    /// Harness of the provider's connectionless type
    /// ([`Provider::connless_type`]).
    pub fn connless(provider: &Provider) -> Harness {
        Harness::new(provider, provider.connless_type())
    }

    /// MSG harness.
    pub fn msg(provider: &Provider) -> Harness {
        Harness::new(provider, EpType::Msg)
    }

    /// An address of this provider's format at which nothing listens: a
    /// released loopback TCP port for the socket providers, the domain's
    /// own address with an unused rdma_cm port for verbs.
    pub fn dead_addr(&self) -> Vec<u8> {
        if self.provider.name != "verbs" {
            return dead_addr();
        }
        let src = self
            .info
            .src_addr
            .as_deref()
            .expect("verbs offers a source address");
        let mut a = weft::decode_sockaddr(src).expect("verbs source address");
        // The discard port: no rdma_cm service listens there.
        a.set_port(9);
        weft::encode_sockaddr(&a)
    }

    /// A second, independent domain of the same fabric.
    pub fn other_domain(&self) -> Domain {
        self.fabric.domain(&self.info).expect("second domain")
    }

    /// An AV with default attributes.
    pub fn av(&self) -> AddressVector {
        self.domain.av(AvAttr::default()).expect("av open")
    }

    /// An AV with `attr`.
    pub fn av_with(&self, attr: AvAttr) -> AddressVector {
        self.domain.av(attr).expect("av open")
    }

    /// A CQ with default attributes.
    pub fn cq(&self) -> CompletionQueue {
        self.domain.cq(CqAttr::default()).expect("cq open")
    }

    /// An EQ of 64 entries.
    pub fn eq(&self) -> EventQueue {
        self.fabric.eq(64).expect("eq open")
    }

    /// A disabled endpoint of the harness's info.
    pub fn endpoint(&self) -> weft::Endpoint {
        self.domain.endpoint(&self.info).expect("endpoint")
    }

    /// An enabled RDM endpoint with its own AV and a CQ bound with
    /// `TRANSMIT | RECV | extra`.
    pub fn rdm_ep_with(&self, info: &Info, av: AddressVector, extra: BindFlags) -> RdmEp {
        let cq = self.cq();
        let ep = self.domain.endpoint(info).expect("endpoint");
        ep.bind_av(&av).expect("bind av");
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV | extra)
            .expect("bind cq");
        ep.enable().expect("enable");
        RdmEp { ep, av, cq }
    }

    /// An enabled RDM endpoint with its own AV and CQ.
    pub fn rdm_ep(&self) -> RdmEp {
        self.rdm_ep_with(&self.info, self.av(), BindFlags::empty())
    }

    /// Two enabled RDM endpoints, each with the other in its AV. Returns
    /// `(a, b, b's handle in a's AV, a's handle in b's AV)`.
    pub fn rdm_pair(&self) -> (RdmEp, RdmEp, FiAddr, FiAddr) {
        self.rdm_pair_with(&self.info)
    }

    /// [`rdm_pair`](Self::rdm_pair) of endpoints opened with `info`.
    pub fn rdm_pair_with(&self, info: &Info) -> (RdmEp, RdmEp, FiAddr, FiAddr) {
        let a = self.rdm_ep_with(info, self.av(), BindFlags::empty());
        let b = self.rdm_ep_with(info, self.av(), BindFlags::empty());
        let b_in_a = a.insert(&b);
        let a_in_b = b.insert(&a);
        (a, b, b_in_a, a_in_b)
    }
}

/// A payload of `len` bytes whose content depends on `seed`.
pub fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// The verbs offer of `ep_type` on device `dev`, or `None` (after saying
/// why) when this run cannot use one. Inside the rxe VM (`RXE_VM=1`) a
/// missing device or build feature fails the test instead, so nothing
/// passes silently there.
pub fn verbs_offer(dev: &str, ep_type: EpType) -> Option<Info> {
    verbs_offer_with(dev, ep_type, |_| {})
}

/// [`verbs_offer`] with hints adjusted by `tune` (e.g. asking for RMA).
///
/// A verbs test runs only in a build with the verbs feature (elsewhere it
/// is reported as ignored, with the reason); there, a missing device
/// fails it, saying why — a verbs test never passes without running.
/// (Always `Some`; the `Option` serves callers written as `let … else`.)
pub fn verbs_offer_with(dev: &str, ep_type: EpType, tune: impl FnOnce(&mut Info)) -> Option<Info> {
    assert!(
        weft::providers().contains(&"verbs"),
        "built without the verbs feature: run verbs tests with integration/run-rxe"
    );
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some("verbs".into());
    hints.ep_attr.ep_type = ep_type;
    hints.domain_attr.name = Some(dev.into());
    tune(&mut hints);
    match weft::getinfo(Some(&hints)) {
        Ok(mut v) => Some(v.remove(0)),
        Err(e) => {
            let why = weft::provider_unavailable("verbs").unwrap_or_else(|| format!("{dev}: {e}"));
            panic!("no verbs {ep_type:?} offer for {dev}: {why} (integration/run-rxe provides rxe devices)");
        }
    }
}

/// An enabled endpoint of `domain` for `info`, bound to `av` and to one
/// new CQ for both directions, waiting in `wait` mode.
pub fn enabled_endpoint(
    domain: &Domain,
    info: &Info,
    av: &AddressVector,
    wait: weft::WaitMode,
) -> (weft::Endpoint, CompletionQueue) {
    enabled_endpoint_with_eq(domain, info, av, None, wait)
}

/// [`enabled_endpoint`] with `eq` bound too (where refusals and
/// connection events go), when given.
pub fn enabled_endpoint_with_eq(
    domain: &Domain,
    info: &Info,
    av: &AddressVector,
    eq: Option<&weft::EventQueue>,
    wait: weft::WaitMode,
) -> (weft::Endpoint, CompletionQueue) {
    let cq = domain
        .cq(CqAttr {
            wait,
            ..CqAttr::default()
        })
        .unwrap();
    let ep = domain.endpoint(info).unwrap();
    ep.bind_av(av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    if let Some(eq) = eq {
        ep.bind_eq(eq).unwrap();
    }
    ep.set_wait_mode(wait).unwrap();
    ep.enable().unwrap();
    (ep, cq)
}

/// An endpoint of `domain` for the connection request `req`, before its
/// `accept`: bound to an EQ of its own (`fabric`'s, 8 entries) and to
/// one CQ for both directions (default attributes), `limits` set,
/// enabled.
pub fn accepted_endpoint(
    fabric: &Fabric,
    domain: &Domain,
    info: &Info,
    req: &ConnRequest,
    limits: ConnLimits,
) -> (weft::Endpoint, EventQueue, CompletionQueue) {
    let ep = domain.accept_endpoint(info, req).unwrap();
    let eq = fabric.eq(8).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.set_conn_limits(limits).unwrap();
    ep.enable().unwrap();
    (ep, eq, cq)
}

/// An enabled connectionless endpoint (RDM or DGRAM) of its own fabric
/// and domain, with its AV (an EQ bound to it for `FI_EVENT` inserts) and
/// one CQ for both directions.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Node {
    pub ep: weft::Endpoint,
    pub av: AddressVector,
    pub eq: EventQueue,
    pub cq: CompletionQueue,
    pub domain: Domain,
    pub fabric: Fabric,
}

impl Node {
    /// Opens everything for `info`, waiting in `wait` mode.
    pub fn open(info: &Info, wait: weft::WaitMode) -> Node {
        Node::open_with(info, wait, false)
    }

    /// [`Node::open`] with the endpoint bound to the EQ too (where its
    /// own events go, e.g. `FI_JOIN_COMPLETE`).
    pub fn open_ep_eq(info: &Info, wait: weft::WaitMode) -> Node {
        Node::open_with(info, wait, true)
    }

    fn open_with(info: &Info, wait: weft::WaitMode, ep_eq: bool) -> Node {
        let fabric = Fabric::open(info).unwrap();
        let domain = fabric.domain(info).unwrap();
        let eq = fabric.eq(64).unwrap();
        let av = domain.av(AvAttr::default()).unwrap();
        av.bind_eq(&eq, 0).unwrap();
        let (ep, cq) = enabled_endpoint_with_eq(&domain, info, &av, ep_eq.then_some(&eq), wait);
        Node {
            ep,
            av,
            eq,
            cq,
            domain,
            fabric,
        }
    }

    /// `peer`'s handle in this node's AV (a synchronous insert).
    pub fn handle_of(&self, peer: &Node) -> FiAddr {
        self.av
            .insert_sync(&[peer.ep.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0]
    }
}

/// Raw bytes of a loopback TCP address that nothing listens on (a port
/// bound then released).
pub fn dead_addr() -> Vec<u8> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("local_addr");
    drop(l);
    weft::encode_sockaddr(&a)
}

/// A connected MSG pair: a client endpoint (`ci`'s device) connected to
/// one accepted from a listener of `si`'s device, each with its own EQ
/// and CQ (interrupt waits), both `Connected` events consumed. The
/// fabrics, domains and listener are kept alive with it.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct MsgPair {
    pub cep: weft::Endpoint,
    pub sep: weft::Endpoint,
    pub ceq: EventQueue,
    pub seq: EventQueue,
    pub ccq: CompletionQueue,
    pub scq: CompletionQueue,
    pub sd: Domain,
    pub cd: Domain,
    pub pep: weft::PassiveEndpoint,
    pub peq: EventQueue,
    pub fabrics: (Fabric, Fabric),
}

/// Connects a [`MsgPair`]: the client of `ci` to a listener of `si`.
pub async fn msg_pair(si: &Info, ci: &Info) -> MsgPair {
    let (sf, cf) = (Fabric::open(si).unwrap(), Fabric::open(ci).unwrap());
    let (sd, cd) = (sf.domain(si).unwrap(), cf.domain(ci).unwrap());
    let pep = sf.passive_endpoint(si, None).unwrap();
    let peq = sf.eq(16).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let mk = |d: &Domain, f: &Fabric, info: &Info, req: Option<&weft::ConnRequest>| {
        let ep = match req {
            Some(r) => d.accept_endpoint(info, r).unwrap(),
            None => d.endpoint(info).unwrap(),
        };
        let eq = f.eq(16).unwrap();
        let cq = d
            .cq(CqAttr {
                wait: weft::WaitMode::Interrupt,
                ..CqAttr::default()
            })
            .unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        (ep, eq, cq)
    };
    let (cep, ceq, ccq) = mk(&cd, &cf, ci, None);
    let addr = pep.local_addr().unwrap();
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(addr, Vec::new()).await });
    let ev = within("connreq", next_eq(&peq)).await.unwrap();
    assert_eq!(ev.kind, weft::EqEventKind::ConnReq);
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let (sep, seq, scq) = mk(&sd, &sf, si, Some(&req));
    within("accept", sep.accept(Vec::new())).await.unwrap();
    within("connect", conn).await.unwrap().unwrap();
    for q in [&ceq, &seq] {
        let ev = within("connected", next_eq(q)).await.unwrap();
        assert_eq!(ev.kind, weft::EqEventKind::Connected);
    }
    MsgPair {
        cep,
        sep,
        ceq,
        seq,
        ccq,
        scq,
        sd,
        cd,
        pep,
        peq,
        fabrics: (sf, cf),
    }
}

/// Both ends of a byte stream trade `data`: `c` writes it and shuts its
/// side, `s` reads to the end and answers with the same bytes, then `c`
/// reads those. Returns what `s` and what `c` read.
pub async fn trade_both_ways<C, S>(c: &mut C, s: &mut S, data: &[u8]) -> (Vec<u8>, Vec<u8>)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    within("both ways", async {
        tokio::join!(
            async {
                c.write_all(data).await.unwrap();
                c.shutdown().await.unwrap();
                let mut v = Vec::new();
                c.read_to_end(&mut v).await.unwrap();
                v
            },
            async {
                let mut v = Vec::new();
                s.read_to_end(&mut v).await.unwrap();
                s.write_all(data).await.unwrap();
                s.shutdown().await.unwrap();
                v
            }
        )
    })
    .await
}

/// A receive of up to 16 bytes directed by the authorization key handle
/// `key` (`OpFlags::AUTH_KEY`), tagged with `tag` under `ignore`; its
/// context is the tag.
pub fn by_key(key: FiAddr, tag: u64, ignore: u64) -> weft::RecvMsg {
    weft::RecvMsg {
        src: key,
        bufs: vec![bytes::BytesMut::zeroed(16)],
        tagged: true,
        tag,
        ignore,
        context: tag,
    }
}

/// One sender as [`directed_by_key`] takes it: its endpoint, its handle
/// for the service, and the service's handle for it (under its key).
pub type KeyedSender<'a> = (&'a weft::Endpoint, FiAddr, FiAddr);

/// Receives directed by key on `svc`, which holds key handle `ka`:
/// `a1` and `a2` prove that key, `b` another. Unexpected: `b`'s message
/// arrives first, then `a1`'s; the receive directed at `ka` takes
/// `a1`'s and leaves `b`'s. Posted (any tag): only `a2`'s completes it
/// while `b`'s goes to a plain receive. Each reports its sender's
/// handle under its key.
pub async fn directed_by_key(svc: &weft::Endpoint, ka: FiAddr, [a1, a2, b]: [KeyedSender<'_>; 3]) {
    let auth = weft::OpFlags::AUTH_KEY;
    let any = weft::FI_ADDR_UNSPEC;
    within("b's send", b.0.tsend(b.1, Bytes::from_static(b"from b"), 7))
        .await
        .unwrap();
    within(
        "a1's send",
        a1.0.tsend(a1.1, Bytes::from_static(b"from a1"), 7),
    )
    .await
    .unwrap();
    let got = within("by key", svc.recvmsg(by_key(ka, 7, 0), auth))
        .await
        .unwrap();
    assert_eq!(got.src, a1.2);
    assert_eq!(&got.into_bytes()[..7], b"from a1");
    let got = within(
        "the other",
        svc.trecv(bytes::BytesMut::zeroed(16), any, 7, 0),
    )
    .await
    .unwrap();
    assert_eq!(got.src, b.2);

    let recv = svc.recvmsg(by_key(ka, 0, u64::MAX), auth);
    let other = svc.trecv(bytes::BytesMut::zeroed(16), any, 8, 0);
    let (a, o, s1, s2) = within("posted by key", async {
        tokio::join!(
            recv,
            other,
            b.0.tsend(b.1, Bytes::from_static(b"b again"), 8),
            a2.0.tsend(a2.1, Bytes::from_static(b"from a2"), 9),
        )
    })
    .await;
    s1.unwrap();
    s2.unwrap();
    assert_eq!(a.unwrap().src, a2.2);
    assert_eq!(o.unwrap().src, b.2);
}

/// Keys `held` by the enabled endpoint `ep` cannot be removed from its
/// AV (`Busy`); `spare`, which no endpoint holds, can, and its handle is
/// dead after; once `ep` closes, the held keys can be removed too.
pub fn held_keys_busy_until_close(
    av: &AddressVector,
    ep: &weft::Endpoint,
    held: &[FiAddr],
    spare: FiAddr,
) {
    for k in held {
        assert_eq!(av.remove_auth_keys(&[*k]), Err(Error::Busy));
    }
    av.remove_auth_keys(&[spare]).unwrap();
    assert_eq!(
        av.lookup_auth_key(spare, weft::AvFlags::AUTH_KEY),
        Err(Error::Inval)
    );
    ep.close().unwrap();
    av.remove_auth_keys(held).unwrap();
}

/// What enabling an endpoint of `domain` for `info` (bound to a new AV
/// and CQ) fails with; panics if it is enabled.
pub fn enable_error(domain: &Domain, info: &Info) -> Error {
    let r = domain.endpoint(info).and_then(|ep| {
        ep.bind_av(&domain.av(AvAttr::default())?)?;
        let cq = domain.cq(CqAttr::default())?;
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
        ep.enable()
    });
    match r {
        Ok(()) => panic!("enabled: {info:?}"),
        Err(e) => e,
    }
}
