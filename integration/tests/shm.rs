//! The shm provider (`FI_EP_RDM` over shared memory) between endpoints of
//! one process: what getinfo offers, send and receive in every wait mode,
//! long messages in many records, remote CQ data, `FI_SOURCE` and
//! `FI_SOURCE_ERR`, the unexpected budget (a message that does not fit
//! waits in its ring, nothing is lost), inserts of peers that appear
//! later, and a segment filled with garbage. The cases shm shares with
//! the other providers are in the conformance suite (`<area>::shm`); the
//! faults of killed processes in `shm_faults.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{
    AddrFormat, Caps, EpType, Error, Info, OpFlags, SendMsg, WaitMode, FI_ADDR_NOTAVAIL,
    FI_ADDR_UNSPEC,
};
use weft_integration::{
    enabled_endpoint, next_cq, payload, stats_until, within, within_for, Harness, Provider,
};

mod shm_common;

fn shm() -> Provider {
    Provider::named("shm")
}

fn info_with(tune: impl FnOnce(&mut Info)) -> Info {
    shm()
        .try_info_with(EpType::Rdm, tune)
        .expect("an shm RDM offer")
}

fn harness() -> Harness {
    Harness::new(&shm(), EpType::Rdm)
}

#[tokio::test]
async fn getinfo_offers_rdm_with_names() {
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some("shm".into());
    let all = weft::getinfo(Some(&h)).unwrap();
    assert_eq!(all.len(), 1);
    let o = &all[0];
    assert_eq!(o.ep_attr.ep_type, EpType::Rdm);
    assert_eq!(o.addr_format, AddrFormat::Str);
    assert_eq!(o.ep_attr.protocol, weft::Protocol::Shm);
    assert!(o.caps.contains(
        Caps::MSG | Caps::TAGGED | Caps::SOURCE | Caps::DIRECTED_RECV | Caps::REMOTE_CQ_DATA
    ));
    assert!(weft::providers().contains(&"shm"));
    // Multi-receive is offered (conformance `multi_recv::shm`), and so
    // are shared receive contexts (`srx::shm`) and fences
    // (`ordering::shm`).
    assert!(o.caps.contains(Caps::MULTI_RECV | Caps::FENCE));
    assert_eq!(o.domain_attr.max_ep_srx_ctx, 1);
    // Not offered: MSG and DGRAM, RMA events, TLS (authorization keys
    // are, own and in the AV: `shm_auth_keys.rs`, `shm_av_auth_keys.rs`).
    for tune in [
        (|h: &mut Info| h.ep_attr.ep_type = EpType::Msg) as fn(&mut Info),
        |h| h.ep_attr.ep_type = EpType::Dgram,
        |h| h.caps = Caps::MSG | Caps::RMA | Caps::RMA_EVENT,
        |h| h.caps = Caps::MSG | Caps::SHARED_AV,
        |h| h.domain_attr.tls_capable = true,
    ] {
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("shm".into());
        tune(&mut h);
        assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData, "{h:?}");
    }
}

/// What is not there is refused by the calls too: named AVs, MSG
/// endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_is_refused() {
    let p = pair(WaitMode::Interrupt);
    let named = weft::AvAttr {
        name: Some("weft-shm-test-named".into()),
        ..weft::AvAttr::default()
    };
    assert_eq!(p.h.domain.av(named).unwrap_err(), Error::OpNotSupp);
    let mut i = p.h.info.clone();
    i.ep_attr.ep_type = EpType::Msg;
    let refused =
        p.h.domain
            .endpoint(&i)
            .map_or(true, |ep| ep.enable().is_err());
    assert!(refused, "an MSG endpoint enabled");
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
    b_in_a: weft::FiAddr,
    a_in_b: weft::FiAddr,
    h: Harness,
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
        h,
    }
}

fn pair(mode: WaitMode) -> Pair {
    let h = harness();
    let info = h.info.clone();
    pair_of(h, &info, mode)
}

