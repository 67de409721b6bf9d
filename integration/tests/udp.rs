//! The udp provider (`FI_EP_DGRAM` over UDP sockets) on loopback: what
//! getinfo offers, send and receive in every wait mode, remote CQ data,
//! `FI_SOURCE` and `FI_SOURCE_ERR`, directed receives, inject,
//! truncation, sizes, the unexpected budget, malformed datagrams from a
//! raw socket, cancel, and both address formats and AV types. The soaks
//! of receive futures dropped under random timeouts (every datagram once,
//! in each wait mode) are in `cancel_safe.rs`; the cases udp shares with
//! the other providers are in the conformance suite (`<area>::udp`).
//!
//! Loopback does not lose datagrams while the receiver keeps up, so every
//! test that sends expects every datagram; each wait is bounded by
//! `weft_integration::TIMEOUT`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use bytes::{Bytes, BytesMut};
use weft::{
    AddrFormat, AvAttr, AvType, BindFlags, Caps, EpType, Error, Info, OpFlags, RecvMsg, SendMsg,
    WaitMode, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};
use weft_integration::{
    assert_cq_quiet, enabled_endpoint, next_cq, payload, stats_until, within, Harness, Provider,
};

fn udp() -> Provider {
    Provider::named("udp")
}

/// The udp offer whose hints `tune` adjusts (IPv4 loopback first).
fn info_with(tune: impl FnOnce(&mut Info)) -> Info {
    udp()
        .try_info_with(EpType::Dgram, tune)
        .expect("a udp DGRAM offer")
}

fn harness() -> Harness {
    Harness::new(&udp(), EpType::Dgram)
}

/// A udp datagram as `docs/wire.md` lays it out, written by hand.
fn datagram(flags: u8, tag: u64, data: u64, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![b'W', b'U', 1, flags];
    d.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    d.extend_from_slice(&tag.to_le_bytes());
    d.extend_from_slice(&data.to_le_bytes());
    d.extend_from_slice(payload);
    d
}

#[tokio::test]
async fn getinfo_offers_dgram_on_loopback_first() {
    let all = weft::getinfo(Some(&{
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("udp".into());
        h
    }))
    .unwrap();
    assert!(all
        .iter()
        .all(|i| matches!(i.ep_attr.ep_type, EpType::Dgram | EpType::SockDgram)));
    let first = &all[0];
    assert_eq!(first.ep_attr.ep_type, EpType::Dgram);
    assert_eq!(first.domain_attr.name.as_deref(), Some("lo"));
    assert_eq!(first.addr_format, AddrFormat::SockaddrIn);
    assert_eq!(first.ep_attr.protocol, weft::Protocol::WeftUdp);
    // Loopback's 64 KiB MTU: UDP's own limit less the 24-byte header.
    assert_eq!(first.ep_attr.max_msg_size, 65_507 - 24);
    assert!(first.caps.contains(
        Caps::MSG | Caps::TAGGED | Caps::SOURCE | Caps::DIRECTED_RECV | Caps::REMOTE_CQ_DATA
    ));
    assert!(weft::providers().contains(&"udp"));
    // SOCK_DGRAM has the payload's header-free room, nothing tagged.
    let sock = all
        .iter()
        .find(|i| i.ep_attr.ep_type == EpType::SockDgram)
        .expect("SOCK_DGRAM offered");
    assert_eq!(sock.ep_attr.max_msg_size, 65_507);
    assert_eq!(sock.ep_attr.protocol, weft::Protocol::Udp);
    assert!(!sock.caps.intersects(Caps::TAGGED | Caps::REMOTE_CQ_DATA));
    // Multi-receive on DGRAM, not on SOCK_DGRAM.
    let mut mh = Info::default();
    mh.fabric_attr.prov_name = Some("udp".into());
    mh.caps = Caps::MSG | Caps::MULTI_RECV;
    let multi = weft::getinfo(Some(&mh)).unwrap();
    assert!(!multi.is_empty());
    assert!(multi.iter().all(|i| i.ep_attr.ep_type == EpType::Dgram));
    assert!(!sock.caps.contains(Caps::MULTI_RECV));
    // What is not offered matches nothing: other endpoint types, RMA,
    // delivery-complete, keys on SOCK_DGRAM (udp_auth_keys.rs has DGRAM's).
    for tune in [
        (|h: &mut Info| h.ep_attr.ep_type = EpType::Rdm) as fn(&mut Info),
        |h| h.ep_attr.ep_type = EpType::Msg,
        |h| h.ep_attr.ep_type = EpType::SockStream,
        |h| h.caps = Caps::MSG | Caps::RMA,
        |h| {
            h.ep_attr.ep_type = EpType::SockDgram;
            h.caps = Caps::MSG | Caps::MULTI_RECV;
        },
        |h| h.tx_attr.op_flags = OpFlags::DELIVERY_COMPLETE,
        |h| {
            h.ep_attr.ep_type = EpType::SockDgram;
            h.ep_attr.auth_key = Some(vec![1; 8]);
        },
        |h| h.domain_attr.tls_capable = true,
        |h| h.ep_attr.max_msg_size = 1 << 20,
    ] {
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("udp".into());
        tune(&mut h);
        assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData, "{h:?}");
    }
}

