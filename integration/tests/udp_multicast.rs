//! IP multicast on udp (`FI_MULTICAST`, `fi_join`), on loopback: members
//! receive what is sent to the group's address, with the sender as the
//! source; `FI_JOIN_COMPLETE` names the handle; leaving stops delivery;
//! addresses that are not groups are refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, Caps, EpType, EqEventKind, Error, Info, WaitMode};

struct Ep {
    ep: weft::Endpoint,
    av: weft::AddressVector,
    eq: weft::EventQueue,
    _cq: weft::CompletionQueue,
}

fn info(ep_type: EpType) -> Info {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = ep_type;
    hints.caps = Caps::MSG | Caps::MULTICAST | Caps::SOURCE;
    hints.fabric_attr.prov_name = Some("udp".into());
    // Loopback first.
    weft::getinfo(Some(&hints))
        .expect("udp offers FI_MULTICAST")
        .remove(0)
}

fn open(info: &Info, wait: WaitMode) -> Ep {
    let f = weft::Fabric::open(info).unwrap();
    let d = f.domain(info).unwrap();
    let av = d.av(AvAttr::default()).unwrap();
    let eq = f.eq(8).unwrap();
    let ep = d.endpoint(info).unwrap();
    ep.bind_eq(&eq).unwrap();
    let cq = d
        .cq(weft::CqAttr {
            wait,
            ..Default::default()
        })
        .unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();
    Ep {
        ep,
        av,
        eq,
        _cq: cq,
    }
}

/// A group address of its own per test: a free port on 239.255.x.y.
fn group(last: u8) -> SocketAddr {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    SocketAddr::from((Ipv4Addr::new(239, 255, 77, last), port))
}

fn raw(a: SocketAddr) -> Vec<u8> {
    weft::encode_sockaddr(&a)
}

async fn recv(ep: &weft::Endpoint) -> weft::CqEntry {
    tokio::time::timeout(Duration::from_secs(10), ep.recv(BytesMut::zeroed(64)))
        .await
        .expect("a datagram")
        .unwrap()
}

/// Three members, one of them sending: what is sent to the group reaches
/// all three (the sender's own copy too), the others with the sender's
/// AV handle as source; the join's event names the handle. After a member leaves it gets nothing more, and
/// the other still does. In every wait mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_receive_what_is_sent_to_the_group() {
    for (k, wait) in [WaitMode::Interrupt, WaitMode::BusyPoll, WaitMode::Inline]
        .into_iter()
        .enumerate()
    {
        let g = group(10 + k as u8);
        let info = info(EpType::Dgram);
        let (a, b, s) = (open(&info, wait), open(&info, wait), open(&info, wait));
        let ma = a.ep.join(&raw(g), 7).await.unwrap();
        let ev =
            a.eq.next_timeout(Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
        assert_eq!(
            (ev.kind, ev.fid, ev.context),
            (EqEventKind::JoinComplete, ma.fid(), 7)
        );
        let mb = b.ep.join(&raw(g), 8).await.unwrap();
        let ms = s.ep.join(&raw(g), 9).await.unwrap();
        let to_group = ms.fi_addr();
        let s_in = |e: &Ep| {
            e.av.insert_sync(&[s.ep.local_addr().unwrap()], Default::default())
                .unwrap()
                .fi_addrs[0]
        };
        let (s_in_a, s_in_b) = (s_in(&a), s_in(&b));
        s.ep.send(to_group, Bytes::from_static(b"to all"))
            .await
            .unwrap();
        for (e, src) in [(&a, s_in_a), (&b, s_in_b)] {
            let got = recv(&e.ep).await;
            assert_eq!(got.src, src, "{wait:?}");
            assert_eq!(&got.into_bytes()[..], b"to all", "{wait:?}");
        }
        let got = recv(&s.ep).await;
        assert_eq!(&got.into_bytes()[..], b"to all", "the sender is a member");
        mb.close().unwrap();
        s.ep.send(to_group, Bytes::from_static(b"after"))
            .await
            .unwrap();
        assert_eq!(&recv(&a.ep).await.into_bytes()[..], b"after");
        let late =
            tokio::time::timeout(Duration::from_millis(300), b.ep.recv(BytesMut::zeroed(64))).await;
        assert!(late.is_err(), "{wait:?}: a member that left still receives");
        drop((ma, ms));
    }
}

