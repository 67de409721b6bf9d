//! Authorization keys on tcp (`docs/wire.md` §8.6, §10.1): endpoints
//! with a key complete connections only with peers that prove the same
//! key. Two "jobs" with different keys share one host: every cross-job
//! send or connect is refused with `FI_EKEYREJECTED` on both sides,
//! reported on both EQs with the peer's address, and nothing is delivered;
//! peers of one job work. Keyed and unkeyed endpoints refuse each other.
//! Raw peers that forge, replay or truncate the key-proof frames are
//! refused without harm to the endpoint's legitimate peers. Keys of the
//! wrong size are refused when the endpoint is created.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft::{
    AddressVector, AvAttr, AvFlags, BindFlags, CompletionQueue, CqAttr, Domain, EpType,
    EqEventKind, Error, EventQueue, FiAddr, Info, WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::auth::{AuthKey, ConnKind, Role, Transcript, MAX_KEY_LEN};
use weft_core::wire::auth::{decode_keyed_hello, encode_keyed_hello, Challenge};
use weft_core::wire::claim::{fresh_nonce, Claim};
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};
use weft_integration::identity::Identity;

const T: Duration = Duration::from_secs(10);
const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

fn hints(ep_type: EpType) -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = ep_type;
    h.caps = weft::Caps::MSG | weft::Caps::TAGGED;
    h.fabric_attr.prov_name = Some("tcp".into());
    h
}

fn info(ep_type: EpType, key: Option<&[u8]>) -> Info {
    let mut h = hints(ep_type);
    h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
    let i = weft::getinfo(Some(&h)).unwrap().remove(0);
    assert_eq!(i.ep_attr.auth_key.as_deref(), key, "the hint's key");
    i
}

fn domain(domain_key: Option<&[u8]>) -> Domain {
    let mut i = info(EpType::Rdm, None);
    i.domain_attr.auth_key = domain_key.map(<[u8]>::to_vec);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    eq: EventQueue,
    addr: SocketAddr,
}

fn open(domain: &Domain, key: Option<&[u8]>) -> Ep {
    let eq = domain.fabric().eq(64).unwrap();
    let av = domain.av(AvAttr::default()).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    let ep = domain.endpoint(&info(EpType::Rdm, key)).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.set_wait_mode(WaitMode::Interrupt).unwrap();
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

/// `n` tagged messages from `from` to `to_ep`, each received there.
async fn exchange(from: &Ep, to_ep: &Ep, n: u64) {
    let dest = handle(from, to_ep.addr).await;
    for i in 0..n {
        let recv = to_ep.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, i, 0);
        let send = from
            .ep
            .tsend(dest, Bytes::from(i.to_le_bytes().to_vec()), i);
        let (got, sent) = to(async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], &i.to_le_bytes());
    }
}

/// The next refusal on `eq`: `err`, naming `peer`.
async fn reported(eq: &EventQueue, err: Error, peer: SocketAddr) {
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
    let got = e
        .peer_addr
        .as_ref()
        .map(|a| weft::decode_sockaddr(a).unwrap());
    assert_eq!(got, Some(peer));
}

