//! TLS on tcp (`docs/design.md`, "TLS on tcp"): with `domain_attr.tls`
//! every connection is TLS 1.3 with both sides' certificates checked
//! against the CA. RDM and MSG endpoints carry messages, tagged messages,
//! messages of several MiB and RMA writes and reads over it in every
//! progress mode. A peer whose certificate another CA signed, a plain
//! peer (either way round) and a peer that sends garbage or a cut record
//! are refused on both sides, reported on the EQs, and the endpoint goes
//! on serving its own peers. Bad configurations fail the call that
//! creates the object. Certificates are made for each test (rcgen), and
//! everything runs on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft::{
    AddressVector, AvAttr, AvFlags, BindFlags, Caps, CompletionQueue, ConnLimits, CqAttr, Domain,
    Endpoint, EpType, EqEventKind, Error, EventQueue, FiAddr, Info, MrAccess, MrAttr, TlsFiles,
    WaitMode, FI_ADDR_UNSPEC,
};
use weft_integration::payload;
use weft_integration::tls::TestPki;

const T: Duration = Duration::from_secs(10);
const MODES: [WaitMode; 3] = [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline];
const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

fn hints(ep_type: EpType, tls: Option<&TlsFiles>) -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = ep_type;
    h.caps = Caps::MSG | Caps::TAGGED | Caps::RMA;
    h.fabric_attr.prov_name = Some("tcp".into());
    h.domain_attr.tls = tls.cloned();
    h
}

fn info(ep_type: EpType, tls: Option<&TlsFiles>) -> Info {
    let i = weft::getinfo(Some(&hints(ep_type, tls))).unwrap().remove(0);
    assert_eq!(i.domain_attr.tls.as_ref(), tls, "the hint's files");
    i
}

