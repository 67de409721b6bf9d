//! Authorization keys on the verbs provider (`docs/wire.md` §13.2), on
//! real RDMA devices (soft-RoCE in the VM of `integration/run-rxe`):
//! keyed MSG and RDM endpoints complete connections only with peers that
//! prove the same key in rdma_cm private data. Two "jobs" with different
//! keys share the VM (servers on rxe1, 10.66.0.1; clients on rxe2,
//! 10.66.0.2, as on two hosts): every cross-job connect or send is
//! refused with `FI_EKEYREJECTED` on both sides, reported on both EQs,
//! and nothing is delivered; peers of one job work. Keyed and unkeyed
//! endpoints refuse each other. Raw rdma_cm peers (`weft_verbs::sys`)
//! that forge, reflect, replay or cut short the proof, or answer a keyed
//! connect with a forged challenge or an accept, are refused without harm
//! to the endpoint's own job. Regions and endpoints under keys other than
//! the domain's get protection domains of their own, so another job's
//! remote keys fail at the device (`regions`). What verbs cannot enforce
//! (keys on DGRAM, keys in the AV on MSG) is refused.
//!
//! Outside the VM every test is ignored; inside it a missing device is a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnRequest, CqAttr, Domain, Endpoint,
    EpType, EqEventKind, Error, EventQueue, Fabric, FiAddr, Info, MrAccess, MrAttr, FI_ADDR_UNSPEC,
};
use weft_integration::{next_cq, verbs_offer_with, QUIET};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";
const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";

/// How long any one step may take under the VM's emulation.
const T: Duration = Duration::from_secs(30);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(T, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {T:?}: {what}"),
    }
}

/// The verbs offer of `ep_type` on `dev` for hints carrying `key`: keyed
/// hints match MSG and RDM offers, and the result carries the key.
fn info(dev: &str, ep_type: EpType, key: Option<&[u8]>) -> Info {
    let i = verbs_offer_with(dev, ep_type, |h| {
        h.caps = match ep_type {
            EpType::Rdm => weft::Caps::MSG | weft::Caps::TAGGED,
            _ => weft::Caps::MSG,
        };
        h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
    })
    .unwrap();
    assert_eq!(i.ep_attr.auth_key.as_deref(), key, "the hint's key");
    assert_eq!(i.domain_attr.max_ep_auth_key, 1);
    i
}

fn ip_of(raw: &[u8]) -> IpAddr {
    weft::decode_sockaddr(raw).unwrap().ip()
}

/// The next error on `eq`: `err`, from an address with IP `ip`.
async fn reported(eq: &EventQueue, err: Error, ip: IpAddr) -> SocketAddr {
    let e = within("a reported refusal", eq.next_timeout(T))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.err, err, "{e:?}");
    let peer = weft::decode_sockaddr(e.peer_addr.as_deref().expect("the peer's address")).unwrap();
    assert_eq!(peer.ip(), ip, "{e:?}");
    peer
}

// ---- RDM ----

/// An RDM endpoint with its own fabric, domain, AV, CQ and EQ.
struct Rdm {
    ep: Endpoint,
    av: AddressVector,
    /// Peers inserted so far: a second insert of an address would be a
    /// second handle, and sources are reported as the first.
    handles: std::sync::Mutex<Vec<(Vec<u8>, FiAddr)>>,
    eq: EventQueue,
    _cq: CompletionQueue,
    domain: Domain,
    _fabric: Fabric,
}

impl Rdm {
    fn open(dev: &str, key: Option<&[u8]>) -> Rdm {
        let i = info(dev, EpType::Rdm, key);
        let fabric = Fabric::open(&i).unwrap();
        let domain = fabric.domain(&i).unwrap();
        Rdm::on(&fabric, &domain, &i)
    }

