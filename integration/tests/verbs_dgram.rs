//! The verbs provider's DGRAM endpoints on a real RDMA device (soft-RoCE in
//! the VM of `integration/run-rxe`): UD queue pairs whose AV inserts
//! resolve addresses through rdma_cm. Servers on rxe1 (10.66.0.1),
//! clients on rxe2 (10.66.0.2), as on two hosts.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{
    AvFlags, BindFlags, EpType, Error, FiAddr, OpFlags, RecvMsg, SendMsg, WaitMode,
    FI_ADDR_NOTAVAIL,
};
use weft_integration::{next_cq, payload, verbs_offer, within, Node, TIMEOUT};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// Inserts `peer` into `node`'s AV (awaiting its resolution).
async fn insert(node: &Node, peer: &Node) -> FiAddr {
    let addr = peer.ep.local_addr().unwrap();
    let rep = within(
        "dgram insert",
        node.av.insert(&[addr], AvFlags::empty(), 0).unwrap(),
    )
    .await;
    assert_eq!(rep.count, 1, "{rep:?}");
    rep.fi_addrs[0]
}

fn mtu(node: &Node) -> usize {
    node.ep.info().ep_attr.max_msg_size
}

/// A server on rxe1 and a client on rxe2 that know each other:
/// `(server, client, client's handle of the server, server's handle of
/// the client)`.
async fn pair(wait: WaitMode) -> Option<(Node, Node, FiAddr, FiAddr)> {
    let s = Node::open(&verbs_offer(SERVER_DEV, EpType::Dgram)?, wait);
    let c = Node::open(&verbs_offer(CLIENT_DEV, EpType::Dgram)?, wait);
    let to_s = insert(&c, &s).await;
    let to_c = insert(&s, &c).await;
    Some((s, c, to_s, to_c))
}