/// A member that sends to the group gets its own datagram back (the
/// group's loopback), and the source is the sender's AV handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_datagram_names_its_sender() {
    let g = group(20);
    let info = info(EpType::Dgram);
    let (a, s) = (
        open(&info, WaitMode::Interrupt),
        open(&info, WaitMode::Interrupt),
    );
    let _ma = a.ep.join(&raw(g), 0).await.unwrap();
    let s_in_a =
        a.av.insert_sync(&[s.ep.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
    let ms = s.ep.join(&raw(g), 0).await.unwrap();
    s.ep.send(ms.fi_addr(), Bytes::from_static(b"named"))
        .await
        .unwrap();
    let got = recv(&a.ep).await;
    assert_eq!(got.src, s_in_a);
    assert_eq!(&got.into_bytes()[..], b"named");
}

/// Keyed members (`udp_auth_keys.rs`): a group datagram's MAC names the
/// group as its destination, so members of the key take it and a member
/// of another key drops it, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_members_take_only_their_key() {
    let g = group(21);
    let keyed = |k: &[u8]| {
        let mut i = info(EpType::Dgram);
        i.ep_attr.auth_key = Some(k.to_vec());
        open(&i, WaitMode::Interrupt)
    };
    let (a, s, o) = (keyed(b"job-a"), keyed(b"job-a"), keyed(b"job-b"));
    let _ma = a.ep.join(&raw(g), 0).await.unwrap();
    let ms = s.ep.join(&raw(g), 0).await.unwrap();
    let mo = o.ep.join(&raw(g), 0).await.unwrap();
    o.ep.send(mo.fi_addr(), Bytes::from_static(b"other job"))
        .await
        .unwrap();
    s.ep.send(ms.fi_addr(), Bytes::from_static(b"same job"))
        .await
        .unwrap();
    let got = recv(&a.ep).await;
    assert_eq!(&got.into_bytes()[..], b"same job");
    let start = std::time::Instant::now();
    while a.ep.stats().unwrap().rx_key_rejected != 1 {
        assert!(start.elapsed() < Duration::from_secs(10), "not counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What is not a group is refused, and nothing is joined: a unicast
/// address, an address of the other family; an endpoint without the
/// capability (a tcp one) has no joins; leaving twice is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_to_what_is_not_a_group_are_refused() {
    let info = info(EpType::Dgram);
    let a = open(&info, WaitMode::Interrupt);
    let unicast = SocketAddr::from((Ipv4Addr::LOCALHOST, 4000));
    assert_eq!(a.ep.join(&raw(unicast), 0).await.unwrap_err(), Error::Inval);
    let v6: SocketAddr = "[ff02::1]:4000".parse().unwrap();
    assert_eq!(a.ep.join(&raw(v6), 0).await.unwrap_err(), Error::Inval);
    let m = a.ep.join(&raw(group(30)), 0).await.unwrap();
    m.close().unwrap();

    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.fabric_attr.prov_name = Some("tcp".into());
    let tcp = weft::getinfo(Some(&hints)).unwrap().remove(0);
    assert!(!tcp.caps.contains(Caps::MULTICAST));
    let f = weft::Fabric::open(&tcp).unwrap();
    let d = f.domain(&tcp).unwrap();
    let av = d.av(AvAttr::default()).unwrap();
    let (ep, _cq) = weft_integration::enabled_endpoint(&d, &tcp, &av, WaitMode::Interrupt);
    assert_eq!(ep.join(&raw(group(31)), 0).await.unwrap_err(), Error::NoSys);
}
