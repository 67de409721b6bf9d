//! The TCP provider against peers that do not follow the protocol, and
//! against well-behaved peers in the corners of the protocol (flow
//! control, simultaneous connects, busy-poll, transmit credits).
//!
//! Every attack is followed by a well-behaved exchange on the same
//! endpoint: a panic in a provider task would be swallowed by Tokio, so
//! "the endpoint still works" is the real check.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft::{
    AddressVector, AvAttr, CompletionQueue, Domain, EpType, FiAddr, Info, WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::wire::{FrameKind, Header, HEADER_LEN};
use weft_integration::identity::Identity;

mod connects;
mod flow;
mod msg_ep;
mod raw_peers;
mod wait_modes;

const T: Duration = Duration::from_secs(10);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    cq: CompletionQueue,
}

fn setup() -> (Domain, Info) {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED | weft::Caps::MSG;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    (domain, info)
}

fn open_with(domain: &Domain, info: &Info, wait: WaitMode) -> Ep {
    let av = domain.av(AvAttr::default()).unwrap();
    let (ep, cq) = weft_integration::enabled_endpoint(domain, info, &av, wait);
    Ep { ep, av, cq }
}

fn open(domain: &Domain, info: &Info) -> Ep {
    open_with(domain, info, WaitMode::Interrupt)
}

fn addr_of(from: &Ep, to: &Ep) -> FiAddr {
    from.av
        .insert_sync(&[to.ep.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0]
}

fn sockaddr(ep: &Ep) -> SocketAddr {
    weft::decode_sockaddr(&ep.ep.local_addr().unwrap()).unwrap()
}

/// A well-behaved tagged exchange from `good` to `victim`.
async fn assert_alive(victim: &Ep, good: &Ep, tag: u64) {
    let dest = addr_of(good, victim);
    let payload = Bytes::from(format!("still alive {tag}"));
    let recv = victim
        .ep
        .trecv(BytesMut::zeroed(256), FI_ADDR_UNSPEC, tag, 0);
    let send = good.ep.tsend(dest, payload.clone(), tag);
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.tag, tag);
    assert_eq!(&got.into_bytes()[..], &payload[..]);
}

/// A raw connection that has done the RDM handshake, claiming to be the
/// endpoint listening at a fresh address of its own (which confirms the
/// claim when the victim asks).
async fn hello(victim: SocketAddr) -> (TcpStream, Identity) {
    let ident = Identity::new().await.unwrap();
    let (s, status) = hello_as(victim, &ident).await;
    assert_eq!(status, 0);
    (s, ident)
}

/// The handshake claiming identity `ident`; returns the HelloAck status.
async fn hello_as(victim: SocketAddr, ident: &Identity) -> (TcpStream, u64) {
    let mut s = to(TcpStream::connect(victim)).await.unwrap();
    let payload = ident.hello_to(victim);
    let mut h = Header::new(FrameKind::Hello);
    h.len = payload.len() as u64;
    to(s.write_all(&h.encode())).await.unwrap();
    to(s.write_all(&payload)).await.unwrap();
    let mut ack = [0u8; HEADER_LEN];
    to(s.read_exact(&mut ack)).await.unwrap();
    let ack = weft_core::wire::decode(&ack, 0).unwrap();
    assert_eq!(ack.kind, Some(FrameKind::HelloAck));
    (s, ack.data)
}

/// Waits for the victim to drop the connection (EOF or reset).
async fn expect_closed(mut s: TcpStream) {
    let mut b = [0u8; 64];
    loop {
        match to(s.read(&mut b)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