fn raw(ip: [u8; 4], port: u16) -> Vec<u8> {
    weft::encode_sockaddr(&SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[test]
fn dgram_offer_describes_a_ud_queue_pair() {
    let Some(info) = verbs_offer(SERVER_DEV, EpType::Dgram) else {
        return;
    };
    assert_eq!(info.ep_attr.protocol, weft::Protocol::IbUd);
    let mtu = info.ep_attr.max_msg_size;
    eprintln!("{}", weft::format_info(&info, false));
    assert!(
        mtu.is_power_of_two() && (256..=4096).contains(&mtu),
        "{mtu}"
    );
    assert!(info.tx_attr.inject_size <= mtu);
    assert_eq!(info.domain_attr.cq_data_size, 4);
    assert!(info
        .caps
        .contains(weft::Caps::SOURCE | weft::Caps::DIRECTED_RECV));
    assert!(!info.caps.intersects(weft::Caps::TAGGED | weft::Caps::RMA));
}

/// Every size up to the MTU, both ways, with and without CQ data, checked
/// byte for byte with the reported source; in every progress mode.
async fn exchange(wait: WaitMode) {
    let Some((s, c, to_s, to_c)) = pair(wait).await else {
        return;
    };
    let mtu = mtu(&s);
    let inject = s.ep.info().tx_attr.inject_size;
    let sizes = [0, 1, 64, inject, inject + 1, mtu / 2, mtu - 1, mtu];
    for (i, len) in sizes.into_iter().enumerate() {
        for (from, to, dest, src, dir) in [(&c, &s, to_s, to_c, 0u8), (&s, &c, to_c, to_s, 1u8)] {
            let data = payload(len, i as u8 ^ dir);
            let cq_data = (i % 2 == 0).then_some(0xD000_0000 | len as u64);
            let (got, sent) = within("dgram exchange", async {
                tokio::join!(to.ep.recv(BytesMut::zeroed(mtu)), async {
                    // The receive is posted first: an unreliable
                    // transport drops nothing here, but be fair.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    from.ep
                        .sendmsg(
                            SendMsg {
                                dest,
                                iov: vec![data.clone()],
                                data: cq_data,
                                ..SendMsg::default()
                            },
                            OpFlags::empty(),
                        )
                        .await
                })
            })
            .await;
            let sent = sent.unwrap();
            assert_eq!(sent.len, len);
            let got = got.unwrap();
            assert_eq!(got.len, len, "size {len}");
            assert_eq!(&got.bufs[0][..], &data[..], "size {len}");
            assert_eq!(got.src, src, "size {len}");
            assert_eq!(
                got.flags.contains(OpFlags::REMOTE_CQ_DATA),
                cq_data.is_some()
            );
            if let Some(d) = cq_data {
                assert_eq!(got.data, d);
            }
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_exchange_interrupt() {
    exchange(WaitMode::Interrupt).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_exchange_busy_poll() {
    exchange(WaitMode::BusyPoll).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "current_thread")]
async fn dgram_exchange_inline() {
    exchange(WaitMode::Inline).await;
}

/// An `FI_EVENT` insert returns at once; the future and the EQ report the
/// same outcome per address: one error event (with the index) for each
/// address that could not be resolved, then one completion with the
/// success count. Addresses resolve concurrently, so a slow failure does
/// not hold up the others.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_event_insert_resolves_concurrently() {
    let Some(si) = verbs_offer(SERVER_DEV, EpType::Dgram) else {
        return;
    };
    let Some(ci) = verbs_offer(CLIENT_DEV, EpType::Dgram) else {
        return;
    };
    let servers: Vec<Node> = (0..4)
        .map(|_| Node::open(&si, WaitMode::Interrupt))
        .collect();
    let c = Node::open(&ci, WaitMode::Interrupt);
    // The synchronous form cannot block on rdma_cm; it inserts nothing.
    assert_eq!(
        c.av.insert_sync(&[servers[0].ep.local_addr().unwrap()], AvFlags::empty())
            .unwrap_err(),
        Error::Again
    );
    assert!(c.av.is_empty());
    let mut addrs: Vec<Vec<u8>> = servers.iter().map(|n| n.ep.local_addr().unwrap()).collect();
    // A port nobody listens on, an address no device reaches (its
    // resolution times out), then bytes that are no address.
    addrs.insert(1, raw([10, 66, 0, 1], 9));
    addrs.push(raw([10, 66, 0, 99], 7000));
    addrs.push(vec![1, 2, 3]);
    let t0 = Instant::now();
    let ins = c.av.insert(&addrs, AvFlags::EVENT, 0x5eed).unwrap();
    let returned = t0.elapsed();
    let rep = within("event insert", ins).await;
    eprintln!(
        "insert of {} addresses: returned after {returned:?}, resolved after {:?}",
        addrs.len(),
        t0.elapsed()
    );
    eprintln!("results: {:?}", rep.results);
    assert_eq!(rep.count, 4, "{rep:?}");
    // A TABLE's handles follow the call order.
    assert_eq!(&rep.fi_addrs[..1], &[0]);
    assert_eq!(&rep.fi_addrs[2..5], &[2, 3, 4]);
    assert_eq!(rep.results[1], Err(Error::ConnRefused));
    assert_eq!(rep.results[5], Err(Error::TimedOut));
    assert_eq!(rep.results[6], Err(Error::Inval));
    assert_eq!(rep.fi_addrs[1], FI_ADDR_NOTAVAIL);
    let mut errs = Vec::new();
    loop {
        match within("eq", c.eq.next_timeout(TIMEOUT)).await.unwrap() {
            Err(e) => {
                assert_eq!(e.context, 0x5eed);
                errs.push(e.data);
            }
            Ok(ev) => {
                assert_eq!(ev.kind, weft::EqEventKind::AvComplete);
                assert_eq!((ev.context, ev.data), (0x5eed, 4));
                break;
            }
        }
    }
    errs.sort_unstable();
    assert_eq!(errs, vec![1, 5, 6]);
    // Every resolved server is reachable through its handle.
    for (i, s) in servers.iter().enumerate() {
        let h = rep.fi_addrs[if i == 0 { 0 } else { i + 1 }];
        let (got, sent) = within("to each server", async {
            tokio::join!(s.ep.recv(BytesMut::zeroed(64)), async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                c.ep.send(h, payload(16, i as u8)).await
            })
        })
        .await;
        sent.unwrap();
        assert_eq!(&got.unwrap().bufs[0][..], &payload(16, i as u8)[..]);
    }
}

/// Datagrams that arrive before any receive wait for one; directed
/// receives take only their source's; a receive can be cancelled.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_early_arrivals_and_directed_receives() {
    let Some((s, c, to_s, to_c)) = pair(WaitMode::Interrupt).await else {
        return;
    };
    let Some(ci) = verbs_offer(CLIENT_DEV, EpType::Dgram) else {
        return;
    };
    let c2 = Node::open(&ci, WaitMode::Interrupt);
    let c2_to_s = insert(&c2, &s).await;
    let to_c2 = insert(&s, &c2).await;
    for k in 0..3u8 {
        c.ep.send(to_s, payload(32, k)).await.unwrap();
    }
    c2.ep.send(c2_to_s, payload(32, 0x80)).await.unwrap();
    // All four are in before the directed receive is posted.
    let want = 4 * (32 + weft_core::limits::UNEXPECTED_OVERHEAD);
    within("the four datagrams", async {
        while s.ep.stats().unwrap().unexpected_bytes < want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // c2's datagram first, though it arrived last.
    let got = within(
        "directed",
        s.ep.recvmsg(
            RecvMsg {
                src: to_c2,
                bufs: vec![BytesMut::zeroed(64)],
                ..RecvMsg::default()
            },
            OpFlags::empty(),
        ),
    )
    .await
    .unwrap();
    assert_eq!((got.src, &got.bufs[0][..]), (to_c2, &payload(32, 0x80)[..]));
    for k in 0..3u8 {
        let got = within("early", s.ep.recv(BytesMut::zeroed(64)))
            .await
            .unwrap();
        assert_eq!((got.src, &got.bufs[0][..]), (to_c, &payload(32, k)[..]));
    }
    // Nothing waits now: a posted receive can be cancelled.
    s.ep.post_recv(BytesMut::zeroed(64), 0xCA).unwrap();
    s.ep.cancel(0xCA).unwrap();
    let e = next_cq(&s.cq).await.unwrap_err();
    assert_eq!((e.err, e.context), (Error::Canceled, 0xCA));
    assert_eq!(s.ep.cancel(0xCA).unwrap_err(), Error::NoEnt);
}

/// Bad input: too long for a datagram, CQ data wider than 32 bits, an
/// unknown handle, a receive too small (truncated, with the overflow
/// length), tagged operations; the endpoint keeps working after each.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_bad_input() {
    let Some((s, c, to_s, _)) = pair(WaitMode::Interrupt).await else {
        return;
    };
    let mtu = mtu(&c);
    let e = c.ep.send(to_s, payload(mtu + 1, 0)).await.unwrap_err();
    assert_eq!(e.err, Error::MsgSize);
    let e =
        c.ep.sendmsg(
            SendMsg {
                dest: to_s,
                iov: vec![payload(8, 0)],
                data: Some(1 << 40),
                ..SendMsg::default()
            },
            OpFlags::empty(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.err, Error::Inval);
    let e = c.ep.send(to_s + 17, payload(8, 0)).await.unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    let e = c.ep.tsend(to_s, payload(8, 0), 7).await.unwrap_err();
    assert!(
        matches!(e.err, Error::NoSys | Error::Inval | Error::OpNotSupp),
        "{e:?}"
    );
    // Truncation.
    let (got, sent) = within("trunc", async {
        tokio::join!(s.ep.recv(BytesMut::zeroed(10)), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            c.ep.send(to_s, payload(100, 3)).await
        })
    })
    .await;
    sent.unwrap();
    let e = got.unwrap_err();
    assert_eq!((e.err, e.len, e.olen), (Error::Trunc, 10, 90));
    assert_eq!(&e.bufs[0][..], &payload(100, 3)[..10]);
    // Still fine.
    let (got, sent) = within("after", async {
        tokio::join!(s.ep.recv(BytesMut::zeroed(64)), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            c.ep.send(to_s, payload(64, 4)).await
        })
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().bufs[0][..], &payload(64, 4)[..]);
}

/// Removing an address forgets its resolution (sends to the handle fail);
/// inserting it again resolves it anew — also after the peer endpoint was
/// replaced by one with another queue pair on the same port.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_remove_and_reinsert() {
    let Some(si) = verbs_offer(SERVER_DEV, EpType::Dgram) else {
        return;
    };
    let Some(ci) = verbs_offer(CLIENT_DEV, EpType::Dgram) else {
        return;
    };
    let s = Node::open(&si, WaitMode::Interrupt);
    let c = Node::open(&ci, WaitMode::Interrupt);
    let addr = s.ep.local_addr().unwrap();
    let h = insert(&c, &s).await;
    c.av.remove(&[h]).unwrap();
    assert_eq!(
        c.ep.send(h, payload(8, 0)).await.unwrap_err().err,
        Error::AddrNotAvail
    );
    // A new endpoint on the same address (the old one closed first).
    drop(s.ep);
    let mut si2 = si.clone();
    si2.src_addr = Some(addr.clone());
    let s2_ep = s.domain.endpoint(&si2).unwrap();
    s2_ep.bind_av(&s.av).unwrap();
    s2_ep
        .bind_cq(&s.cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    s2_ep.enable().unwrap();
    assert_eq!(s2_ep.local_addr().unwrap(), addr);
    let rep = within(
        "reinsert",
        c.av.insert(&[addr], AvFlags::empty(), 0).unwrap(),
    )
    .await;
    let h2 = rep.fi_addrs[0];
    let (got, sent) = within("after reinsert", async {
        tokio::join!(s2_ep.recv(BytesMut::zeroed(64)), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            c.ep.send(h2, payload(40, 9)).await
        })
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().bufs[0][..], &payload(40, 9)[..]);
}

/// Many datagrams in flight with posted receives and the CQ: none is
/// lost or duplicated on this (loss-free) path, and the transmit queue
/// reports `Again` rather than overflowing.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_stream_through_the_cq() {
    let Some((s, c, to_s, to_c)) = pair(WaitMode::Interrupt).await else {
        return;
    };
    const N: usize = 200;
    for i in 0..N {
        s.ep.post_recv(BytesMut::zeroed(64), 1000 + i as u64)
            .unwrap();
    }
    let mut sent = 0;
    let mut done = 0;
    while sent < N {
        match c.ep.post_send(to_s, payload(48, sent as u8), sent as u64) {
            Ok(()) => sent += 1,
            Err(Error::Again) => {
                next_cq(&c.cq).await.unwrap();
                done += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    while done < N {
        next_cq(&c.cq).await.unwrap();
        done += 1;
    }
    let mut seen = [false; N];
    let mut seeds = [false; N];
    for _ in 0..N {
        let e = next_cq(&s.cq).await.unwrap();
        let i = (e.context - 1000) as usize;
        assert!(!seen[i]);
        seen[i] = true;
        assert_eq!((e.src, e.len), (to_c, 48));
        let seed = e.bufs[0][0] as usize;
        assert_eq!(&e.bufs[0][..], &payload(48, seed as u8)[..]);
        assert!(!seeds[seed], "datagram {seed} twice");
        seeds[seed] = true;
    }
    assert!(s.eq.is_empty());
}

fn multicast_offer(dev: &str) -> Option<weft::Info> {
    weft_integration::verbs_offer_with(dev, EpType::Dgram, |h| {
        h.caps = weft::Caps::MSG | weft::Caps::MULTICAST | weft::Caps::SOURCE;
    })
}

async fn recv_one(node: &Node) -> weft::CqEntry {
    within("a group datagram", node.ep.recv(BytesMut::zeroed(64)))
        .await
        .unwrap()
}

async fn nothing_arrives(node: &Node, what: &str) {
    // Emulated (TCG) devices are slow: a datagram that was coming would
    // have come within a second.
    let late =
        tokio::time::timeout(Duration::from_secs(1), node.ep.recv(BytesMut::zeroed(64))).await;
    assert!(late.is_err(), "{what}: {late:?}");
}

/// A sender on rxe1 and two members on rxe2 (one device, two queue
/// pairs): what is sent to the group reaches both, with the sender's AV
/// handle as the source; the join's event names the handle. A member
/// that leaves gets nothing more while the other still does, and gets
/// the group's datagrams again once it joins again. The sender, a member
/// itself, gets its own datagrams too (from an address not in its AV).
async fn members_receive(wait: WaitMode) {
    let (Some(si), Some(ci)) = (multicast_offer(SERVER_DEV), multicast_offer(CLIENT_DEV)) else {
        return;
    };
    assert!(si.caps.contains(weft::Caps::MULTICAST));
    let g = raw([239, 255, 66, 1 + wait as u8], 7000);
    let (s, a, b) = (
        Node::open_ep_eq(&si, wait),
        Node::open_ep_eq(&ci, wait),
        Node::open_ep_eq(&ci, wait),
    );
    let ma = within("join", a.ep.join(&g, 7)).await.unwrap();
    let ev = a.eq.next_timeout(TIMEOUT).await.unwrap().unwrap();
    assert_eq!(
        (ev.kind, ev.fid, ev.context),
        (weft::EqEventKind::JoinComplete, ma.fid(), 7)
    );
    let mb = within("join", b.ep.join(&g, 8)).await.unwrap();
    let ms = within("join", s.ep.join(&g, 9)).await.unwrap();
    let (s_in_a, s_in_b) = (insert(&a, &s).await, insert(&b, &s).await);
    let to_group = ms.fi_addr();
    s.ep.send(to_group, bytes::Bytes::from_static(b"to all"))
        .await
        .unwrap();
    for (e, src) in [(&a, s_in_a), (&b, s_in_b), (&s, FI_ADDR_NOTAVAIL)] {
        let got = recv_one(e).await;
        assert_eq!(got.src, src, "{wait:?}");
        assert_eq!(&got.into_bytes()[..], b"to all", "{wait:?}");
    }
    mb.close().unwrap();
    s.ep.send(to_group, bytes::Bytes::from_static(b"after"))
        .await
        .unwrap();
    for e in [&a, &s] {
        assert_eq!(&recv_one(e).await.into_bytes()[..], b"after", "{wait:?}");
    }
    nothing_arrives(&b, "a member that left").await;
    let mb = within("join again", b.ep.join(&g, 10)).await.unwrap();
    s.ep.send(to_group, bytes::Bytes::from_static(b"again"))
        .await
        .unwrap();
    for e in [&a, &b, &s] {
        assert_eq!(&recv_one(e).await.into_bytes()[..], b"again", "{wait:?}");
    }
    // Closing an endpoint leaves its groups; its handles then have
    // nothing left to leave.
    drop(b);
    drop(mb);
    drop(ma);
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_multicast_members_receive_interrupt() {
    members_receive(WaitMode::Interrupt).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_multicast_members_receive_busy_poll() {
    members_receive(WaitMode::BusyPoll).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "current_thread")]
async fn dgram_multicast_members_receive_inline() {
    members_receive(WaitMode::Inline).await;
}

/// What is not a group is refused and nothing is joined: a unicast
/// address, a group of the other family, bytes that are no address. A
/// left group's address sends nothing (`AddrNotAvail`) and harms
/// nothing else. Two joins of one group are two handles.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_multicast_bad_input() {
    let (Some(si), Some(ci)) = (multicast_offer(SERVER_DEV), multicast_offer(CLIENT_DEV)) else {
        return;
    };
    let (s, a) = (
        Node::open_ep_eq(&si, WaitMode::Interrupt),
        Node::open_ep_eq(&ci, WaitMode::Interrupt),
    );
    for bad in [
        raw([10, 66, 0, 2], 7000),
        weft::encode_sockaddr(&"[ff02::1]:7000".parse().unwrap()),
        vec![1, 2, 3],
    ] {
        let e = within("join", s.ep.join(&bad, 0)).await.unwrap_err();
        assert_eq!(e, Error::Inval, "{bad:?}");
    }
    assert!(s.eq.is_empty(), "a refused join queues no event");
    let g = raw([239, 255, 66, 20], 7000);
    let ma = within("join", a.ep.join(&g, 0)).await.unwrap();
    let ms = within("join", s.ep.join(&g, 0)).await.unwrap();
    let gone = ms.fi_addr();
    ms.close().unwrap();
    let e =
        s.ep.send(gone, bytes::Bytes::from_static(b"nobody"))
            .await
            .unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    nothing_arrives(&a, "a send to a group left").await;
    // The endpoint is unharmed: unicast still goes, and a new join works.
    let to_a = insert(&s, &a).await;
    s.ep.send(to_a, bytes::Bytes::from_static(b"unicast"))
        .await
        .unwrap();
    assert_eq!(&recv_one(&a).await.into_bytes()[..], b"unicast");
    let ms = within("join again", s.ep.join(&g, 0)).await.unwrap();
    s.ep.send(ms.fi_addr(), bytes::Bytes::from_static(b"back"))
        .await
        .unwrap();
    assert_eq!(&recv_one(&a).await.into_bytes()[..], b"back");
    // A second join of a group is a handle of its own: leaving one keeps
    // the other's deliveries.
    let ma2 = within("join twice", a.ep.join(&g, 0)).await.unwrap();
    drop(ma);
    s.ep.send(ms.fi_addr(), bytes::Bytes::from_static(b"still"))
        .await
        .unwrap();
    assert_eq!(&recv_one(&a).await.into_bytes()[..], b"still");
    ma2.close().unwrap();
    s.ep.send(ms.fi_addr(), bytes::Bytes::from_static(b"left"))
        .await
        .unwrap();
    nothing_arrives(&a, "a member that left both joins").await;
}