/// A send from `from` to `to_ep` fails with `KeyRejected`, nothing reaches
/// `to_ep`, and both EQs report the refusal with the other's address.
async fn refused_both_ways(from: &Ep, to_ep: &Ep) {
    let dest = handle(from, to_ep.addr).await;
    let recv = to_ep.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 77, 0);
    let sent = to(from.ep.tsend(dest, Bytes::from_static(b"cross-job"), 77)).await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    reported(&from.eq, Error::KeyRejected, to_ep.addr).await;
    reported(&to_ep.eq, Error::KeyRejected, from.addr).await;
    // Nothing was delivered: the posted receive is still waiting.
    let r = tokio::time::timeout(Duration::from_millis(200), recv).await;
    assert!(r.is_err(), "delivered across jobs: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_jobs_with_different_keys_stay_apart() {
    let d = domain(None);
    let (a1, a2) = (open(&d, Some(JOB_A)), open(&d, Some(JOB_A)));
    let (b1, b2) = (open(&d, Some(JOB_B)), open(&d, Some(JOB_B)));
    exchange(&a1, &a2, 3).await;
    exchange(&b1, &b2, 3).await;
    refused_both_ways(&a1, &b1).await;
    refused_both_ways(&b2, &a2).await;
    // Each job goes on working, both ways.
    exchange(&a2, &a1, 3).await;
    exchange(&b2, &b1, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_keyed_and_unkeyed_refuse_each_other() {
    let d = domain(None);
    let (keyed, plain) = (open(&d, Some(JOB_A)), open(&d, None));
    refused_both_ways(&keyed, &plain).await;
    refused_both_ways(&plain, &keyed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_domain_key_is_the_default_and_an_endpoint_key_overrides_it() {
    let d = domain(Some(JOB_A));
    let inherits = open(&d, None);
    assert_eq!(inherits.ep.info().ep_attr.auth_key.as_deref(), Some(JOB_A));
    let other = domain(None);
    let explicit = open(&other, Some(JOB_A));
    exchange(&inherits, &explicit, 2).await;
    let overrides = open(&d, Some(JOB_B));
    refused_both_ways(&overrides, &explicit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_the_wrong_size_are_refused() {
    let d = domain(None);
    let mut i = info(EpType::Rdm, None);
    for bad in [Vec::new(), vec![7u8; MAX_KEY_LEN + 1]] {
        i.ep_attr.auth_key = Some(bad.clone());
        assert_eq!(d.endpoint(&i).err(), Some(Error::Inval));
        let mut h = hints(EpType::Rdm);
        h.ep_attr.auth_key = Some(bad.clone());
        assert_eq!(weft::getinfo(Some(&h)).err(), Some(Error::NoData));
        let mut di = info(EpType::Rdm, None);
        di.domain_attr.auth_key = Some(bad.clone());
        let fabric = weft::Fabric::open(&di).unwrap();
        assert_eq!(fabric.domain(&di).err(), Some(Error::Inval));
        let mut pi = info(EpType::Msg, None);
        pi.ep_attr.auth_key = Some(bad);
        assert_eq!(fabric.passive_endpoint(&pi, None).err(), Some(Error::Inval));
    }
    i.ep_attr.auth_key = Some(vec![1; MAX_KEY_LEN]);
    assert!(d.endpoint(&i).is_ok());
    i.ep_attr.auth_key = Some(vec![1]);
    assert!(d.endpoint(&i).is_ok());
}

// ---- MSG ----

struct Listener {
    pep: weft::PassiveEndpoint,
    eq: EventQueue,
    addr: SocketAddr,
}

fn listener(fabric: &weft::Fabric, key: Option<&[u8]>) -> Listener {
    let pep = fabric
        .passive_endpoint(&info(EpType::Msg, key), None)
        .unwrap();
    let eq = fabric.eq(64).unwrap();
    pep.bind_eq(&eq).unwrap();
    pep.listen().unwrap();
    let addr = weft::decode_sockaddr(&pep.local_addr().unwrap()).unwrap();
    Listener { pep, eq, addr }
}

fn msg_ep(
    d: &Domain,
    key: Option<&[u8]>,
    req: Option<&weft::ConnRequest>,
) -> (weft::Endpoint, EventQueue, CompletionQueue) {
    let i = info(EpType::Msg, key);
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
    (ep, eq, cq)
}

/// A connect from an endpoint holding `key` to `l` succeeds, and the
/// connection carries a message.
async fn msg_connects(d: &Domain, l: &Listener, key: Option<&[u8]>) {
    let (c, _ceq, _ccq) = msg_ep(d, key, None);
    let c2 = c.clone();
    let dest = weft::encode_sockaddr(&l.addr);
    let connecting = tokio::spawn(async move { c2.connect(dest, b"hi".to_vec()).await });
    let ev = to(l.eq.next_timeout(T)).await.unwrap().unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    assert_eq!(ev.cm_data, b"hi", "the CM data after the key proof");
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let (s, _seq, _scq) = msg_ep(d, None, Some(&req));
    to(s.accept(Vec::new())).await.unwrap();
    to(connecting).await.unwrap().unwrap();
    let recv = s.recv(BytesMut::zeroed(8));
    let send = c.send(FI_ADDR_UNSPEC, Bytes::from_static(b"same"));
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"same");
}

/// A connect from an endpoint holding `key` to `l` fails with
/// `KeyRejected` on both sides; the listener reports no request.
async fn msg_refused(d: &Domain, l: &Listener, key: Option<&[u8]>) {
    let (c, ceq, _ccq) = msg_ep(d, key, None);
    let r = to(c.connect(weft::encode_sockaddr(&l.addr), b"hi".to_vec())).await;
    assert_eq!(r.err(), Some(Error::KeyRejected));
    let e = to(ceq.next_timeout(T)).await.unwrap().unwrap_err();
    assert_eq!(e.err, Error::KeyRejected);
    let e = to(l.eq.next_timeout(T)).await.unwrap().unwrap_err();
    assert_eq!(e.err, Error::KeyRejected);
    assert!(e.peer_addr.is_some());
    assert!(l.eq.is_empty(), "no FI_CONNREQ for a refused key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_jobs_with_different_keys_stay_apart() {
    let d = domain(None);
    let la = listener(d.fabric(), Some(JOB_A));
    let plain = listener(d.fabric(), None);
    msg_connects(&d, &la, Some(JOB_A)).await;
    msg_refused(&d, &la, Some(JOB_B)).await;
    msg_refused(&d, &la, None).await;
    msg_refused(&d, &plain, Some(JOB_A)).await;
    msg_connects(&d, &plain, None).await;
    // The listener still serves its own job.
    msg_connects(&d, &la, Some(JOB_A)).await;
    drop((la.pep, plain.pep));
}

// ---- raw peers ----

async fn send_frame(s: &mut TcpStream, kind: FrameKind, data: u64, payload: &[u8]) {
    let mut h = Header::new(kind);
    h.data = data;
    h.len = payload.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(payload)).await.unwrap();
}

async fn recv_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut b = [0u8; HEADER_LEN];
    to(s.read_exact(&mut b)).await.unwrap();
    let h = wire::decode(&b, 0).unwrap();
    let mut p = vec![0u8; h.len as usize];
    to(s.read_exact(&mut p)).await.unwrap();
    (h, p)
}

/// `id`'s `KeyedHello` payload to `victim`, selecting `key`.
fn keyed_hello(id: &Identity, victim: SocketAddr, key: &[u8]) -> Vec<u8> {
    let claim = Claim::decode(&id.hello_to(victim)).unwrap();
    let sel = AuthKey::new(key).unwrap().selector(&claim.nonce).unwrap();
    encode_keyed_hello(&claim, &sel)
}

/// Opens a keyed handshake to `victim` as `id`: the stream, the
/// transcript (with the victim's nonce) and the challenge's MAC.
async fn challenged(
    id: &Identity,
    victim: SocketAddr,
) -> (TcpStream, Vec<u8>, Transcript, [u8; 32]) {
    let mut s = to(TcpStream::connect(victim)).await.unwrap();
    let hello = keyed_hello(id, victim, JOB_A);
    send_frame(&mut s, FrameKind::KeyedHello, 0, &hello).await;
    let (h, p) = recv_frame(&mut s).await;
    assert_eq!(h.kind, Some(FrameKind::KeyChallenge));
    let c = Challenge::decode(&p).unwrap();
    let tr = Transcript {
        kind: ConnKind::Rdm,
        connector_nonce: decode_keyed_hello(&hello).unwrap().0.nonce,
        acceptor_nonce: c.nonce,
        connector: id.addr(),
        acceptor: victim,
    };
    (s, hello, tr, c.mac)
}

/// The victim answers `HelloAck` `KeyRejected`, reports it with `id`'s
/// address, and sends nothing more.
async fn refused_raw(mut s: TcpStream, victim: &Ep, id: &Identity) {
    let (h, _) = recv_frame(&mut s).await;
    assert_eq!(h.kind, Some(FrameKind::HelloAck));
    assert_eq!(h.data, Error::KeyRejected.code() as u64);
    reported(&victim.eq, Error::KeyRejected, id.addr()).await;
    let mut b = [0u8; 64];
    if let Ok(n @ 1..) = to(s.read(&mut b)).await {
        panic!("the refused peer was sent {n} more bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_truncated_proofs_are_refused_without_harm() {
    let d = domain(None);
    let (victim, friend) = (open(&d, Some(JOB_A)), open(&d, Some(JOB_A)));
    let key = AuthKey::new(JOB_A).unwrap();
    let id = Identity::new().await.unwrap();

    // The acceptor's MAC is the one the key gives for this transcript.
    let (s, _, tr, mac) = challenged(&id, victim.addr).await;
    key.verify(&tr, Role::Acceptor, &mac).unwrap();
    drop(s);
    reported(&victim.eq, Error::KeyRejected, id.addr()).await;

    // Forged: a MAC made without the key.
    let (mut s, _, _, _) = challenged(&id, victim.addr).await;
    send_frame(
        &mut s,
        FrameKind::KeyProof,
        0,
        &fresh_nonce().unwrap().repeat(2),
    )
    .await;
    refused_raw(s, &victim, &id).await;

    // Reflected: the victim's own MAC sent back as the connector's.
    let (mut s, _, _, mac) = challenged(&id, victim.addr).await;
    send_frame(&mut s, FrameKind::KeyProof, 0, &mac).await;
    refused_raw(s, &victim, &id).await;

    // A proof made with the key is accepted once ...
    let (mut s, hello, tr, _) = challenged(&id, victim.addr).await;
    let proof = key.prove(&tr, Role::Connector).unwrap();
    send_frame(&mut s, FrameKind::KeyProof, 0, &proof).await;
    let (h, _) = recv_frame(&mut s).await;
    assert_eq!((h.kind, h.data), (Some(FrameKind::HelloAck), 0));
    drop(s);
    // ... and replayed on a new connection (same hello, same proof) it
    // is refused: the victim chose a new nonce.
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    send_frame(&mut s, FrameKind::KeyedHello, 0, &hello).await;
    let (h, _) = recv_frame(&mut s).await;
    assert_eq!(h.kind, Some(FrameKind::KeyChallenge));
    send_frame(&mut s, FrameKind::KeyProof, 0, &proof).await;
    refused_raw(s, &victim, &id).await;

    // Truncated: the proof's header promises 32 bytes, 10 come.
    let (mut s, _, tr, _) = challenged(&id, victim.addr).await;
    let proof = key.prove(&tr, Role::Connector).unwrap();
    let mut h = Header::new(FrameKind::KeyProof);
    h.len = 32;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(&proof[..10])).await.unwrap();
    s.shutdown().await.unwrap();
    refused_raw(s, &victim, &id).await;

    // A short proof frame (a valid header of 31 bytes).
    let (mut s, _, tr, _) = challenged(&id, victim.addr).await;
    let proof = key.prove(&tr, Role::Connector).unwrap();
    send_frame(&mut s, FrameKind::KeyProof, 0, &proof[..31]).await;
    refused_raw(s, &victim, &id).await;

    // A selector for another key: refused before anything is proven.
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    let other = keyed_hello(&id, victim.addr, JOB_B);
    send_frame(&mut s, FrameKind::KeyedHello, 0, &other).await;
    refused_raw(s, &victim, &id).await;
    // A keyed hello without its selector.
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    let hello = keyed_hello(&id, victim.addr, JOB_A);
    send_frame(&mut s, FrameKind::KeyedHello, 0, &hello[..hello.len() - 16]).await;
    let mut b = [0u8; 64];
    assert!(
        matches!(to(s.read(&mut b)).await, Ok(0) | Err(_)),
        "closed without an answer"
    );

    // A plain Hello to a keyed endpoint.
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    send_frame(&mut s, FrameKind::Hello, 0, &id.hello_to(victim.addr)).await;
    refused_raw(s, &victim, &id).await;

    // The victim kept serving its own job throughout.
    exchange(&friend, &victim, 2).await;
    exchange(&victim, &friend, 2).await;
}

/// A raw "acceptor" that answers a keyed endpoint's `KeyedHello` with
/// `challenge(payload of the hello)`; the keyed endpoint's send fails
/// with `KeyRejected`, it reports that address, and it refuses with
/// `KeyProof` `FI_EKEYREJECTED` rather than prove anything.
async fn connector_refuses(ep: &Ep, challenge: impl Fn(&[u8]) -> Vec<u8> + Send + 'static) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let raw = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let (h, hello) = recv_frame(&mut s).await;
        assert_eq!(h.kind, Some(FrameKind::KeyedHello));
        send_frame(&mut s, FrameKind::KeyChallenge, 0, &challenge(&hello)).await;
        let mut b = [0u8; HEADER_LEN];
        to(s.read_exact(&mut b)).await.unwrap();
        wire::decode(&b, 0).unwrap()
    });
    let dest = handle(ep, addr).await;
    let sent = to(ep.ep.tsend(dest, Bytes::from_static(b"secret"), 1)).await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    reported(&ep.eq, Error::KeyRejected, addr).await;
    let answer = to(raw).await.unwrap();
    assert_eq!(answer.kind, Some(FrameKind::KeyProof));
    assert_eq!(answer.data, Error::KeyRejected.code() as u64);
    assert_eq!(answer.len, 0, "no MAC for an acceptor that proved nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_refuses_forged_and_replayed_challenges() {
    let d = domain(None);
    let (ep, friend) = (open(&d, Some(JOB_A)), open(&d, Some(JOB_A)));
    // Random bytes for a MAC.
    connector_refuses(&ep, |_| {
        let mut c = fresh_nonce().unwrap().to_vec();
        c.extend_from_slice(&fresh_nonce().unwrap().repeat(2));
        c
    })
    .await;
    // A MAC made with the key for another transcript (a replay from
    // another connection: another connector nonce).
    let key = AuthKey::new(JOB_A).unwrap();
    let from = ep.addr;
    connector_refuses(&ep, move |_hello| {
        let tr = Transcript {
            kind: ConnKind::Rdm,
            connector_nonce: [9; 16],
            acceptor_nonce: [8; 16],
            connector: from,
            acceptor: from,
        };
        Challenge {
            nonce: [8; 16],
            mac: key.prove(&tr, Role::Acceptor).unwrap(),
        }
        .encode()
        .to_vec()
    })
    .await;
    // Truncated: a challenge one byte short.
    connector_refuses(&ep, |_| vec![0; 47]).await;
    exchange(&ep, &friend, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_peers_connect_simultaneously_and_to_themselves() {
    let d = domain(None);
    for _ in 0..3 {
        let (a, b) = (open(&d, Some(JOB_A)), open(&d, Some(JOB_A)));
        // Both connect at once: one connection survives (docs/wire.md §8.3).
        tokio::join!(exchange(&a, &b, 2), exchange(&b, &a, 2));
        exchange(&a, &a, 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_forged_proofs_and_challenges_are_refused_without_harm() {
    let d = domain(None);
    let l = listener(d.fabric(), Some(JOB_A));
    let key = AuthKey::new(JOB_A).unwrap();

    // A raw active side that answers the challenge with a forged MAC, then
    // one that replays a proof made for an earlier challenge.
    let mut old_proof = None;
    for forge in [true, false] {
        let mut s = to(TcpStream::connect(l.addr)).await.unwrap();
        let nonce = fresh_nonce().unwrap();
        let sel = key.selector(&nonce).unwrap();
        let req = weft_core::wire::auth::encode_conn_req(&nonce, &sel, b"cm");
        send_frame(&mut s, FrameKind::KeyedConnReq, 0, &req).await;
        let (h, p) = recv_frame(&mut s).await;
        assert_eq!(h.kind, Some(FrameKind::KeyChallenge));
        let c = Challenge::decode(&p).unwrap();
        let tr = Transcript {
            kind: ConnKind::Msg,
            connector_nonce: nonce,
            acceptor_nonce: c.nonce,
            connector: s.local_addr().unwrap(),
            acceptor: l.addr,
        };
        key.verify(&tr, Role::Acceptor, &c.mac).unwrap();
        let proof = match (forge, old_proof) {
            (true, _) => {
                // Keep a good proof for the replay below, send a forged one.
                old_proof = Some(key.prove(&tr, Role::Connector).unwrap());
                fresh_nonce().unwrap().repeat(2)
            }
            (false, Some(p)) => p.to_vec(),
            (false, None) => unreachable!(),
        };
        send_frame(&mut s, FrameKind::KeyProof, 0, &proof).await;
        let (h, p) = recv_frame(&mut s).await;
        assert_eq!((h.kind, h.data), (Some(FrameKind::ConnResp), 129));
        assert!(p.is_empty());
        let e = to(l.eq.next_timeout(T)).await.unwrap().unwrap_err();
        assert_eq!(e.err, Error::KeyRejected);
        let peer = weft::decode_sockaddr(e.peer_addr.as_ref().unwrap()).unwrap();
        assert_eq!(peer, s.local_addr().unwrap());
        assert!(l.eq.is_empty(), "no FI_CONNREQ for a forged proof");
    }

    // A raw listener whose challenge carries a MAC made without the key:
    // the active endpoint refuses it and proves nothing.
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_addr = raw.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = raw.accept().await.unwrap();
        let (h, _) = recv_frame(&mut s).await;
        assert_eq!(h.kind, Some(FrameKind::KeyedConnReq));
        let c = Challenge {
            nonce: fresh_nonce().unwrap(),
            mac: [0x42; 32],
        };
        send_frame(&mut s, FrameKind::KeyChallenge, 0, &c.encode()).await;
        recv_frame(&mut s).await
    });
    let (c, ceq, _ccq) = msg_ep(&d, Some(JOB_A), None);
    let r = to(c.connect(weft::encode_sockaddr(&raw_addr), Vec::new())).await;
    assert_eq!(r.err(), Some(Error::KeyRejected));
    assert_eq!(
        to(ceq.next_timeout(T)).await.unwrap().unwrap_err().err,
        Error::KeyRejected
    );
    let (h, p) = to(server).await.unwrap();
    assert_eq!((h.kind, h.data), (Some(FrameKind::KeyProof), 129));
    assert!(p.is_empty());

    // The listener still serves its own job.
    msg_connects(&d, &l, Some(JOB_A)).await;
}