#[tokio::test]
async fn stream_types_are_refused_by_the_calls() {
    let h = harness();
    // A stream type, or SOCK_DGRAM with DGRAM's tags: nothing opens.
    for (t, caps) in [
        (EpType::SockStream, h.info.caps),
        (EpType::SockDgram, h.info.caps),
    ] {
        let mut i = h.info.clone();
        i.ep_attr.ep_type = t;
        i.caps = caps;
        let opened = h.domain.endpoint(&i).and_then(|ep| {
            if t == EpType::SockStream {
                ep.bind_eq(&h.eq())?;
            } else {
                ep.bind_av(&h.av())?;
                ep.bind_cq(&h.cq(), BindFlags::TRANSMIT | BindFlags::RECV)?;
            }
            ep.enable()
        });
        assert_eq!(opened.unwrap_err(), Error::NoSys, "{t:?}");
    }
}

/// Two enabled endpoints of one domain waiting in `mode`, each with its
/// own AV holding the other.
struct Pair {
    a: weft::Endpoint,
    acq: weft::CompletionQueue,
    b: weft::Endpoint,
    bcq: weft::CompletionQueue,
    aav: weft::AddressVector,
    bav: weft::AddressVector,
    /// b's handle in a's AV, a's in b's.
    b_in_a: weft::FiAddr,
    a_in_b: weft::FiAddr,
    _h: Harness,
}