    fn on(fabric: &Fabric, domain: &Domain, i: &Info) -> Rdm {
        let eq = fabric.eq(64).unwrap();
        let av = domain.av(AvAttr::default()).unwrap();
        let cq = domain.cq(CqAttr::default()).unwrap();
        let ep = domain.endpoint(i).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.enable().unwrap();
        Rdm {
            ep,
            av,
            handles: std::sync::Mutex::new(Vec::new()),
            eq,
            _cq: cq,
            domain: domain.clone(),
            _fabric: fabric.clone(),
        }
    }

    fn addr(&self) -> Vec<u8> {
        self.ep.local_addr().unwrap()
    }

    fn handle_of(&self, peer: &Rdm) -> FiAddr {
        let addr = peer.addr();
        let mut known = self.handles.lock().unwrap();
        if let Some((_, h)) = known.iter().find(|(a, _)| *a == addr) {
            return *h;
        }
        let h = self
            .av
            .insert_sync(std::slice::from_ref(&addr), Default::default())
            .unwrap()
            .fi_addrs[0];
        known.push((addr, h));
        h
    }
}

/// `n` tagged messages from `from` to `to`, each received there with
/// `from` as its source.
async fn exchange(from: &Rdm, to: &Rdm, n: u64) {
    let dest = from.handle_of(to);
    let src = to.handle_of(from);
    for i in 0..n {
        let recv = to.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, i, 0);
        let send = from
            .ep
            .tsend(dest, Bytes::from(i.to_le_bytes().to_vec()), i);
        let (got, sent) = within("a same-job exchange", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.src, src);
        assert_eq!(&got.into_bytes()[..], &i.to_le_bytes());
    }
}

