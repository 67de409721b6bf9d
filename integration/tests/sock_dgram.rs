//! `FI_EP_SOCK_DGRAM` on udp: the payload alone on the wire, so a plain
//! UDP socket is a peer both ways; the endpoint as a `Stream` and a `Sink`
//! of datagrams; sources through the AV; the documented refusals.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use weft::{AvAttr, Caps, EpType, Error, Info, SockDgram, WaitMode, FI_ADDR_NOTAVAIL};

struct Ep {
    ep: weft::Endpoint,
    av: weft::AddressVector,
    _cq: weft::CompletionQueue,
    _d: weft::Domain,
}

fn info() -> Info {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::SockDgram;
    hints.fabric_attr.prov_name = Some("udp".into());
    // Loopback comes first.
    weft::getinfo(Some(&hints))
        .expect("udp offers FI_EP_SOCK_DGRAM")
        .remove(0)
}

fn open(info: &Info) -> Ep {
    let f = weft::Fabric::open(info).unwrap();
    let d = f.domain(info).unwrap();
    let av = d.av(AvAttr::default()).unwrap();
    let (ep, cq) = weft_integration::enabled_endpoint(&d, info, &av, WaitMode::Interrupt);
    Ep {
        ep,
        av,
        _cq: cq,
        _d: d,
    }
}

fn sockaddr(ep: &weft::Endpoint) -> std::net::SocketAddr {
    weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap()
}

fn insert(av: &weft::AddressVector, a: std::net::SocketAddr) -> u64 {
    av.insert_sync(&[weft::encode_sockaddr(&a)], Default::default())
        .unwrap()
        .fi_addrs[0]
}

async fn next(d: &mut SockDgram) -> weft::Datagram {
    tokio::time::timeout(Duration::from_secs(10), d.next())
        .await
        .expect("a datagram")
        .expect("the stream goes on")
        .expect("received")
}

/// A plain UDP socket and a SOCK_DGRAM endpoint exchange payloads, byte
/// for byte, with no header either way; the socket's datagrams come with
/// its AV handle as their source, an unknown sender's with
/// `FI_ADDR_NOTAVAIL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_udp_sockets_are_peers() {
    let info = info();
    assert!(!info.caps.intersects(Caps::TAGGED | Caps::REMOTE_CQ_DATA));
    let a = open(&info);
    let mut dg = a.ep.datagrams().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let h = insert(&a.av, sock.local_addr().unwrap());
    let here = sockaddr(&a.ep);

    dg.send((h, Bytes::from_static(b"hello, socket")))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello, socket", "the payload alone");
    assert_eq!(from.port(), here.port());

    sock.send_to(b"hello, weft", here).unwrap();
    let got = next(&mut dg).await;
    assert_eq!(&got.data[..], b"hello, weft");
    assert_eq!(got.src, h);

    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.send_to(b"who am I", here).unwrap();
    let got = next(&mut dg).await;
    assert_eq!(&got.data[..], b"who am I");
    assert_eq!(got.src, FI_ADDR_NOTAVAIL);

    // Empty datagrams are datagrams too.
    sock.send_to(b"", here).unwrap();
    assert!(next(&mut dg).await.data.is_empty());
}

/// Two endpoints through their `Stream`s and `Sink`s: 200 datagrams of
/// up to 1,000 bytes each way, every one intact (loopback loses none at
/// this rate; the set is compared, UDP promising no order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_and_sink_between_endpoints() {
    let info = info();
    let (a, b) = (open(&info), open(&info));
    let b_in_a = insert(&a.av, sockaddr(&b.ep));
    let a_in_b = insert(&b.av, sockaddr(&a.ep));
    let (mut da, mut db) = (a.ep.datagrams().unwrap(), b.ep.datagrams().unwrap());
    exchange(&mut da, &mut db, b_in_a, a_in_b).await;
    exchange(&mut db, &mut da, a_in_b, b_in_a).await;
}

async fn exchange(from: &mut SockDgram, to: &mut SockDgram, dest: u64, from_in_to: u64) {
    let payload = |i: u32| Bytes::from(vec![(i % 251) as u8; (i as usize * 13) % 1000]);
    let mut sent = BTreeSet::new();
    let mut got = BTreeSet::new();
    for i in 0..200u32 {
        from.send((dest, payload(i))).await.unwrap();
        sent.insert(payload(i).to_vec());
        let d = next(to).await;
        assert_eq!(d.src, from_in_to);
        got.insert(d.data.to_vec());
    }
    assert_eq!(got, sent);
}

/// The refusals: a payload over the largest datagram is `MsgSize`, tagged
/// sends are `NoSys` (nothing but the payload can go), and only
/// SOCK_DGRAM endpoints have datagram streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_socket_datagram_is_not() {
    let info = info();
    let a = open(&info);
    let h = insert(&a.av, sockaddr(&a.ep));
    let max = info.ep_attr.max_msg_size;
    let e =
        a.ep.send(h, Bytes::from(vec![0u8; max + 1]))
            .await
            .unwrap_err();
    assert_eq!(e.err, Error::MsgSize);
    let e =
        a.ep.tsend(h, Bytes::from_static(b"t"), 7)
            .await
            .unwrap_err();
    assert_eq!(e.err, Error::NoSys);
    // The largest one goes, to itself.
    let mut dg = a.ep.datagrams().unwrap();
    dg.send((h, Bytes::from(vec![9u8; max]))).await.unwrap();
    assert_eq!(next(&mut dg).await.data.len(), max);

    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Dgram;
    hints.fabric_attr.prov_name = Some("udp".into());
    let dgram = open(&weft::getinfo(Some(&hints)).unwrap().remove(0));
    assert_eq!(dgram.ep.datagrams().unwrap_err(), Error::NoSys);

    // Without an AV there is nowhere to send and no source to name.
    let f = weft::Fabric::open(&info).unwrap();
    let d = f.domain(&info).unwrap();
    let ep = d.endpoint(&info).unwrap();
    let cq = d.cq(weft::CqAttr::default()).unwrap();
    ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::NoAv);
    assert!(ep.datagrams().is_err(), "no datagrams before enable");
}
