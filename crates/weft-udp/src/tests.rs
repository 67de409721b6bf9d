//! The endpoint in-process: the receive pass driven by scripted datagrams
//! (what it counts, where it stops), sizes, and messages given back by
//! receives whose futures were dropped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;
use weft_core::addr::{decode_sockaddr, FiAddr, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use weft_core::av::{AvAttr, AvTable};
use weft_core::completion::{
    CqEntry, CqFormat, CqItem, CqShared, OpDone, Origin, Returned, WaitMode,
};
use weft_core::flags::{Caps, OpFlags};
use weft_core::limits::{ConnLimits, UNEXPECTED_OVERHEAD};
use weft_core::provider::{iov1, EpConfig, RecvReq, SendReq};
use weft_core::Error;

use crate::endpoint::EpShared;
use crate::rx::{pass, RxState, PASS_LIMIT};
use crate::wire::Header;

fn av() -> Arc<Mutex<AvTable>> {
    Arc::new(Mutex::new(AvTable::open(&AvAttr::default()).unwrap()))
}

fn config(av: &Arc<Mutex<AvTable>>, wait: WaitMode) -> EpConfig {
    let mut info = crate::offers().remove(0);
    // Granted only on request.
    info.caps -= Caps::ON_REQUEST;
    EpConfig {
        fid: 1,
        context: 0,
        info,
        av: Some(av.clone()),
        eq: None,
        wait,
        src_addr: None,
        conn: None,
        domain: None,
        rx_cq: None,
        rx_cntr: None,
        remote_cntrs: Default::default(),
        srx: None,
        stx: None,
        limits: ConnLimits::default(),
        fault: Arc::default(),
    }
}

fn insert(av: &Arc<Mutex<AvTable>>, addr: &[u8]) -> FiAddr {
    let r = av
        .lock()
        .unwrap()
        .insert(&[addr.to_vec()], &|b| decode_sockaddr(b).map(|_| ()));
    r[0].unwrap()
}

fn recv_req(cq: &Arc<CqShared>, cap: usize, context: u64) -> RecvReq {
    RecvReq {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(cap)],
        tagged: false,
        tag: 0,
        ignore: 0,
        flags: OpFlags::empty(),
        done: OpDone {
            context,
            flags: OpFlags::RECV | OpFlags::MSG,
            report: true,
            cq: Some(cq.clone()),
            cntr: None,
            waiter: None,
        },
        multi: None,
    }
}

fn datagram(payload: &[u8]) -> Vec<u8> {
    let mut d = Header::new(None, None, payload.len() as u32)
        .encode()
        .to_vec();
    d.extend_from_slice(payload);
    d
}

