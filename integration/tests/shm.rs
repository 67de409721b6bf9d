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
    AddrFormat, AvAttr, Caps, EpType, Error, Info, OpFlags, SendMsg, WaitMode, FI_ADDR_NOTAVAIL,
    FI_ADDR_UNSPEC,
};
use weft_integration::{enabled_endpoint, next_cq, payload, within, Harness, Provider, TIMEOUT};

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

/// Waits until `ep`'s statistics satisfy `ok`, failing after `TIMEOUT`.
async fn stats_until(ep: &weft::Endpoint, what: &str, ok: impl Fn(&weft::EpStats) -> bool) {
    let start = std::time::Instant::now();
    loop {
        let s = ep.stats().unwrap();
        if ok(&s) {
            return;
        }
        assert!(start.elapsed() < TIMEOUT, "{what}: stats stuck at {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    // Not offered: MSG and DGRAM, RMA, atomics, multi-receive, shared
    // contexts, delivery-complete, keys, TLS.
    for tune in [
        (|h: &mut Info| h.ep_attr.ep_type = EpType::Msg) as fn(&mut Info),
        |h| h.ep_attr.ep_type = EpType::Dgram,
        |h| h.caps = Caps::MSG | Caps::RMA,
        |h| h.caps = Caps::MSG | Caps::ATOMIC,
        |h| h.caps = Caps::MSG | Caps::MULTI_RECV,
        |h| h.caps = Caps::MSG | Caps::SHARED_AV,
        |h| h.ep_attr.rx_ctx_cnt = weft::SHARED_CONTEXT,
        |h| h.tx_attr.op_flags = OpFlags::DELIVERY_COMPLETE,
        |h| h.ep_attr.auth_key = Some(vec![1; 8]),
        |h| h.domain_attr.tls_capable = true,
    ] {
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("shm".into());
        tune(&mut h);
        assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData, "{h:?}");
    }
}

/// Two enabled endpoints of one domain waiting in `mode`, each with its
/// own AV holding the other.
struct Pair {
    a: weft::Endpoint,
    acq: weft::CompletionQueue,
    b: weft::Endpoint,
    bcq: weft::CompletionQueue,
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