fn domain(tls: Option<&TlsFiles>) -> Domain {
    let i = info(EpType::Rdm, tls);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

struct Ep {
    ep: Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    eq: EventQueue,
    addr: SocketAddr,
}

fn rdm(d: &Domain, wait: WaitMode) -> Ep {
    rdm_with(d, wait, ConnLimits::default())
}

fn rdm_with(d: &Domain, wait: WaitMode, limits: ConnLimits) -> Ep {
    let eq = d.fabric().eq(64).unwrap();
    let av = d.av(AvAttr::default()).unwrap();
    let cq = d
        .cq(CqAttr {
            wait,
            ..CqAttr::default()
        })
        .unwrap();
    let ep = d.endpoint(d.info()).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.set_wait_mode(wait).unwrap();
    ep.set_conn_limits(limits).unwrap();
    ep.enable().unwrap();
    let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
    Ep {
        ep,
        av,
        _cq: cq,
        eq,
        addr,
    }
}

async fn handle(from: &Ep, of: SocketAddr) -> FiAddr {
    let bytes = weft::encode_sockaddr(&of);
    to(from.av.insert(&[bytes], AvFlags::empty(), 0).unwrap())
        .await
        .fi_addrs[0]
}

/// A message of `len` bytes from `from` (towards `dest`) reaches `at`.
async fn one_message(from: &Endpoint, dest: FiAddr, at: &Endpoint, len: usize, seed: u8) {
    let data = payload(len, seed);
    let recv = at.recv(BytesMut::zeroed(len));
    let send = from.send(dest, data.clone());
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert!(got.unwrap().into_bytes() == data, "{len} bytes");
}

/// Messages (small and several MiB), a tagged message, and an RMA write
/// and read of a region of `d` (`at`'s domain), from `from` to `at`.
async fn traffic(from: &Endpoint, dest: FiAddr, at: &Endpoint, d: &Domain, key: u64) {
    for (len, seed) in [(64, 1), (1 << 20, 2), ((4 << 20) + 7, 3)] {
        one_message(from, dest, at, len, seed).await;
    }
    let recv = at.trecv(BytesMut::zeroed(32), FI_ADDR_UNSPEC, 0x5eed, 0);
    let send = from.tsend(dest, Bytes::from_static(b"tagged over TLS"), 0x5eed);
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"tagged over TLS");
    let len = (1 << 20) + 3;
    let mr = d
        .mr_regattr(MrAttr::alloc(len, RW).requested_key(key))
        .unwrap();
    let data = payload(len, 9);
    to(from.write(dest, data.clone(), mr.addr(), mr.key()))
        .await
        .unwrap();
    assert!(mr.to_vec().unwrap() == data, "RMA write landed");
    let back = to(from.read(dest, BytesMut::zeroed(len), mr.addr(), mr.key()))
        .await
        .unwrap();
    assert!(back.into_bytes() == data, "RMA read");
    mr.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_carries_everything_over_tls_in_every_mode() {
    let pki = TestPki::new();
    let files = pki.issue("job");
    for (i, wait) in MODES.into_iter().enumerate() {
        let d = domain(Some(&files));
        let (a, b) = (rdm(&d, wait), rdm(&d, wait));
        let (to_b, to_a) = (handle(&a, b.addr).await, handle(&b, a.addr).await);
        traffic(&a.ep, to_b, &b.ep, &d, 10 + i as u64).await;
        traffic(&b.ep, to_a, &a.ep, &d, 20 + i as u64).await;
        assert!(a.eq.read_err().is_err(), "{wait:?}: nothing refused");
    }
}

// ---- MSG ----

struct Listener {
    pep: weft::PassiveEndpoint,
    eq: EventQueue,
    addr: SocketAddr,
}

fn listener(d: &Domain, tls: Option<&TlsFiles>) -> Listener {
    let pep = d
        .fabric()
        .passive_endpoint(&info(EpType::Msg, tls), None)
        .unwrap();
    let eq = d.fabric().eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    let addr = weft::decode_sockaddr(&pep.local_addr().unwrap()).unwrap();
    Listener { pep, eq, addr }
}

fn msg_ep(
    d: &Domain,
    wait: WaitMode,
    req: Option<&weft::ConnRequest>,
) -> (Endpoint, EventQueue, CompletionQueue) {
    let i = info(EpType::Msg, d.info().domain_attr.tls.as_ref());
    let ep = match req {
        Some(r) => d.accept_endpoint(&i, r).unwrap(),
        None => d.endpoint(&i).unwrap(),
    };
    let eq = d.fabric().eq(64).unwrap();
    let cq = d
        .cq(CqAttr {
            wait,
            ..CqAttr::default()
        })
        .unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.set_wait_mode(wait).unwrap();
    ep.enable().unwrap();
    (ep, eq, cq)
}

type Side = (Endpoint, EventQueue, CompletionQueue);

/// A connection from an endpoint of `d` to `l`, accepted by an endpoint
/// of `ld`.
async fn msg_connect(d: &Domain, ld: &Domain, l: &Listener, wait: WaitMode) -> (Side, Side) {
    let c = msg_ep(d, wait, None);
    let ep = c.0.clone();
    let dest = weft::encode_sockaddr(&l.addr);
    let connecting = tokio::spawn(async move { ep.connect(dest, b"hi".to_vec()).await });
    let ev = to(l.eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    assert_eq!(ev.cm_data, b"hi", "CM data through the session");
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let s = msg_ep(ld, wait, Some(&req));
    to(s.0.accept(b"yes".to_vec())).await.unwrap();
    assert_eq!(to(connecting).await.unwrap().unwrap(), b"yes");
    (c, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_carries_everything_over_tls_in_every_mode() {
    let pki = TestPki::new();
    let files = pki.issue("job");
    for (i, wait) in MODES.into_iter().enumerate() {
        let d = domain(Some(&files));
        let l = listener(&d, Some(&files));
        let ((c, _ceq, _ccq), (s, _seq, _scq)) = msg_connect(&d, &d, &l, wait).await;
        traffic(&c, FI_ADDR_UNSPEC, &s, &d, 30 + i as u64).await;
        traffic(&s, FI_ADDR_UNSPEC, &c, &d, 40 + i as u64).await;
        drop(l.pep);
    }
}

// ---- refusals ----

/// The next error entry of `eq`: `err`, naming a loopback peer.
async fn reported(eq: &EventQueue, err: Error) {
    let e = to(async {
        loop {
            match eq.read_err() {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    assert_eq!(e.err, err, "{e:?}");
    let peer = e
        .peer_addr
        .as_ref()
        .map(|a| weft::decode_sockaddr(a).unwrap());
    assert!(peer.is_some_and(|p| p.ip().is_loopback()), "{e:?}");
}

/// A send from `from` to `at` fails with `err`, both EQs report it, and
/// nothing is delivered.
async fn rdm_refused(from: &Ep, at: &Ep, err: Error) {
    let dest = handle(from, at.addr).await;
    let recv = at.ep.recv(BytesMut::zeroed(16));
    let sent = to(from.ep.send(dest, Bytes::from_static(b"refused"))).await;
    assert_eq!(sent.unwrap_err().err, err);
    reported(&from.eq, err).await;
    reported(&at.eq, err).await;
    let r = tokio::time::timeout(Duration::from_millis(200), recv).await;
    assert!(r.is_err(), "delivered: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_another_ca_is_refused_and_the_endpoint_serves_its_own() {
    let pki = TestPki::new();
    let (job, other) = (pki.issue("job"), pki.issue("other"));
    let (dj, dx) = (domain(Some(&job)), domain(Some(&other)));
    let (a, b) = (rdm(&dj, WaitMode::Interrupt), rdm(&dj, WaitMode::Interrupt));
    let x = rdm(&dx, WaitMode::Interrupt);
    rdm_refused(&x, &a, Error::KeyRejected).await;
    rdm_refused(&a, &x, Error::KeyRejected).await;
    let to_b = handle(&a, b.addr).await;
    one_message(&a.ep, to_b, &b.ep, 64, 1).await;
    // MSG: a listener refuses the other CA's connector before any
    // FI_CONNREQ, and still accepts its own.
    let l = listener(&dj, Some(&job));
    let (c, ceq, _ccq) = msg_ep(&dx, WaitMode::Interrupt, None);
    let r = to(c.connect(weft::encode_sockaddr(&l.addr), Vec::new())).await;
    assert_eq!(r.err(), Some(Error::KeyRejected));
    assert_eq!(
        to(ceq.next_timeout(T)).await.unwrap().unwrap_err().err,
        Error::KeyRejected
    );
    reported(&l.eq, Error::KeyRejected).await;
    assert!(l.eq.is_empty(), "no FI_CONNREQ from another CA");
    let ((c, ..), (s, ..)) = msg_connect(&dj, &dj, &l, WaitMode::Interrupt).await;
    one_message(&c, FI_ADDR_UNSPEC, &s, 64, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_plain_peers_refuse_each_other_both_ways() {
    let pki = TestPki::new();
    let job = pki.issue("job");
    let (dt, dp) = (domain(Some(&job)), domain(None));
    let (t1, t2) = (rdm(&dt, WaitMode::Interrupt), rdm(&dt, WaitMode::Interrupt));
    let p = rdm(&dp, WaitMode::Interrupt);
    rdm_refused(&t1, &p, Error::NoProtoOpt).await;
    rdm_refused(&p, &t1, Error::NoProtoOpt).await;
    let to_t2 = handle(&t1, t2.addr).await;
    one_message(&t1.ep, to_t2, &t2.ep, 64, 1).await;
    // MSG, both ways; each listener goes on serving its own kind.
    for (connector, ld, lfiles) in [(&dp, &dt, Some(&job)), (&dt, &dp, None)] {
        let l = listener(ld, lfiles);
        let (c, ceq, _ccq) = msg_ep(connector, WaitMode::Interrupt, None);
        let r = to(c.connect(weft::encode_sockaddr(&l.addr), Vec::new())).await;
        assert_eq!(r.err(), Some(Error::NoProtoOpt));
        assert_eq!(
            to(ceq.next_timeout(T)).await.unwrap().unwrap_err().err,
            Error::NoProtoOpt
        );
        reported(&l.eq, Error::NoProtoOpt).await;
        assert!(l.eq.is_empty(), "no FI_CONNREQ across kinds");
        let ((c, ..), (s, ..)) = msg_connect(ld, ld, &l, WaitMode::Interrupt).await;
        one_message(&c, FI_ADDR_UNSPEC, &s, 64, 3).await;
    }
}

/// The peer's end of `s` closes (EOF or reset) within the timeout.
async fn closed(mut s: TcpStream) {
    let mut b = [0u8; 256];
    to(async {
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_cut_records_after_the_connect_are_refused() {
    let pki = TestPki::new();
    let job = pki.issue("job");
    let d = domain(Some(&job));
    let short = ConnLimits::default().with_handshake_timeout(Duration::from_millis(300));
    let (a, b) = (
        rdm_with(&d, WaitMode::Interrupt, short),
        rdm(&d, WaitMode::Interrupt),
    );
    let l = listener(&d, Some(&job));
    for target in [a.addr, l.addr] {
        let mut s = to(TcpStream::connect(target)).await.unwrap();
        s.write_all(b"\x00\x01garbage that is not TLS\r\n")
            .await
            .unwrap();
        closed(s).await;
    }
    reported(&a.eq, Error::NoProtoOpt).await;
    reported(&l.eq, Error::NoProtoOpt).await;
    // A record header promising more than ever comes: the handshake
    // timeout ends it.
    let mut s = to(TcpStream::connect(a.addr)).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    closed(s).await;
    reported(&a.eq, Error::TimedOut).await;
    // The same, cut by the peer's close: dropped without a report.
    let mut s = to(TcpStream::connect(a.addr)).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    drop(s);
    // The endpoint and the listener go on serving their own peers.
    let to_a = handle(&b, a.addr).await;
    one_message(&b.ep, to_a, &a.ep, 64, 4).await;
    let ((c, ..), (s, ..)) = msg_connect(&d, &d, &l, WaitMode::Interrupt).await;
    one_message(&c, FI_ADDR_UNSPEC, &s, 64, 5).await;
    assert!(
        a.eq.read_err().is_err(),
        "no more reports: {:?}",
        a.eq.read_err()
    );
}

// ---- configuration ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_fail_the_call_that_creates_the_object() {
    let pki = TestPki::new();
    let good = pki.issue("job");
    let other = pki.issue("other");
    let junk = pki.write("junk.pem", "no PEM here\n");
    let missing = pki.path("missing.pem");
    let bad = [
        (TlsFiles::new(&missing, &good.key, &good.ca), Error::NoEnt),
        (TlsFiles::new(&good.cert, &junk, &good.ca), Error::Inval),
        (TlsFiles::new(&good.cert, &good.key, &junk), Error::Inval),
        (
            TlsFiles::new(&good.cert, &other.key, &good.ca),
            Error::Inval,
        ),
    ];
    let plain = domain(None);
    for (files, err) in bad {
        let i = info(EpType::Rdm, Some(&files));
        let fabric = weft::Fabric::open(&i).unwrap();
        assert_eq!(fabric.domain(&i).err(), Some(err), "domain {files:?}");
        // An endpoint whose attributes name files of its own.
        assert_eq!(plain.endpoint(&i).err(), Some(err), "endpoint {files:?}");
        let mi = info(EpType::Msg, Some(&files));
        assert_eq!(
            fabric.passive_endpoint(&mi, None).err(),
            Some(err),
            "passive endpoint {files:?}"
        );
    }
    // getinfo says which providers run TLS; hints asking for it match
    // only those.
    let mut h = Info::default();
    h.domain_attr.tls_capable = true;
    let offers = weft::getinfo(Some(&h)).unwrap();
    assert!(!offers.is_empty());
    for o in &offers {
        assert_eq!(o.fabric_attr.prov_name.as_deref(), Some("tcp"));
        assert!(weft::format_info(o, true).contains("tls_capable: 1"));
    }
}