async fn next(cq: &CqShared) -> CqItem {
    for _ in 0..500 {
        let mut out = Vec::new();
        if cq.pop_batch(&mut out, 1) == 1 {
            return out.pop().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no completion");
}

#[tokio::test]
async fn a_pass_counts_what_it_drops_and_stops_where_it_should() {
    let av = av();
    let ep = EpShared::open(
        config(&av, WaitMode::Interrupt),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    let cq = CqShared::new(2, CqFormat::Tagged, WaitMode::Interrupt, 64);
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut script: VecDeque<Vec<u8>> = VecDeque::new();
    script.extend([Vec::new(), b"garbage".to_vec(), vec![0; 24]]);
    for i in 0..PASS_LIMIT {
        script.push_back(datagram(&[i as u8; 3]));
    }
    let mut read = |b: &mut [u8]| -> io::Result<(usize, SocketAddr)> {
        let d = script
            .pop_front()
            .ok_or(io::Error::from(io::ErrorKind::WouldBlock))?;
        b[..d.len()].copy_from_slice(&d);
        Ok((d.len(), from))
    };
    let mut st = RxState::new();
    // The pass stops at its limit: three malformed, the rest held.
    let o = pass(&ep, &mut st, ep.local, &mut read);
    assert_eq!((o.read, o.drained, o.delivered), (PASS_LIMIT, false, false));
    assert_eq!(ep.malformed.load(std::sync::atomic::Ordering::Relaxed), 3);
    let held = PASS_LIMIT - 3;
    assert_eq!(
        ep.side.unexp.load(std::sync::atomic::Ordering::Acquire),
        held * (3 + UNEXPECTED_OVERHEAD)
    );
    // A posted receive: the pass stops right after completing it, before
    // another read (which would only say the socket is empty).
    let all = ep.side.matcher.lock().drain_unexpected();
    drop(all);
    ep.recv(recv_req(&cq, 8, 7)).map_err(|r| r.err).unwrap();
    let o = pass(&ep, &mut st, ep.local, &mut read);
    assert_eq!((o.read, o.drained, o.delivered), (1, false, true));
    let CqItem::Ok(e) = next(&cq).await else {
        panic!("an error")
    };
    assert_eq!((e.context, e.src), (7, FI_ADDR_NOTAVAIL));
    // Then the rest, held, and the socket found empty.
    let o = pass(&ep, &mut st, ep.local, &mut read);
    assert_eq!((o.read, o.drained), (2, true));
    assert_eq!(
        ep.side.unexp.load(std::sync::atomic::Ordering::Acquire),
        2 * (3 + UNEXPECTED_OVERHEAD)
    );
}

#[tokio::test]
async fn sizes_follow_the_bound_interface() {
    let av = av();
    let ep = crate::open_endpoint(
        config(&av, WaitMode::Interrupt),
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    let local = decode_sockaddr(&ep.local_addr()).unwrap();
    assert!(local.ip().is_loopback() && local.port() != 0);
    let max = crate::ifaces::max_msg_at(local.ip());
    assert_eq!(max, 65_507 - crate::wire::HEADER_LEN);
    let to = insert(&av, &ep.local_addr());
    let cq = CqShared::new(2, CqFormat::Tagged, WaitMode::Interrupt, 64);
    let send = |len: usize| SendReq {
        dest: to,
        iov: iov1(Bytes::from(vec![1u8; len])),
        pool: None,
        tag: None,
        data: None,
        flags: OpFlags::empty(),
        done: OpDone {
            context: 3,
            flags: OpFlags::SEND | OpFlags::MSG,
            report: true,
            cq: Some(cq.clone()),
            cntr: None,
            waiter: None,
        },
    };
    // One byte past the datagram: refused, the request handed back whole.
    let r = ep.post_send(send(max + 1)).unwrap_err();
    assert_eq!((r.err, r.req.len()), (Error::MsgSize, max + 1));
    ep.post_send(send(max)).unwrap();
    let CqItem::Ok(e) = next(&cq).await else {
        panic!("send failed")
    };
    assert_eq!(e.len, max);
    // An address not in the AV.
    let mut s = send(1);
    s.dest = 77;
    assert_eq!(ep.post_send(s).unwrap_err().err, Error::AddrNotAvail);
    ep.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_given_back_goes_ahead_of_held_ones() {
    let (aav, bav) = (av(), av());
    let rt = tokio::runtime::Handle::current();
    let a = crate::open_endpoint(config(&aav, WaitMode::Interrupt), rt.clone()).unwrap();
    let b = crate::open_endpoint(config(&bav, WaitMode::Interrupt), rt).unwrap();
    let b_in_a = insert(&aav, &b.local_addr());
    let a_in_b = insert(&bav, &a.local_addr());
    let cq = CqShared::new(2, CqFormat::Tagged, WaitMode::Interrupt, 64);
    let send = |text: &'static [u8]| SendReq {
        dest: b_in_a,
        iov: iov1(Bytes::from_static(text)),
        pool: None,
        tag: None,
        data: None,
        flags: OpFlags::empty(),
        done: OpDone {
            context: 0,
            flags: OpFlags::SEND | OpFlags::MSG,
            report: false,
            cq: None,
            cntr: None,
            waiter: None,
        },
    };
    // A receive whose future is already gone: the provider completes it,
    // finds nobody listening and takes the datagram back itself.
    let (tx, rx) = oneshot::channel();
    drop(rx);
    let mut gone = recv_req(&cq, 16, 1);
    gone.done.waiter = Some(tx);
    b.post_recv(gone).unwrap();
    a.post_send(send(b"first")).unwrap();
    a.post_send(send(b"second")).unwrap();
    for _ in 0..500 {
        if b.stats().unexpected_bytes == 2 * UNEXPECTED_OVERHEAD + 11 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.stats().unexpected_bytes, 2 * UNEXPECTED_OVERHEAD + 11);
    // And one given back from outside (a future dropped after its
    // completion was sent): ahead of both.
    b.give_back(Returned {
        entry: CqEntry {
            flags: OpFlags::RECV | OpFlags::MSG,
            len: 4,
            bufs: vec![BytesMut::from(&b"zero"[..])],
            ..CqEntry::default()
        },
        src: a_in_b,
        origin: Origin::unknown(),
        raw: Vec::new(),
    });
    let mut got = Vec::new();
    for i in 0..3 {
        b.post_recv(recv_req(&cq, 16, 10 + i)).unwrap();
        let CqItem::Ok(e) = next(&cq).await else {
            panic!("receive failed")
        };
        assert_eq!(e.src, a_in_b);
        got.push(e.into_bytes().to_vec());
    }
    assert_eq!(got, [&b"zero"[..], b"first", b"second"]);
    assert_eq!(b.stats().unexpected_bytes, 0);
}
