//! Verified identities on tcp RDM (`docs/wire.md` §8.2): a connecting
//! peer is known by the listening address it claims only once that
//! address confirms the claim. Impostors — a process claiming another
//! endpoint's address, claiming the victim's own, replaying a nonce it
//! learnt by being dialled, or naming an address where nothing answers —
//! are refused with `FI_EACCES`, reported on the EQ with the address they
//! claimed, and receive nothing; the real owner of the address keeps
//! working throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft::{
    AddressVector, AvAttr, AvFlags, BindFlags, CompletionQueue, CqAttr, Domain, EpType, Error,
    EventQueue, FiAddr, Info, WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::wire::claim::{fresh_nonce, Claim};
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};
use weft_integration::identity::Identity;

const T: Duration = Duration::from_secs(10);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    eq: EventQueue,
    addr: SocketAddr,
}

fn open(domain: &Domain, info: &Info) -> Ep {
    let eq = domain.fabric().eq(64).unwrap();
    let av = domain.av(AvAttr::default()).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    let ep = domain.endpoint(info).unwrap();
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

fn pair() -> (Ep, Ep) {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED | weft::Caps::SOURCE;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    (open(&domain, &info), open(&domain, &info))
}

async fn handle(from: &Ep, of: SocketAddr) -> FiAddr {
    let bytes = weft::encode_sockaddr(&of);
    to(from.av.insert(&[bytes], AvFlags::empty(), 0).unwrap())
        .await
        .fi_addrs[0]
}

/// Sends a `Hello` with `payload` to `victim`; the `HelloAck` status and
/// the connection.
async fn claim(victim: SocketAddr, payload: &[u8]) -> (u64, TcpStream) {
    let mut s = to(TcpStream::connect(victim)).await.unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.len = payload.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(payload)).await.unwrap();
    let mut ack = [0u8; HEADER_LEN];
    to(s.read_exact(&mut ack)).await.unwrap();
    let ack = wire::decode(&ack, 0).unwrap();
    assert_eq!(ack.kind, Some(FrameKind::HelloAck));
    (ack.data, s)
}

/// The refusal the victim reported for a claim of `claimed`.
async fn reported(victim: &Ep, claimed: SocketAddr) {
    let e = to(async {
        loop {
            match victim.eq.read_err() {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    assert_eq!(e.err, Error::Access, "{e:?}");
    let peer = e
        .peer_addr
        .as_ref()
        .map(|a| weft::decode_sockaddr(a).unwrap());
    assert_eq!(peer, Some(claimed));
}

/// The victim closes `s` without sending anything more on it.
async fn nothing_then_closed(mut s: TcpStream) {
    let mut b = [0u8; 256];
    if let Ok(n @ 1..) = to(s.read(&mut b)).await {
        panic!("the impostor was sent {n} bytes");
    }
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

fn refused(status: u64) {
    assert_eq!(status, Error::Access.code() as u64, "HelloAck status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_of_another_endpoint_is_refused_and_gets_nothing() {
    let (victim, good) = pair();
    let impostor = Identity::new().await.unwrap();
    let (st, s) = claim(victim.addr, &impostor.claim_as(good.addr, victim.addr)).await;
    refused(st);
    reported(&victim, good.addr).await;
    // What the victim sends to that address reaches its real owner.
    exchange(&victim, &good, 5).await;
    exchange(&good, &victim, 5).await;
    nothing_then_closed(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_a_connected_peers_address_leaves_it_connected() {
    let (victim, good) = pair();
    exchange(&good, &victim, 3).await;
    let before = victim.ep.stats().unwrap().conns;
    let impostor = Identity::new().await.unwrap();
    for _ in 0..3 {
        let (st, s) = claim(victim.addr, &impostor.claim_as(good.addr, victim.addr)).await;
        refused(st);
        nothing_then_closed(s).await;
    }
    // The victim's own check of the last claim (its connection to the
    // claimed address) may still be closing: wait for it, up to 2 s.
    let mut conns = victim.ep.stats().unwrap().conns;
    for _ in 0..200 {
        if conns == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        conns = victim.ep.stats().unwrap().conns;
    }
    assert_eq!(conns, before, "no connection replaced");
    exchange(&good, &victim, 3).await;
    exchange(&victim, &good, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_the_victims_own_address_is_refused() {
    let (victim, _good) = pair();
    let impostor = Identity::new().await.unwrap();
    let (st, s) = claim(victim.addr, &impostor.claim_as(victim.addr, victim.addr)).await;
    refused(st);
    reported(&victim, victim.addr).await;
    nothing_then_closed(s).await;
    // Sends to itself still work (its own claims confirm themselves).
    exchange(&victim, &victim, 2).await;
}

/// A peer the victim dials learns the victim's nonce; it cannot use it to
/// pass for the victim elsewhere: the victim confirms a nonce only to the
/// address it sent it to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonce_learnt_by_being_dialled_cannot_be_replayed() {
    let (victim, good) = pair();
    let snoop = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let snoop_addr = snoop.local_addr().unwrap();
    let to_snoop = handle(&victim, snoop_addr).await;
    victim
        .ep
        .post_tsend(to_snoop, Bytes::from_static(b"x"), 0, 1)
        .unwrap();
    let (mut s, _) = to(snoop.accept()).await.unwrap();
    let mut hb = [0u8; HEADER_LEN];
    to(s.read_exact(&mut hb)).await.unwrap();
    let h = wire::decode(&hb, 0).unwrap();
    assert_eq!(h.kind, Some(FrameKind::Hello));
    let mut p = vec![0u8; h.len as usize];
    to(s.read_exact(&mut p)).await.unwrap();
    let learnt = Claim::decode(&p).unwrap();
    assert_eq!(learnt.addr, victim.addr);
    // The replay, to another endpoint, while the victim's own handshake
    // with the snoop is still open (its nonce still live).
    let (st, replay) = claim(good.addr, &learnt.encode()).await;
    refused(st);
    reported(&good, victim.addr).await;
    nothing_then_closed(replay).await;
    exchange(&good, &victim, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_nothing_confirms_is_refused() {
    let (victim, good) = pair();
    // An address where nothing listens any more.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_addr = gone.local_addr().unwrap();
    drop(gone);
    let nonce = fresh_nonce().unwrap();
    let payload = Claim {
        addr: gone_addr,
        nonce,
    }
    .encode();
    let (st, s) = claim(victim.addr, &payload).await;
    refused(st);
    reported(&victim, gone_addr).await;
    nothing_then_closed(s).await;
    // A claim in the old format (no nonce) is not a claim at all.
    let old = weft::encode_sockaddr(&good.addr);
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    let mut h = Header::new(FrameKind::Hello);
    h.len = old.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(&old)).await.unwrap();
    nothing_then_closed(s).await;
    exchange(&good, &victim, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_for_a_nonce_never_sent_is_refused() {
    let (victim, good) = pair();
    let ask = Claim {
        addr: good.addr,
        nonce: fresh_nonce().unwrap(),
    }
    .encode();
    let mut s = to(TcpStream::connect(victim.addr)).await.unwrap();
    let mut h = Header::new(FrameKind::Verify);
    h.len = ask.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(&ask)).await.unwrap();
    let mut ack = [0u8; HEADER_LEN];
    to(s.read_exact(&mut ack)).await.unwrap();
    let ack = wire::decode(&ack, 0).unwrap();
    assert_eq!(ack.kind, Some(FrameKind::VerifyAck));
    assert_eq!(ack.data, Error::Access.code() as u64);
    exchange(&good, &victim, 2).await;
}