/// Both forms of send and receive, untagged and tagged, short and long
/// (many records), in `mode`.
async fn exchange_in(mode: WaitMode) {
    let p = pair(mode);
    assert!(p.a.local_addr().unwrap().starts_with(b"fi_shm://"));
    for i in 0..120u64 {
        let len = match i % 4 {
            0 => 0,
            1 => 1 + (i as usize * 37) % 3000,
            2 => 64,
            _ => (i as usize * 7919) % (3 << 20),
        };
        let msg = payload(len, i as u8);
        let recv = p.b.recv(BytesMut::zeroed(3 << 20));
        let send = p.a.send(p.b_in_a, msg.clone());
        let (got, sent) = within("exchange", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!(got.src, p.a_in_b, "FI_SOURCE");
        assert_eq!(&got.into_bytes()[..], &msg[..], "message {i} of {len} B");
        p.b.post_trecv(BytesMut::zeroed(3 << 20), FI_ADDR_UNSPEC, i, 0, 100 + i)
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
    assert_eq!((s.rx_malformed, s.unexpected_bytes), (0, 0));
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
    // inserted; a message held meanwhile is re-resolved when matched.
    let cav = p.h.av();
    cav.insert_sync(&[p.b.local_addr().unwrap()], Default::default())
        .unwrap();
    let (c, _ccq) = enabled_endpoint(&p.h.domain, &p.h.info, &cav, WaitMode::Interrupt);
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

/// The AV changing between messages: a send to a removed handle is
/// `AddrNotAvail`, one to a handle reused for another peer goes to that
/// peer, and an arrival from a sender removed from (then put back into)
/// the receiver's AV reports its source anew. Sends and arrivals cache
/// what they looked up for as long as the AV's version stays the same,
/// which they read without the AV's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn av_changes_between_messages_are_seen() {
    let p = pair(WaitMode::Interrupt);
    let a = (&p.a, &p.aav, p.b_in_a);
    let b = (&p.b, &p.bav, p.a_in_b);
    weft_integration::av_change::changes_between_messages_are_seen(&p.h, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_err_reports_unknown_senders() {
    let info = info_with(|h| h.caps = Caps::MSG | Caps::SOURCE | Caps::SOURCE_ERR);
    assert!(info.caps.contains(Caps::SOURCE_ERR));
    let h = Harness::with_info(&shm(), info.clone());
    let p = pair_of(h, &info, WaitMode::Interrupt);
    let cav = p.h.av();
    let b_in_c = cav
        .insert_sync(&[p.b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let (c, _ccq) = enabled_endpoint(&p.h.domain, &info, &cav, WaitMode::Interrupt);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_sizes_and_gathers() {
    let p = pair(WaitMode::Interrupt);
    // Longer than the receive: FI_ETRUNC with what fitted, short and
    // long (the long one's later records are read past the buffer).
    // (`CMA_MAX`: read from the sender's memory where CMA is permitted.)
    for len in [100, weft_shm::cma::CMA_MAX, 1 << 20] {
        let recv = p.b.recv(BytesMut::zeroed(10));
        let (got, sent) = within("exchange", async {
            tokio::join!(recv, p.a.send(p.b_in_a, payload(len, 1)))
        })
        .await;
        sent.unwrap();
        let e = got.unwrap_err();
        assert_eq!((e.err, e.len, e.olen), (Error::Trunc, 10, len - 10));
        assert_eq!(&e.bufs[0][..], &payload(len, 1)[..10]);
    }
    // Gathered from several buffers, scattered into several: 400 KB
    // through the ring, 200 KB read from the sender's memory where CMA
    // is permitted (one range per buffer).
    for part in [100_000, 50_000] {
        let parts: Vec<Bytes> = (0..4u8).map(|i| payload(part + i as usize, i)).collect();
        let whole: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
        let m = SendMsg {
            dest: p.b_in_a,
            iov: parts,
            tag: None,
            data: None,
            context: 0,
        };
        let mut r = weft::RecvMsg::untagged(BytesMut::zeroed(150_000), 5);
        r.bufs.push(BytesMut::zeroed(1));
        r.bufs.push(BytesMut::zeroed(300_000));
        let (got, sent) = within("gather", async {
            tokio::join!(
                p.b.recvmsg(r, OpFlags::empty()),
                p.a.sendmsg(m, OpFlags::empty())
            )
        })
        .await;
        sent.unwrap();
        let ok = got.is_ok_and(|g| g.into_bytes()[..] == whole[..]);
        assert!(ok, "gathered from {part}-byte parts");
    }
    let max = p.h.info.ep_attr.max_msg_size;
    assert_eq!(
        p.a.post_send(p.b_in_a, Bytes::from(vec![0u8; max + 1]), 9)
            .unwrap_err(),
        Error::MsgSize
    );
    let inject = p.h.info.tx_attr.inject_size;
    assert_eq!(
        p.a.inject(p.b_in_a, payload(inject + 1, 3)).unwrap_err(),
        Error::MsgSize
    );
}

/// Past the unexpected budget nothing is dropped: the next message waits
/// in its ring (and the sender's ring fills) until receives take what is
/// held; every message arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_messages_wait_in_the_ring() {
    let per = 1000 + weft::UNEXPECTED_OVERHEAD;
    let info = info_with(|h| h.rx_attr.total_buffered_recv = 4 * per);
    let h = Harness::with_info(&shm(), info.clone());
    let p = pair_of(h, &info, WaitMode::Interrupt);
    let n = 600u64;
    for i in 0..n {
        p.a.post_send(p.b_in_a, payload(1000, i as u8), i).unwrap();
    }
    stats_until(&p.b, "budget full", |s| s.unexpected_bytes == 4 * per).await;
    // 600 KB do not fit a 256 KiB ring: some sends wait.
    let mut early = Vec::new();
    let sent_early = p.acq.try_read_batch(&mut early, n as usize) as u64;
    assert!(sent_early < n, "{sent_early} sends completed");
    for i in 0..n {
        let got = within("receive", p.b.recv(BytesMut::zeroed(1000)))
            .await
            .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(1000, i as u8)[..], "#{i}");
    }
    let mut done = sent_early;
    while done < n {
        within("send completion", next_cq(&p.acq)).await.unwrap();
        done += 1;
    }
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 0);
}

/// An insert of a name whose endpoint does not exist yet resolves when it
/// appears; sends to it then go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_waits_for_a_peer_that_appears() {
    let h = harness();
    let name = format!("fi_shm://late-{}", std::process::id());
    let av = h.av();
    assert_eq!(
        av.insert_sync(&[name.clone().into_bytes()], Default::default())
            .unwrap_err(),
        Error::Again,
        "not there yet"
    );
    let ins = av
        .insert(&[name.clone().into_bytes()], Default::default(), 0)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut info = h.info.clone();
    info.src_addr = Some(name.clone().into_bytes());
    let (late, lcq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    assert_eq!(late.local_addr().unwrap(), name.as_bytes());
    let r = within("insert", ins).await;
    assert_eq!(r.count, 1);
    let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &av, WaitMode::Interrupt);
    late.post_recv(BytesMut::zeroed(8), 1).unwrap();
    within("send", a.send(r.fi_addrs[0], Bytes::from_static(b"late")))
        .await
        .unwrap();
    let got = within("receive", next_cq(&lcq)).await.unwrap();
    assert_eq!(&got.into_bytes()[..], b"late");
    // The name is taken while its endpoint lives.
    let ep = h.domain.endpoint(&info).unwrap();
    ep.bind_av(&h.av()).unwrap();
    ep.bind_cq(&h.cq(), weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    assert_eq!(ep.enable().unwrap_err(), Error::AddrInUse);
    // Malformed names are refused at insert.
    let r = av
        .insert_sync(&[b"fi_shm://../etc".to_vec()], Default::default())
        .unwrap();
    assert_eq!(r.count, 0);
}

/// An endpoint whose segment is under its name, its header whole but
/// for its version — stored last, once its doorbell is made — is not
/// there yet to an AV insert: the insert waits, and resolves once the
/// version is stored. Made by hand here, naming this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_waits_for_the_version() {
    use std::sync::atomic::Ordering::Release;
    use weft_shm::layout::*;
    let h = harness();
    let name = format!("unversioned-{}", weft_shm::name::unique());
    let addr = format!("fi_shm://{name}").into_bytes();
    let g = Geometry::check(1, RING_MIN as u32).unwrap();
    let made = format!("weft-shm-test-{name}");
    std::fs::write(format!("/dev/shm/{made}"), vec![0u8; g.bytes()]).unwrap();
    let seg = weft_shm::segment::Segment::open(&made, g.bytes(), g.bytes()).unwrap();
    let (pid, start) = weft_shm::live::me();
    seg.store32(H_CHANNELS, g.channels as u32, Release);
    seg.store32(H_RING, g.ring as u32, Release);
    seg.store32(H_PID, pid, Release);
    seg.store64(H_START, start, Release);
    seg.store64(H_SERIAL, weft_shm::live::serial(), Release);
    seg.store64(H_MAGIC, MAGIC, Release);
    // Whole but its version before it takes the name, as a creator's:
    // no sweep finds a file without a header under the name.
    let path = format!("/dev/shm/weft-shm.{name}");
    std::fs::rename(format!("/dev/shm/{made}"), &path).unwrap();
    let av = h.av();
    assert_eq!(
        av.insert_sync(std::slice::from_ref(&addr), Default::default())
            .unwrap_err(),
        Error::Again,
        "no version yet"
    );
    let ins = av
        .insert(std::slice::from_ref(&addr), Default::default(), 0)
        .unwrap();
    tokio::pin!(ins);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut ins)
            .await
            .is_err(),
        "resolved before its version"
    );
    seg.store32(H_VERSION, VERSION, Release);
    let r = within("insert", ins).await;
    assert_eq!(r.count, 1);
    std::fs::remove_file(&path).unwrap();
}

/// Garbage written into an endpoint's segment (every channel's control
/// words and rings, as a hostile process of the same user could) frees
/// the channels it touched, counted, and never stops the endpoint: a
/// good sender's messages still arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_full_of_garbage_is_survived() {
    use std::io::{Seek, SeekFrom, Write};
    let p = pair(WaitMode::Interrupt);
    within("warm", p.a.send(p.b_in_a, Bytes::from_static(b"x")))
        .await
        .unwrap();
    within("warm", p.b.recv(BytesMut::zeroed(1))).await.unwrap();
    let name = String::from_utf8(p.b.local_addr().unwrap()).unwrap();
    let path = format!("/dev/shm/weft-shm.{}", name.trim_start_matches("fi_shm://"));
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        // Channels 1.. (a holds channel 0): states, lengths, positions.
        let ch = 1 + rnd() % 15;
        let ctl = 256 + ch * 256;
        let state = [2u32, 3, 1, 7][round % 4];
        f.seek(SeekFrom::Start(ctl)).unwrap();
        f.write_all(&state.to_ne_bytes()).unwrap();
        f.seek(SeekFrom::Start(ctl + 12)).unwrap();
        f.write_all(&((rnd() % 60) as u32).to_ne_bytes()).unwrap();
        f.write_all(b"liar").unwrap();
        f.seek(SeekFrom::Start(ctl + 128)).unwrap();
        f.write_all(&rnd().to_ne_bytes()).unwrap();
        let ring = 8192 + ch * (256 << 10);
        f.seek(SeekFrom::Start(ring + (rnd() % 4096) * 8)).unwrap();
        let junk: Vec<u8> = (0..64).map(|_| rnd() as u8).collect();
        f.write_all(&junk).unwrap();
        if round % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    stats_until(&p.b, "garbage counted", |s| s.rx_malformed > 0).await;
    for i in 0..50u8 {
        let recv = p.b.recv(BytesMut::zeroed(70_000));
        let (got, sent) = within("after garbage", async {
            tokio::join!(recv, p.a.send(p.b_in_a, payload(1 + i as usize * 1000, i)))
        })
        .await;
        sent.unwrap();
        assert_eq!(
            &got.unwrap().into_bytes()[..],
            &payload(1 + i as usize * 1000, i)[..]
        );
    }
}