/// A send from `from` to `to` fails with `KeyRejected`, both EQs report
/// the refusal with the other's address (the acceptor knows the request's
/// IP; its port is rdma_cm's), and nothing reaches `to`.
async fn refused_both_ways(from: &Rdm, to: &Rdm) {
    let conns = to.ep.stats().unwrap().conns;
    let refused = |r: &Rdm| r.ep.stats().unwrap().rx_key_rejected;
    let counted = (refused(from), refused(to));
    let dest = from.handle_of(to);
    let recv = to.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 77, 0);
    let sent = within(
        "a cross-job send",
        from.ep.tsend(dest, Bytes::from_static(b"cross-job"), 77),
    )
    .await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    let to_addr = weft::decode_sockaddr(&to.addr()).unwrap();
    assert_eq!(
        reported(&from.eq, Error::KeyRejected, to_addr.ip()).await,
        to_addr
    );
    reported(&to.eq, Error::KeyRejected, ip_of(&from.addr())).await;
    let r = tokio::time::timeout(QUIET, recv).await;
    assert!(r.is_err(), "delivered across jobs: {r:?}");
    assert_eq!(
        to.ep.stats().unwrap().conns,
        conns,
        "no connection left behind"
    );
    assert_eq!(
        (refused(from), refused(to)),
        (counted.0 + 1, counted.1 + 1),
        "each side counts the refusal"
    );
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_jobs_with_different_keys_stay_apart() {
    let (a1, a2) = (
        Rdm::open(SERVER_DEV, Some(JOB_A)),
        Rdm::open(CLIENT_DEV, Some(JOB_A)),
    );
    let (b1, b2) = (
        Rdm::open(SERVER_DEV, Some(JOB_B)),
        Rdm::open(CLIENT_DEV, Some(JOB_B)),
    );
    exchange(&a2, &a1, 3).await;
    exchange(&b2, &b1, 3).await;
    refused_both_ways(&a2, &b1).await;
    refused_both_ways(&b1, &a2).await;
    refused_both_ways(&b2, &a1).await;
    // Each job goes on working, both ways, over the connections it has.
    exchange(&a1, &a2, 3).await;
    exchange(&b1, &b2, 3).await;
    assert_eq!(a1.ep.stats().unwrap().conns, 1);
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_keyed_and_unkeyed_refuse_each_other() {
    let (keyed, plain) = (
        Rdm::open(SERVER_DEV, Some(JOB_A)),
        Rdm::open(CLIENT_DEV, None),
    );
    refused_both_ways(&plain, &keyed).await;
    refused_both_ways(&keyed, &plain).await;
    // Unkeyed endpoints still talk to each other.
    let other = Rdm::open(SERVER_DEV, None);
    exchange(&plain, &other, 2).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_keyed_peers_connect_simultaneously_and_to_themselves() {
    for _ in 0..2 {
        let (a, b) = (
            Rdm::open(SERVER_DEV, Some(JOB_A)),
            Rdm::open(CLIENT_DEV, Some(JOB_A)),
        );
        // Both connect at once: one connection survives the crossing.
        tokio::join!(exchange(&a, &b, 2), exchange(&b, &a, 2));
        exchange(&a, &a, 1).await;
    }
}

/// The domain's key is its endpoints' default; an endpoint of a keyed
/// domain may hold another (its queue pairs then live in that key's
/// protection domain, `regions`), and so may regions.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_keys_regions_and_what_verbs_refuses() {
    let mut di = info(SERVER_DEV, EpType::Rdm, None);
    di.domain_attr.auth_key = Some(JOB_A.to_vec());
    let fabric = Fabric::open(&di).unwrap();
    let domain = fabric.domain(&di).unwrap();
    let plain = info(SERVER_DEV, EpType::Rdm, None);
    let inherits = Rdm::on(&fabric, &domain, &plain);
    assert_eq!(inherits.ep.info().ep_attr.auth_key.as_deref(), Some(JOB_A));
    let explicit = Rdm::open(CLIENT_DEV, Some(JOB_A));
    exchange(&explicit, &inherits, 2).await;
    exchange(&inherits, &explicit, 2).await;
    let stranger = Rdm::open(CLIENT_DEV, Some(JOB_B));
    refused_both_ways(&stranger, &inherits).await;

    // Another key on the keyed domain serves that key's job, whose
    // peers it now admits, and refuses the domain's.
    let other = Rdm::on(
        &fabric,
        &domain,
        &info(SERVER_DEV, EpType::Rdm, Some(JOB_B)),
    );
    exchange(&stranger, &other, 1).await;
    refused_both_ways(&explicit, &other).await;
    // A key on a DGRAM endpoint, keys in the AV.
    let mut dg = verbs_offer_with(SERVER_DEV, EpType::Dgram, |_| {}).unwrap();
    assert_eq!(dg.domain_attr.max_ep_auth_key, 0);
    let ddom = Fabric::open(&dg).unwrap().domain(&dg).unwrap();
    dg.ep_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(enable_err(&ddom, &dg), Error::OpNotSupp);
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some("verbs".into());
    h.ep_attr.ep_type = EpType::Dgram;
    h.ep_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(weft::getinfo(Some(&h)).err(), Some(Error::NoData));
    // Keys in the AV: RDM only (verbs_av_auth_keys.rs); MSG hints with
    // them match nothing, and a MSG domain with them is refused.
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some("verbs".into());
    h.ep_attr.ep_type = EpType::Msg;
    h.domain_attr.av_auth_key = true;
    assert_eq!(weft::getinfo(Some(&h)).err(), Some(Error::NoData));
    let mut avk = info(SERVER_DEV, EpType::Msg, None);
    avk.domain_attr.av_auth_key = true;
    assert_eq!(fabric.domain(&avk).err(), Some(Error::OpNotSupp));

    // Regions take any key (enforced in `regions`); a bad one is Inval.
    let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
    for key in [JOB_A, JOB_B] {
        assert!(domain
            .mr_regattr(MrAttr::alloc(4096, rw).auth_key(key))
            .is_ok());
    }
    let unkeyed = Fabric::open(&plain).unwrap().domain(&plain).unwrap();
    assert!(unkeyed.mr_regattr(MrAttr::alloc(4096, rw)).is_ok());
    assert!(unkeyed
        .mr_regattr(MrAttr::alloc(4096, rw).auth_key(JOB_A))
        .is_ok());
    let e = unkeyed
        .mr_regattr(MrAttr::alloc(4096, rw).auth_key(&[7; 65]))
        .err()
        .unwrap();
    assert_eq!(e.error, Error::Inval);
    exchange(&explicit, &inherits, 1).await;
}

/// Why an endpoint of `domain` for `i`, with its AV and CQ bound, cannot
/// be enabled.
fn enable_err(domain: &Domain, i: &Info) -> Error {
    let ep = domain.endpoint(i).unwrap();
    let av = domain.av(AvAttr::default()).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.enable().expect_err("enabled against the rules")
}

// ---- MSG ----

struct Listener {
    pep: weft::PassiveEndpoint,
    eq: EventQueue,
    addr: Vec<u8>,
    fabric: Fabric,
    domain: Domain,
}

fn listener(key: Option<&[u8]>) -> Listener {
    let i = info(SERVER_DEV, EpType::Msg, key);
    let fabric = Fabric::open(&i).unwrap();
    let domain = fabric.domain(&info(SERVER_DEV, EpType::Msg, None)).unwrap();
    let pep = fabric.passive_endpoint(&i, None).unwrap();
    let eq = fabric.eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    let addr = pep.local_addr().unwrap();
    Listener {
        pep,
        eq,
        addr,
        fabric,
        domain,
    }
}

struct MsgEp {
    ep: Endpoint,
    eq: EventQueue,
    _cq: CompletionQueue,
    _domain: Domain,
}

/// An MSG endpoint on `dev` holding `key`, accepting `req` if given.
fn msg_ep(
    dev: &str,
    domain: Option<&Domain>,
    key: Option<&[u8]>,
    req: Option<&ConnRequest>,
) -> MsgEp {
    let i = info(dev, EpType::Msg, key);
    let d = match domain {
        Some(d) => d.clone(),
        None => Fabric::open(&i)
            .unwrap()
            .domain(&info(dev, EpType::Msg, None))
            .unwrap(),
    };
    let ep = match req {
        Some(r) => d.accept_endpoint(&i, r).unwrap(),
        None => d.endpoint(&i).unwrap(),
    };
    let eq = d.fabric().eq(64).unwrap();
    let cq = d.cq(CqAttr::default()).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();
    MsgEp {
        ep,
        eq,
        _cq: cq,
        _domain: d,
    }
}

/// A client holding `key` connects to `l` with CM data `cm` (which the
/// listener's request carries), and the connection carries messages both
/// ways.
async fn msg_connects(l: &Listener, key: Option<&[u8]>, cm: &[u8]) {
    let c = msg_ep(CLIENT_DEV, None, key, None);
    let c2 = c.ep.clone();
    let (dest, data) = (l.addr.clone(), cm.to_vec());
    let connecting = tokio::spawn(async move { c2.connect(dest, data).await });
    let ev = within("FI_CONNREQ", l.eq.next_timeout(T))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    assert_eq!(ev.cm_data, cm, "the CM data after the key proof");
    let req = ConnRequest::from_event(&ev).unwrap();
    let s = msg_ep(SERVER_DEV, Some(&l.domain), None, Some(&req));
    within("accept", s.ep.accept(Vec::new())).await.unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    for (from, to, what) in [(&c.ep, &s.ep, &b"up"[..]), (&s.ep, &c.ep, &b"down"[..])] {
        let recv = to.recv(BytesMut::zeroed(8));
        let send = from.send(FI_ADDR_UNSPEC, Bytes::copy_from_slice(what));
        let (got, sent) = within("a same-job message", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], what);
    }
    // Posted sends of pool buffers of the client's domain. Under a key
    // of its own the endpoint has a protection domain of its own, where
    // the pool's registration does not apply: the buffers go as bytes
    // (inline, through a bounce slot, registered). Unkeyed, as they are.
    let pool = c._domain.buffer_pool(2, 64 << 10).unwrap();
    for (i, len) in [16usize, 2048, 64 << 10].into_iter().enumerate() {
        let (mark, ctx) = (i as u8 + 1, 40 + i as u64);
        let mut b = pool.try_get().unwrap();
        b.set_len(len).unwrap();
        b.fill(mark);
        let recv = s.ep.recv(BytesMut::zeroed(len));
        c.ep.post_send_pooled(FI_ADDR_UNSPEC, b, ctx).unwrap();
        let got = within("a pool buffer's message", recv).await.unwrap();
        assert_eq!(got.len, len);
        assert!(
            got.into_bytes().iter().all(|&x| x == mark),
            "{len} B intact"
        );
        within("its send's completion", async {
            while next_cq(&c._cq).await.unwrap().context != ctx {}
        })
        .await;
    }
    within("every pool buffer back", async {
        while pool.stats().free != pool.stats().count {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(pool.stats().lent, 0);
}

/// A client holding `key` is refused by `l` with `KeyRejected` on both
/// sides; the listener reports no request.
async fn msg_refused(l: &Listener, key: Option<&[u8]>) {
    let c = msg_ep(CLIENT_DEV, None, key, None);
    let r = within(
        "a refused connect",
        c.ep.connect(l.addr.clone(), b"hi".to_vec()),
    )
    .await;
    assert_eq!(r.err(), Some(Error::KeyRejected));
    let e = within("the client's report", c.eq.next_timeout(T))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.err, Error::KeyRejected);
    assert_eq!(c.ep.stats().unwrap().rx_key_rejected, 1, "counted");
    let client_ip = ip_of(&info(CLIENT_DEV, EpType::Msg, None).src_addr.unwrap());
    reported(&l.eq, Error::KeyRejected, client_ip).await;
    assert!(l.eq.is_empty(), "no FI_CONNREQ for a refused key");
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_jobs_with_different_keys_stay_apart() {
    let la = listener(Some(JOB_A));
    let plain = listener(None);
    msg_connects(&la, Some(JOB_A), b"job a, 30 bytes of CM data ok.").await;
    msg_refused(&la, Some(JOB_B)).await;
    msg_refused(&la, None).await;
    msg_refused(&plain, Some(JOB_A)).await;
    msg_connects(
        &plain,
        None,
        b"plain CM data may take all of its 55 bytes, as before.",
    )
    .await;
    // A keyed connect has room for 30 bytes of CM data beside the proof.
    let c = msg_ep(CLIENT_DEV, None, Some(JOB_A), None);
    let r = c.ep.connect(la.addr.clone(), vec![7; 31]).await;
    assert_eq!(r.err(), Some(Error::Inval));
    // An accepting endpoint holding another key than the one proven.
    let c = msg_ep(CLIENT_DEV, None, Some(JOB_A), None);
    let c2 = c.ep.clone();
    let dest = la.addr.clone();
    let connecting = tokio::spawn(async move { c2.connect(dest, Vec::new()).await });
    let ev = within("FI_CONNREQ", la.eq.next_timeout(T))
        .await
        .unwrap()
        .unwrap();
    let req = ConnRequest::from_event(&ev).unwrap();
    let s = msg_ep(SERVER_DEV, Some(&la.domain), Some(JOB_B), Some(&req));
    assert_eq!(
        within("accept", s.ep.accept(Vec::new())).await.err(),
        Some(Error::KeyRejected)
    );
    assert_eq!(
        within("connect", connecting).await.unwrap().err(),
        Some(Error::KeyRejected)
    );
    assert_eq!(s.ep.stats().unwrap().rx_key_rejected, 1, "counted");
    assert_eq!(c.ep.stats().unwrap().rx_key_rejected, 1, "counted");
    // The listener still serves its own job.
    msg_connects(&la, Some(JOB_A), b"still").await;
    drop((la.pep, plain.pep, la.fabric));
}

/// One tagged 64-byte message from `a` to `b` (its handle `dest`),
/// awaited on both sides: milliseconds.
async fn one_message(a: &Rdm, b: &Rdm, dest: FiAddr, tag: u64) -> f64 {
    let t0 = Instant::now();
    let recv = b.ep.trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, tag, 0);
    let send = a.ep.tsend(dest, Bytes::from_static(&[7; 64]), tag);
    let (got, sent) = within("an RDM message", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    got.unwrap();
    t0.elapsed().as_secs_f64() * 1e3
}

/// Connection set-up with and without keys, a few connects each in the
/// same run, alternated, printed for `docs/benchmarks.md` (medians, and
/// keyed over unkeyed): MSG from `connect` to the listener's `FI_CONNREQ`
/// (where the proof happens), and to both ends connected less the time
/// the accepting endpoint took to open; RDM the first message to a new
/// peer less the second. Every connect must succeed.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_cost_with_and_without_keys() {
    const ROUNDS: usize = 15;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let (mut req, mut up, mut rdm) = ([vec![], vec![]], [vec![], vec![]], [vec![], vec![]]);
    let lis = [listener(None), listener(Some(JOB_A))];
    for _ in 0..ROUNDS {
        for (k, key) in [None, Some(JOB_A)].into_iter().enumerate() {
            let l = &lis[k];
            let c = msg_ep(CLIENT_DEV, None, key, None);
            let c2 = c.ep.clone();
            let dest = l.addr.clone();
            let t0 = Instant::now();
            let connecting = tokio::spawn(async move { c2.connect(dest, Vec::new()).await });
            let ev = within("FI_CONNREQ", l.eq.next_timeout(T))
                .await
                .unwrap()
                .unwrap();
            let asked = ms(t0);
            req[k].push(asked);
            let r = ConnRequest::from_event(&ev).unwrap();
            let s = msg_ep(SERVER_DEV, Some(&l.domain), None, Some(&r));
            let t1 = Instant::now();
            within("accept", s.ep.accept(Vec::new())).await.unwrap();
            within("connect", connecting).await.unwrap().unwrap();
            up[k].push(asked + ms(t1));

            let (a, b) = (Rdm::open(CLIENT_DEV, key), Rdm::open(SERVER_DEV, key));
            let dest = a.handle_of(&b);
            let first = one_message(&a, &b, dest, 1).await;
            let second = one_message(&a, &b, dest, 2).await;
            rdm[k].push(first - second);
        }
    }
    let m = |v: &mut [Vec<f64>; 2]| (median(&mut v[0]), median(&mut v[1]));
    let ((q0, q1), (u0, u1), (r0, r1)) = (m(&mut req), m(&mut up), m(&mut rdm));
    eprintln!(
        "verbs set-up, medians of {ROUNDS} (ms, unkeyed / keyed / ratio): \
         MSG connect to FI_CONNREQ {q0:.2} / {q1:.2} / x{:.2}; \
         MSG connect to connected, accepting endpoint's opening excluded, {u0:.2} / {u1:.2} / x{:.2}; \
         RDM first message less second {r0:.2} / {r1:.2} / x{:.2}",
        q1 / q0,
        u1 / u0,
        r1 / r0
    );
}

// ---- raw rdma_cm peers ----

#[cfg(feature = "verbs")]
mod raw;
mod regions;

/// Forged, reflected, replayed, moved and cut-short proofs, a notice,
/// another key's opening and a plain request, each against a keyed MSG
/// listener and a keyed RDM endpoint: each refused (`REFUSED` rejection)
/// and reported; a good proof is accepted once. The victims keep serving
/// their own job.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reflected_and_replayed_proofs_are_refused_without_harm() {
    #[cfg(feature = "verbs")]
    raw::proofs().await;
}

/// A keyed connector facing a raw acceptor: a challenge whose MAC was made
/// without the key gets a notice and no proof; an acceptor that accepts
/// the opening instead of challenging it has proven nothing. Both fail
/// the connect with `KeyRejected`.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_refuses_forged_challenges_and_unchallenged_accepts() {
    #[cfg(feature = "verbs")]
    raw::acceptor().await;
}