fn pair_of(h: Harness, info: &Info, mode: WaitMode) -> Pair {
    let (aav, bav) = (h.av(), h.av());
    let (a, acq) = enabled_endpoint(&h.domain, info, &aav, mode);
    let (b, bcq) = enabled_endpoint(&h.domain, info, &bav, mode);
    let ins = |av: &weft::AddressVector, ep: &weft::Endpoint| {
        av.insert_sync(&[ep.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0]
    };
    let (b_in_a, a_in_b) = (ins(&aav, &b), ins(&bav, &a));
    Pair {
        a,
        acq,
        b,
        bcq,
        aav,
        bav,
        b_in_a,
        a_in_b,
        _h: h,
    }
}

fn pair(mode: WaitMode) -> Pair {
    let h = harness();
    let info = h.info.clone();
    pair_of(h, &info, mode)
}

/// Both forms of send and receive, untagged and tagged, in `mode`.
async fn exchange_in(mode: WaitMode) {
    let p = pair(mode);
    for i in 0..200u64 {
        let msg = payload(1 + (i as usize * 37) % 3000, i as u8);
        // Awaited forms.
        let recv = p.b.recv(BytesMut::zeroed(4096));
        let send = p.a.send(p.b_in_a, msg.clone());
        let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.src, p.a_in_b, "FI_SOURCE");
        assert_eq!(&got.into_bytes()[..], &msg[..]);
        // Posted forms, tagged, completions from the CQs.
        p.b.post_trecv(BytesMut::zeroed(4096), FI_ADDR_UNSPEC, i, 0, 100 + i)
            .unwrap();
        p.a.post_tsend(p.b_in_a, msg.clone(), i, 200 + i).unwrap();
        let s = within("send completion", next_cq(&p.acq)).await.unwrap();
        assert_eq!(s.context, 200 + i);
        assert!(s.flags.contains(OpFlags::SEND | OpFlags::TAGGED));
        let r = within("receive completion", next_cq(&p.bcq)).await.unwrap();
        assert_eq!((r.context, r.tag, r.len), (100 + i, i, msg.len()));
        assert!(r.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
        assert_eq!(&r.into_bytes()[..], &msg[..]);
    }
    let s = p.b.stats().unwrap();
    assert_eq!(
        (s.rx_dropped, s.rx_malformed, s.unexpected_bytes),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_mode() {
    exchange_in(WaitMode::Interrupt).await;
}

#[tokio::test]
async fn interrupt_mode_current_thread() {
    exchange_in(WaitMode::Interrupt).await;
}

#[tokio::test]
async fn inline_mode() {
    exchange_in(WaitMode::Inline).await;
}

/// Inline on two workers: the reactor's reader and the spinning waiter
/// may reach for the socket at the same moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_multi_thread() {
    exchange_in(WaitMode::Inline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll_mode() {
    exchange_in(WaitMode::BusyPoll).await;
}

#[tokio::test]
async fn busy_poll_mode_current_thread() {
    exchange_in(WaitMode::BusyPoll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_cq_data_and_sources() {
    let p = pair(WaitMode::Interrupt);
    let m = SendMsg {
        dest: p.b_in_a,
        iov: vec![Bytes::from_static(b"with "), Bytes::from_static(b"data")],
        tag: None,
        data: Some(0xDEAD_BEEF_0123_4567),
        context: 0,
    };
    let recv = p.b.recv(BytesMut::zeroed(64));
    let send = p.a.sendmsg(m, OpFlags::REMOTE_CQ_DATA);
    let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert!(got.flags.contains(OpFlags::REMOTE_CQ_DATA));
    assert_eq!(got.data, 0xDEAD_BEEF_0123_4567);
    assert_eq!(got.src, p.a_in_b);
    assert_eq!(&got.into_bytes()[..], b"with data");

    // A sender that is not in b's AV: FI_ADDR_NOTAVAIL, until it is
    // inserted; a datagram held meanwhile is re-resolved when matched.
    let (c, _ccq) = enabled_endpoint(
        &p._h.domain,
        &p._h.info,
        &{
            let av = p._h.av();
            av.insert_sync(&[p.b.local_addr().unwrap()], Default::default())
                .unwrap();
            av
        },
        WaitMode::Interrupt,
    );
    let recv = p.b.recv(BytesMut::zeroed(8));
    let (got, sent) = within("unknown sender", async {
        tokio::join!(recv, c.send(0, Bytes::from_static(b"who")))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().src, FI_ADDR_NOTAVAIL);
    within("send", c.send(0, Bytes::from_static(b"held")))
        .await
        .unwrap();
    stats_until(&p.b, "held", |s| s.unexpected_bytes > 0).await;
    let c_in_b = p
        .bav
        .insert_sync(&[c.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let got = within("held", p.b.recv(BytesMut::zeroed(8))).await.unwrap();
    assert_eq!(got.src, c_in_b);
}

/// The AV changing between datagrams: a send to a removed handle is
/// `AddrNotAvail`, one to a handle reused for another peer goes to that
/// peer, and a datagram from a sender removed from (then put back into)
/// the receiver's AV reports its source anew. Sends and arrivals cache
/// what they looked up for as long as the AV's version stays the same,
/// which they read without the AV's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn av_changes_between_datagrams_are_seen() {
    let p = pair(WaitMode::Interrupt);
    let a = (&p.a, &p.aav, p.b_in_a);
    let b = (&p.b, &p.bav, p.a_in_b);
    weft_integration::av_change::changes_between_messages_are_seen(&p._h, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_err_reports_unknown_senders() {
    let info = info_with(|h| h.caps = Caps::MSG | Caps::SOURCE | Caps::SOURCE_ERR);
    assert!(info.caps.contains(Caps::SOURCE_ERR));
    let h = Harness::with_info(&udp(), info.clone());
    let p = pair_of(h, &info, WaitMode::Interrupt);
    // c knows b; b does not know c.
    let cav = p._h.av();
    let (c, _ccq) = enabled_endpoint(&p._h.domain, &info, &cav, WaitMode::Interrupt);
    let b_in_c = cav
        .insert_sync(&[p.b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let recv = p.b.recv(BytesMut::zeroed(8));
    let (got, sent) = within("exchange", async {
        tokio::join!(recv, c.send(b_in_c, Bytes::from_static(b"stranger")))
    })
    .await;
    sent.unwrap();
    let e = got.unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    assert_eq!(e.src, FI_ADDR_NOTAVAIL);
    assert_eq!(e.err_data, c.local_addr().unwrap(), "the sender's address");
    assert_eq!(&e.bufs[0][..e.len], b"stranger");
    // A known sender completes as usual.
    let recv = p.b.recv(BytesMut::zeroed(8));
    let (got, sent) = within("exchange", async {
        tokio::join!(recv, p.a.send(p.b_in_a, Bytes::from_static(b"friend")))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().src, p.a_in_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directed_receives_take_only_their_sender() {
    let h = harness();
    let info = h.info.clone();
    let p = pair_of(h, &info, WaitMode::Interrupt);
    let cav = p._h.av();
    let (c, _ccq) = enabled_endpoint(&p._h.domain, &info, &cav, WaitMode::Interrupt);
    let b_in_c = cav
        .insert_sync(&[p.b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let c_in_b = p
        .bav
        .insert_sync(&[c.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    // A receive directed at c, posted first, and one from anyone.
    let from_c = RecvMsg {
        src: c_in_b,
        ..RecvMsg::untagged(BytesMut::zeroed(16), 1)
    };
    p.b.post_recvmsg(from_c, OpFlags::empty()).unwrap();
    p.b.post_recv(BytesMut::zeroed(16), 2).unwrap();
    within("a", p.a.send(p.b_in_a, Bytes::from_static(b"from a")))
        .await
        .unwrap();
    let r = within("any", next_cq(&p.bcq)).await.unwrap();
    assert_eq!(
        (r.context, r.src),
        (2, p.a_in_b),
        "a's datagram skips c's receive"
    );
    within("c", c.send(b_in_c, Bytes::from_static(b"from c")))
        .await
        .unwrap();
    let r = within("directed", next_cq(&p.bcq)).await.unwrap();
    assert_eq!((r.context, r.src), (1, c_in_b));
    assert_eq!(&r.into_bytes()[..], b"from c");
    // Held datagrams are picked by source too.
    within("a", p.a.send(p.b_in_a, Bytes::from_static(b"a again")))
        .await
        .unwrap();
    within("c", c.send(b_in_c, Bytes::from_static(b"c again")))
        .await
        .unwrap();
    stats_until(&p.b, "both held", |s| s.unexpected_bytes >= 2 * 512).await;
    let from_c = RecvMsg {
        src: c_in_b,
        ..RecvMsg::untagged(BytesMut::zeroed(16), 3)
    };
    let got = within("directed", p.b.recvmsg(from_c, OpFlags::empty()))
        .await
        .unwrap();
    assert_eq!(&got.into_bytes()[..], b"c again");
    let got = within("any", p.b.recv(BytesMut::zeroed(16))).await.unwrap();
    assert_eq!(&got.into_bytes()[..], b"a again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_completes_nothing_and_is_bounded() {
    let p = pair(WaitMode::Interrupt);
    let inject = p._h.info.tx_attr.inject_size;
    assert!(inject >= 64);
    p.b.post_recv(BytesMut::zeroed(inject), 1).unwrap();
    p.a.inject(p.b_in_a, payload(inject, 3)).unwrap();
    let r = within("receive", next_cq(&p.bcq)).await.unwrap();
    assert_eq!(&r.into_bytes()[..], &payload(inject, 3)[..]);
    assert_cq_quiet(&p.acq, "an inject completes nothing").await;
    assert_eq!(
        p.a.inject(p.b_in_a, payload(inject + 1, 3)).unwrap_err(),
        Error::MsgSize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_and_sizes() {
    let p = pair(WaitMode::Interrupt);
    // Longer than the receive: FI_ETRUNC with what fitted.
    let recv = p.b.recv(BytesMut::zeroed(10));
    let (got, sent) = within("exchange", async {
        tokio::join!(recv, p.a.send(p.b_in_a, payload(100, 1)))
    })
    .await;
    sent.unwrap();
    let e = got.unwrap_err();
    assert_eq!((e.err, e.len, e.olen), (Error::Trunc, 10, 90));
    assert_eq!(&e.bufs[0][..], &payload(100, 1)[..10]);
    // The largest message goes whole; one byte more is refused at post.
    let max = p._h.info.ep_attr.max_msg_size;
    let recv = p.b.recv(BytesMut::zeroed(max));
    let (got, sent) = within("largest", async {
        tokio::join!(recv, p.a.send(p.b_in_a, payload(max, 2)))
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &payload(max, 2)[..]);
    assert_eq!(
        p.a.post_send(p.b_in_a, payload(max + 1, 2), 9).unwrap_err(),
        Error::MsgSize
    );
    assert_cq_quiet(&p.bcq, "a refused send sends nothing").await;
    // Zero bytes are a message too.
    let recv = p.b.recv(BytesMut::zeroed(4));
    let (got, sent) = within("empty", async {
        tokio::join!(recv, p.a.send(p.b_in_a, Bytes::new()))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().len, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unexpected_datagrams_wait_for_their_receive() {
    let p = pair(WaitMode::Interrupt);
    for i in 0..20u8 {
        within("send", p.a.send(p.b_in_a, payload(100, i)))
            .await
            .unwrap();
    }
    let per = 100 + weft::UNEXPECTED_OVERHEAD;
    stats_until(&p.b, "held", |s| s.unexpected_bytes == 20 * per).await;
    for i in 0..20u8 {
        let got = within("receive", p.b.recv(BytesMut::zeroed(128)))
            .await
            .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(100, i)[..], "in order");
    }
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_datagrams_are_dropped_and_counted() {
    let per = 1000 + weft::UNEXPECTED_OVERHEAD;
    let info = info_with(|h| h.rx_attr.total_buffered_recv = 4 * per);
    assert_eq!(info.rx_attr.total_buffered_recv, 4 * per);
    let h = Harness::with_info(&udp(), info.clone());
    let p = pair_of(h, &info, WaitMode::Interrupt);
    for i in 0..10u8 {
        within("send", p.a.send(p.b_in_a, payload(1000, i)))
            .await
            .unwrap();
    }
    stats_until(&p.b, "budget", |s| s.rx_dropped == 6).await;
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 4 * per);
    for i in 0..4u8 {
        let got = within("receive", p.b.recv(BytesMut::zeroed(1000)))
            .await
            .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(1000, i)[..]);
    }
    p.b.post_recv(BytesMut::zeroed(1000), 7).unwrap();
    assert_cq_quiet(&p.bcq, "the dropped datagrams are gone").await;
    // The budget is back: the next datagram is taken.
    within("send", p.a.send(p.b_in_a, payload(1000, 99)))
        .await
        .unwrap();
    let r = within("receive", next_cq(&p.bcq)).await.unwrap();
    assert_eq!(&r.into_bytes()[..], &payload(1000, 99)[..]);
    assert_eq!(p.b.stats().unwrap().rx_dropped, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_datagrams_from_a_raw_socket_are_dropped() {
    let p = pair(WaitMode::Interrupt);
    let raw = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let to: SocketAddr = weft::decode_sockaddr(&p.b.local_addr().unwrap()).unwrap();
    let good = datagram(0, 0, 0, b"raw but right");
    let mut bad: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"hello".to_vec(),
        vec![0u8; 24],
        vec![0xffu8; 1000],
        good[..good.len() - 1].to_vec(),
        [good.clone(), vec![0]].concat(),
        datagram(8, 0, 0, b"unknown flag"),
        datagram(0, 5, 0, b"tag without its flag"),
        datagram(0, 0, 5, b"data without its flag"),
    ];
    let mut v2 = good.clone();
    v2[2] = 2;
    bad.push(v2);
    let mut magic = good.clone();
    magic[1] = b'X';
    bad.push(magic);
    let mut long = good.clone();
    long[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    bad.push(long);
    for d in &bad {
        raw.send_to(d, to).unwrap();
    }
    let n = bad.len() as u64;
    stats_until(&p.b, "malformed", |s| s.rx_malformed == n).await;
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 0, "nothing held");
    // A well-formed datagram from a raw socket is a message like any
    // other: tagged with data, from a sender not in the AV.
    raw.send_to(&datagram(3, 0x77, 0x55, b"raw tagged"), to)
        .unwrap();
    let got = within(
        "raw tagged",
        p.b.trecv(BytesMut::zeroed(32), FI_ADDR_UNSPEC, 0x77, 0),
    )
    .await
    .unwrap();
    assert_eq!((got.tag, got.data, got.src), (0x77, 0x55, FI_ADDR_NOTAVAIL));
    assert_eq!(&got.into_bytes()[..], b"raw tagged");
    // And the endpoint is unharmed.
    let recv = p.b.recv(BytesMut::zeroed(16));
    let (got, sent) = within("after", async {
        tokio::join!(recv, p.a.send(p.b_in_a, Bytes::from_static(b"still fine")))
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"still fine");
    assert_eq!(p.b.stats().unwrap().rx_malformed, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_peek() {
    let p = pair(WaitMode::Interrupt);
    p.b.post_recv(BytesMut::zeroed(16), 5).unwrap();
    let left = p.b.rx_size_left().unwrap();
    p.b.cancel(5).unwrap();
    let e = within("cancelled", next_cq(&p.bcq)).await.unwrap_err();
    assert_eq!((e.err, e.context), (Error::Canceled, 5));
    assert_eq!(p.b.rx_size_left().unwrap(), left + 1);
    assert_eq!(p.b.cancel(5).unwrap_err(), Error::NoEnt);
    // Peek, claim and discard on held tagged datagrams.
    within(
        "send",
        p.a.tsend(p.b_in_a, Bytes::from_static(b"peeked"), 4),
    )
    .await
    .unwrap();
    stats_until(&p.b, "held", |s| s.unexpected_bytes > 0).await;
    let peek = RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(16)],
        tagged: true,
        tag: 4,
        ignore: 0,
        context: 0,
    };
    let got = within("peek", p.b.recvmsg(peek, OpFlags::PEEK | OpFlags::DISCARD))
        .await
        .unwrap();
    assert_eq!(got.len, 6);
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 0, "discarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_loopback_and_both_av_types() {
    let lo6 = |h: &mut Info| {
        h.addr_format = AddrFormat::SockaddrIn6;
        h.domain_attr.name = Some("lo".into());
    };
    if UdpSocket::bind("[::1]:0").is_err() {
        // A host without IPv6 loopback (IPv6 disabled): nothing offers it.
        let offer = udp().try_info_with(EpType::Dgram, lo6);
        assert!(
            offer.is_none(),
            "an IPv6 loopback offer without ::1: {offer:?}"
        );
        return;
    }
    for av_type in [AvType::Table, AvType::Map] {
        let info = info_with(|h| {
            lo6(h);
            h.domain_attr.av_type = av_type;
        });
        assert_eq!(info.addr_format, AddrFormat::SockaddrIn6);
        let h = Harness::with_info(&udp(), info.clone());
        let av = |h: &Harness| {
            h.av_with(AvAttr {
                av_type,
                ..AvAttr::default()
            })
        };
        let (aav, bav) = (av(&h), av(&h));
        let (a, _acq) = enabled_endpoint(&h.domain, &info, &aav, WaitMode::Interrupt);
        let (b, _bcq) = enabled_endpoint(&h.domain, &info, &bav, WaitMode::Interrupt);
        let b_addr = weft::decode_sockaddr(&b.local_addr().unwrap()).unwrap();
        assert!(b_addr.is_ipv6() && b_addr.ip().is_loopback(), "{b_addr}");
        let b_in_a = aav
            .insert_sync(&[b.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let a_in_b = bav
            .insert_sync(&[a.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let recv = b.recv(BytesMut::zeroed(16));
        let (got, sent) = within("v6", async {
            tokio::join!(recv, a.send(b_in_a, Bytes::from_static(b"over ::1")))
        })
        .await;
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.src, a_in_b, "{av_type:?}");
        assert_eq!(&got.into_bytes()[..], b"over ::1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datagram_to_nobody_is_lost_not_failed() {
    let h = harness();
    let av = h.av();
    let (a, acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    // A port bound and released: nobody listens there.
    let dead = {
        let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        weft::encode_sockaddr(&s.local_addr().unwrap())
    };
    let to = av
        .insert_sync(&[dead], Default::default())
        .unwrap()
        .fi_addrs[0];
    for i in 0..3 {
        a.post_send(to, Bytes::from_static(b"into the void"), i)
            .unwrap();
        let c = within("send completion", next_cq(&acq)).await.unwrap();
        assert_eq!(c.context, i, "a send completes once the kernel has it");
    }
    // An address that is not in the AV is refused at post.
    assert_eq!(
        a.post_send(12345, Bytes::from_static(b"x"), 9).unwrap_err(),
        Error::AddrNotAvail
    );
}