/// One-record sends are written straight into the ring while it has
/// room and nothing waits ahead of them, and queued behind the first that
/// does not fit: rounds of sends of many sizes that overfill the ring
/// and the unexpected budget, received only after each round is posted,
/// arrive whole and in posting order in every progress mode.
async fn small_sends_past_a_full_ring_in(mode: WaitMode) {
    let per = 1500 + weft::UNEXPECTED_OVERHEAD;
    let info = info_with(|h| h.rx_attr.total_buffered_recv = 4 * per);
    let h = Harness::with_info(&shm(), info.clone());
    let p = pair_of(h, &info, mode);
    let size = |i: u64| 8 + (i as usize * 37) % 1400;
    let (rounds, n) = (3u64, 500u64);
    for r in 0..rounds {
        // About 350 KB a round: more than the 256 KiB ring.
        for i in r * n..(r + 1) * n {
            p.a.post_send(p.b_in_a, payload(size(i), i as u8), i)
                .unwrap();
        }
        // Nothing is received yet: what did not fit the ring (and the
        // few records the budget takes) waits in the queue.
        let mut early = Vec::new();
        p.acq.try_read_batch(&mut early, n as usize);
        assert!(
            (early.len() as u64) < n,
            "round {r}: {} sends completed before any receive",
            early.len()
        );
        let mut ctx: Vec<u64> = early.into_iter().map(|e| e.unwrap().context).collect();
        for i in r * n..(r + 1) * n {
            let got = within("receive", p.b.recv(BytesMut::zeroed(size(i))))
                .await
                .unwrap();
            assert_eq!(
                &got.into_bytes()[..],
                &payload(size(i), i as u8)[..],
                "#{i}"
            );
        }
        while (ctx.len() as u64) < n {
            let e = within("send completion", next_cq(&p.acq)).await.unwrap();
            ctx.push(e.context);
        }
        ctx.sort_unstable();
        assert_eq!(ctx, (r * n..(r + 1) * n).collect::<Vec<_>>(), "round {r}");
    }
    assert_eq!(p.b.stats().unwrap().unexpected_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sends_past_a_full_ring_interrupt() {
    small_sends_past_a_full_ring_in(WaitMode::Interrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sends_past_a_full_ring_inline() {
    small_sends_past_a_full_ring_in(WaitMode::Inline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sends_past_a_full_ring_busy_poll() {
    small_sends_past_a_full_ring_in(WaitMode::BusyPoll).await;
}

/// While both sides spin (busy-poll: no thread of theirs sleeps), large
/// messages and RMA go through the ring, not by cross-memory attach:
/// there the ring's two pipelined copies on two cores are faster
/// (`weft_shm::cma::pays`, `docs/benchmarks.md`) — but for messages from
/// `split::spin_min()` up, which go by CMA to be split, each side
/// copying half (`weft_shm::split`; CMA permitted outright, as here
/// unless Yama restricts it). Nothing in this test binary turns CMA on
/// for spinning endpoints otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_take_the_ring_while_both_sides_spin() {
    use weft_shm::cma::{mode, when_spinning, Mode, CMA_MIN};
    use weft_shm::split::spin_min;
    assert!(!when_spinning(), "WEFT_SHM_CMA_SPIN set for this test");
    if cma_denied() {
        return;
    }
    // Splits only where CMA is permitted outright.
    let split = u64::from(mode() == Mode::Permitted);
    let p = pair(WaitMode::BusyPoll);
    // The channel claimed and probed first.
    p.a.post_send(p.b_in_a, payload(8, 1), 1).unwrap();
    within("first", p.b.recv(BytesMut::zeroed(8)))
        .await
        .unwrap();
    let sizes = [CMA_MIN, spin_min() - 1, spin_min(), 3 << 20];
    for (i, len) in sizes.into_iter().enumerate() {
        let msg = payload(len, i as u8 + 2);
        p.b.post_recv(BytesMut::zeroed(len), 0).unwrap();
        within("send", p.a.send(p.b_in_a, msg.clone()))
            .await
            .unwrap();
        let r = within("receive", next_cq(&p.bcq)).await.unwrap();
        assert!(r.into_bytes()[..] == msg[..], "{len} B arrived whole");
        let direct = p.b.stats().unwrap().rx_direct;
        assert_eq!(
            direct,
            split * i.saturating_sub(1) as u64,
            "{len} B: by CMA only to be split"
        );
    }
}

/// CMA denied: a test that tells the ring from CMA by `rx_direct` has
/// nothing to tell.
fn cma_denied() -> bool {
    shm_common::cma_denied("skipped (every transfer takes the ring)")
}

/// Likewise RMA while both sides spin: writes and reads from
/// `cma::rma_min()` up go through the ring, not direct (the target's
/// `rx_direct` stays 0), and land whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_rma_takes_the_ring_while_both_sides_spin() {
    use weft::{MrAccess, MrAttr};
    use weft_shm::cma::{rma_min, when_spinning};
    assert!(!when_spinning(), "WEFT_SHM_CMA_SPIN set for this test");
    if cma_denied() {
        return;
    }
    let h = Harness::with_info(&shm(), shm().rma_info(EpType::Rdm));
    let (aav, bav) = (h.av(), h.av());
    let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &aav, WaitMode::BusyPoll);
    let (b, _bcq) = enabled_endpoint(&h.domain, &h.info, &bav, WaitMode::BusyPoll);
    let to_b = aav
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let len = rma_min().max(1 << 20);
    let access = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(len, access).requested_key(11))
        .unwrap();
    // The channel claimed and probed first.
    within("warm", a.write(to_b, payload(8, 1), mr.addr(), mr.key()))
        .await
        .unwrap();
    for (i, n) in [rma_min(), len].into_iter().enumerate() {
        let data = payload(n, i as u8 + 2);
        within("write", a.write(to_b, data.clone(), mr.addr(), mr.key()))
            .await
            .unwrap();
        let mut landed = vec![0u8; n];
        mr.read_at(0, &mut landed).unwrap();
        assert!(landed[..] == data[..], "{n} B written whole");
        let back = within(
            "read",
            a.read(to_b, BytesMut::zeroed(n), mr.addr(), mr.key()),
        )
        .await
        .unwrap();
        assert!(back.into_bytes()[..] == data[..], "{n} B read whole");
    }
    assert_eq!(b.stats().unwrap().rx_direct, 0, "none went direct");
}

// A spinning sender that finds the ring full and asks to be rung before
// its driver sleeps: `shm_bell.rs` (a binary of its own, for its sweep
// period).

/// The transmit queue's depth holds the sends that wait, not those
/// written straight into a ring: a full queue refuses (`Again`) even a
/// send that could go straight out to another, idle peer, and the depth
/// comes back as the waiting sends complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transmit_queue_counts_the_sends_that_wait() {
    let per = 1000 + weft::UNEXPECTED_OVERHEAD;
    let info = info_with(|h| {
        h.rx_attr.total_buffered_recv = 4 * per;
        h.tx_attr.size = 8;
    });
    let h = Harness::with_info(&shm(), info.clone());
    let av = h.av();
    let (a, acq) = enabled_endpoint(&h.domain, &info, &av, WaitMode::Interrupt);
    let (b, _bcq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    let (c, _ccq) = enabled_endpoint(&h.domain, &info, &h.av(), WaitMode::Interrupt);
    let ins = |ep: &weft::Endpoint| {
        av.insert_sync(&[ep.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0]
    };
    let (to_b, to_c) = (ins(&b), ins(&c));
    let depth = a.tx_size_left().unwrap();
    assert!(depth > 0);
    // Sends to b until the queue refuses: the ring (256 KiB) takes most
    // of them straight, then `depth` of them wait.
    let mut posted = 0u64;
    loop {
        match a.post_send(to_b, payload(1000, posted as u8), posted) {
            Ok(()) => posted += 1,
            Err(Error::Again) => break,
            Err(e) => panic!("send #{posted}: {e:?}"),
        }
        assert!(posted < 10_000, "the queue never filled");
    }
    assert!(
        posted > depth as u64,
        "sends written straight into the ring hold no place: {posted}"
    );
    assert_eq!(a.tx_size_left().unwrap(), 0);
    assert_eq!(
        a.post_send(to_c, payload(8, 1), u64::MAX).unwrap_err(),
        Error::Again,
        "a full queue refuses a send to an idle peer too"
    );
    for i in 0..posted {
        let got = within("receive", b.recv(BytesMut::zeroed(1000)))
            .await
            .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(1000, i as u8)[..], "#{i}");
    }
    for _ in 0..posted {
        within("send completion", next_cq(&acq)).await.unwrap();
    }
    assert_eq!(a.tx_size_left().unwrap(), depth, "the depth comes back");
}

/// A record of a sender's the receiver has not read, unpublished under
/// it — its word set to 0, as a sender that lost the channel before this
/// claim and wrote on would: the receiver would wait at that word
/// forever, the sender's ring full. The sender's sweep finds the 0 at
/// the receiver's head, fails what waits (`FI_ECONNABORTED`) and gives
/// the channel back; the receiver frees it, and the next send claims
/// anew and arrives. Nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_unpublished_under_its_sender_fails_what_waits() {
    use std::sync::atomic::Ordering::Release;
    use weft_shm::layout::*;
    // Each step takes milliseconds; the caps are for a loaded CI machine.
    let cap = Duration::from_secs(20);
    let per = 1000 + weft::UNEXPECTED_OVERHEAD;
    let info = info_with(|h| h.rx_attr.total_buffered_recv = 4 * per);
    let p = pair_of(
        Harness::with_info(&shm(), info.clone()),
        &info,
        WaitMode::Interrupt,
    );
    let n = 600u64;
    for i in 0..n {
        p.a.post_send(p.b_in_a, payload(1000, i as u8), i).unwrap();
    }
    within_for(cap, "budget full", async {
        while p.b.stats().unwrap().unexpected_bytes != 4 * per {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The fifth message waits at the receiver's head, unread.
    let seg = shm_common::segment_of(&p.b);
    let g = Geometry::OURS;
    let c = (0..g.channels)
        .map(|i| weft_shm::ring::Chan { g, i })
        .find(|c| c.state(&seg) == Some(ACTIVE))
        .expect("the sender's channel");
    // The claim's count, read while it is the sender's: its give-back
    // must close this claim, and the owner free it keeping the count.
    let gen = c.state_word(&seg).map(gen_of).expect("the channel's word");
    // The budget is charged as each record is taken, the head stored
    // after the drain's loop: wait for it, or the 0 would land on a
    // record already consumed and nothing would be detected.
    let head = 4 * rec_len(1000) as u64;
    within_for(cap, "the four held records consumed", async {
        while c.head(&seg) != head {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(c.published_at(&seg, head), Some(true));
    assert!(seg.store32(g.ring_at(c.i) + (head as usize & (g.ring - 1)), 0, Release));
    let (mut ok, mut aborted) = (0, 0);
    while ok + aborted < n {
        match within_for(cap, "every send ends", next_cq(&p.acq)).await {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.err, Error::ConnAborted);
                aborted += 1;
            }
        }
    }
    assert!(aborted > 0, "sends waited for room in the full ring");
    // The give-back moved this claim (a wrong count would move nothing,
    // the channel staying active at the 0 with its sender alive), and
    // the owner freed it: free at the claim's count, before any new
    // claim (no send is out).
    within_for(cap, "the channel given back and freed", async {
        while c.state_word(&seg) != Some(state_gen(FREE, gen)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    for i in 0..4u64 {
        let got = within_for(cap, "a message held", p.b.recv(BytesMut::zeroed(1000)))
            .await
            .unwrap();
        assert_eq!(&got.into_bytes()[..], &payload(1000, i as u8)[..]);
    }
    let got = within_for(cap, "the next send, on a new claim", async {
        let (got, sent) = tokio::join!(
            p.b.recv(BytesMut::zeroed(1000)),
            p.a.send(p.b_in_a, payload(1000, 77))
        );
        sent.unwrap();
        got.unwrap()
    })
    .await;
    assert_eq!(&got.into_bytes()[..], &payload(1000, 77)[..]);
}

/// A sender frees its own channel under the owner (only a broken one
/// does) and another claims it before the owner's next pass sees the
/// free word: the old claim goes, counted as malformed, and the new one
/// is activated and kept. Before, the owner freed the new claimer's
/// channel as broken along with the old claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_over_a_channel_freed_under_the_owner_is_kept() {
    use weft_shm::layout::{gen_of, state_gen, state_of, ACTIVE};
    let p = pair(WaitMode::Interrupt);
    let (seg, c) = shm_common::hostile_claim(&p.b, 5, false);
    let word = c.state_word(&seg).expect("the channel's word");
    assert_eq!(state_of(word), ACTIVE);
    let gen = gen_of(word);
    // Freed and claimed again at once (the owner sweeps every 100 ms:
    // it sees the new claim, not the free word, in all but a
    // microsecond-wide window).
    c.set_free(&seg);
    let (seg, c) = shm_common::claim_as(&p.b, 5, b"second", false);
    let new = state_gen(ACTIVE, gen.wrapping_add(1));
    assert_eq!(c.state_word(&seg), Some(new));
    stats_until(&p.b, "the old claim counted", |s| s.rx_malformed == 1).await;
    // Two sweeps later the new claim still holds the channel.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(c.state_word(&seg), Some(new), "the new claim kept");
    assert_eq!(p.b.stats().unwrap().rx_malformed, 1);
}

/// A claim left unfinished by a process whose pid now names another
/// (this one: its pid, with a start time that is not ours) is judged
/// dead by pid and start time, and freed after two sweeps. Before, the
/// owner judged a claimer by its pid alone, and a reused pid kept the
/// channel claimed for as long as the unrelated process lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_under_a_reused_pid_is_freed() {
    use std::sync::atomic::Ordering::Release;
    use weft_shm::layout::{gen_of, state_gen, C_PID, C_START, FREE};
    let p = pair(WaitMode::Interrupt);
    let seg = shm_common::segment_of(&p.b);
    let c = weft_shm::ring::Chan {
        g: weft_shm::layout::Geometry::OURS,
        i: 6,
    };
    let (pid, start) = weft_shm::live::me();
    let gen = c.begin_claim(&seg, pid).expect("a free channel");
    seg.store32(c.ctl(C_PID), pid, Release);
    seg.store64(c.ctl(C_START), start.wrapping_add(1), Release);
    let freed = state_gen(FREE, gen);
    within_for(Duration::from_secs(20), "the dead claim freed", async {
        while c.state_word(&seg) != Some(freed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(c.state_word(&seg).map(gen_of), Some(gen));
    assert_eq!(
        p.b.stats().unwrap().rx_malformed,
        0,
        "a dead claimer is no broken one"
    );
}
