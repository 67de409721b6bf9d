//! The receive state machine driven by scripted reads, in-process (as
//! quinn-proto tests its connection): short reads, a header split across
//! reads, flow-control parking and resuming, a close mid-frame, garbage.
//! The connection's socket exists (a `Conn` needs one) but is never read:
//! every byte comes from the script.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use weft_core::addr::FI_ADDR_UNSPEC;
use weft_core::attr::EpType;
use weft_core::completion::{CqFormat, CqItem, CqShared, OpDone, WaitMode};
use weft_core::flags::OpFlags;
use weft_core::limits::{ConnLimits, UNEXPECTED_OVERHEAD};
use weft_core::provider::{EpConfig, RecvReq};
use weft_core::wire::{FrameKind, Header};
use weft_core::Error;

use super::{RxMachine, RxStatus};
use crate::conn::Conn;
use crate::endpoint::EpShared;
use weft_core::limits::ConnSlot;

/// An RDM endpoint with one connection whose far end the test holds.
pub(crate) struct Rig {
    pub(crate) ep: Arc<EpShared>,
    pub(crate) conn: Arc<Conn>,
    pub(crate) cq: Arc<CqShared>,
    rx: RxMachine,
    pub(crate) peer: tokio::net::TcpStream,
}

pub(crate) async fn rig(budget: usize) -> Rig {
    let mut info = crate::offers()
        .into_iter()
        .find(|i| i.ep_attr.ep_type == EpType::Rdm)
        .unwrap();
    info.rx_attr.total_buffered_recv = budget;
    // An offer carries what is granted only on request (FI_SOURCE_ERR);
    // these senders are in no AV and must complete normally.
    info.caps -= weft_core::flags::Caps::ON_REQUEST;
    let cfg = EpConfig {
        fid: 1,
        context: 0,
        info,
        av: None,
        eq: None,
        wait: WaitMode::Interrupt,
        src_addr: None,
        conn: None,
        domain: None,
        rx_cq: None,
        rx_cntr: None,
        remote_cntrs: Default::default(),
        srx: None,
        stx: None,
        limits: ConnLimits::default().with_peer_buffered(budget),
        fault: Arc::default(),
    };
    let local = "127.0.0.1:1".parse().unwrap();
    let ep = EpShared::new(cfg, local, tokio::runtime::Handle::current()).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    let (peer, _) = l.accept().await.unwrap();
    let conn = Conn::new(
        crate::tls::HsStream::Plain(a),
        "127.0.0.2:9".parse().unwrap(),
        &ep,
        ConnSlot::take(&ep.conn_count),
        crate::keys::ConnAuth::default(),
    )
    .unwrap();
    let cq = CqShared::new(2, CqFormat::Tagged, WaitMode::Interrupt, 64);
    let rx = RxMachine::new(1 << 20);
    Rig {
        ep,
        conn,
        cq,
        rx,
        peer,
    }
}

impl Rig {
    fn post(&self, tag: u64, cap: usize, context: u64) {
        let req = RecvReq {
            src: FI_ADDR_UNSPEC,
            bufs: vec![BytesMut::zeroed(cap)],
            tagged: true,
            tag,
            ignore: 0,
            flags: OpFlags::empty(),
            done: OpDone {
                context,
                flags: OpFlags::RECV | OpFlags::TAGGED,
                report: true,
                cq: Some(self.cq.clone()),
                cntr: None,
                waiter: None,
            },
            multi: None,
        };
        self.ep.recv(req).map_err(|r| r.err).unwrap();
    }

    /// One pass over `script` (chunks handed out per read, each cut to
    /// the reader's buffer; `WouldBlock` once it is empty).
    pub(crate) fn pass(&mut self, script: &mut Script) -> RxStatus {
        let (conn, ep) = (self.conn.clone(), self.ep.clone());
        self.rx.progress(&conn, &ep, &mut |b| script.read(b))
    }

    /// Passes until the script is used up or the machine stops for a
    /// reason of its own (parked, closed): a short read ends a pass, as
    /// on a socket the reactor would report readable again.
    fn drive(&mut self, script: &mut Script) -> RxStatus {
        for _ in 0..10_000 {
            let st = self.pass(script);
            let more = !script.chunks.is_empty();
            match st {
                RxStatus::WouldBlock | RxStatus::Drained if more => continue,
                st => return st,
            }
        }
        panic!("the script never ran out");
    }

    pub(crate) fn completions(&self) -> Vec<CqItem> {
        let mut out = Vec::new();
        self.cq.pop_batch(&mut out, usize::MAX);
        out
    }
}

/// Reads as a socket would give them.
#[derive(Default)]
pub(crate) struct Script {
    chunks: VecDeque<io::Result<Vec<u8>>>,
}

impl Script {
    pub(crate) fn bytes(mut self, b: &[u8]) -> Script {
        self.chunks.push_back(Ok(b.to_vec()));
        self
    }

    fn each_byte(mut self, b: &[u8]) -> Script {
        for x in b {
            self.chunks.push_back(Ok(vec![*x]));
        }
        self
    }

    pub(crate) fn eof(mut self) -> Script {
        self.chunks.push_back(Ok(Vec::new()));
        self
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.chunks.pop_front() {
            None => Err(io::ErrorKind::WouldBlock.into()),
            Some(Err(e)) => Err(e),
            Some(Ok(mut c)) => {
                let n = c.len().min(buf.len());
                buf[..n].copy_from_slice(&c[..n]);
                if n < c.len() {
                    self.chunks.push_front(Ok(c.split_off(n)));
                }
                Ok(n)
            }
        }
    }
}

fn frame(tag: u64, payload: &[u8], seq: u64) -> Vec<u8> {
    let mut h = Header::new(FrameKind::Tagged);
    h.tag = tag;
    h.len = payload.len() as u64;
    h.seq = seq;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

fn delivered(items: &[CqItem]) -> Vec<(u64, Vec<u8>)> {
    items
        .iter()
        .map(|i| {
            let e = i.as_ref().expect("a completion, not an error");
            (e.context, e.bufs.iter().flat_map(|b| b.to_vec()).collect())
        })
        .collect()
}

#[tokio::test]
async fn a_header_split_across_reads_and_byte_by_byte_payload() {
    let mut r = rig(1 << 20).await;
    r.post(5, 64, 1);
    let f = frame(5, b"hello, world", 1);
    let mut s = Script::default()
        .bytes(&f[..7])
        .bytes(&f[7..30])
        .each_byte(&f[30..]);
    let mut passes = 0;
    while r.completions().is_empty() && passes < 100 {
        // Every pass ends when the script says WouldBlock or the socket
        // would be empty (a short read).
        let st = r.pass(&mut s);
        assert!(
            matches!(st, RxStatus::WouldBlock | RxStatus::Drained),
            "{st:?}"
        );
        passes += 1;
        if let Some(c) = r.completions().first() {
            assert_eq!(
                delivered(std::slice::from_ref(c)),
                vec![(1, b"hello, world".to_vec())]
            );
            return;
        }
    }
    panic!("never delivered");
}

#[tokio::test]
async fn two_messages_in_one_read_are_both_delivered_in_order() {
    let mut r = rig(1 << 20).await;
    r.post(1, 16, 10);
    r.post(1, 16, 11);
    let mut both = frame(1, b"first", 1);
    both.extend(frame(1, b"second", 2));
    let mut s = Script::default().bytes(&both);
    r.drive(&mut s);
    assert_eq!(
        delivered(&r.completions()),
        vec![(10, b"first".to_vec()), (11, b"second".to_vec())]
    );
}

#[tokio::test]
async fn flow_control_parks_and_a_matching_receive_resumes() {
    // Room for one 100-byte unexpected message, not two.
    let budget = UNEXPECTED_OVERHEAD + 150;
    let mut r = rig(budget).await;
    let mut s = Script::default()
        .bytes(&frame(7, &[1; 100], 1))
        .bytes(&frame(7, &[2; 100], 2));
    assert_eq!(r.drive(&mut s), RxStatus::Parked);
    assert_eq!(
        r.ep.unexp_charged
            .load(std::sync::atomic::Ordering::Acquire),
        UNEXPECTED_OVERHEAD + 100
    );
    assert!(r.conn.parked.load(std::sync::atomic::Ordering::Acquire));
    // Parked again on a pass without any change.
    assert_eq!(r.pass(&mut s), RxStatus::Parked);
    // The first receive takes the buffered message, which frees budget
    // and wakes the connection; the second message then fits.
    r.post(7, 128, 1);
    assert!(
        !r.conn.parked.load(std::sync::atomic::Ordering::Acquire),
        "woken"
    );
    let st = r.pass(&mut s);
    assert!(
        matches!(st, RxStatus::WouldBlock | RxStatus::Drained),
        "{st:?}"
    );
    r.post(7, 128, 2);
    let got = delivered(&r.completions());
    assert_eq!(got, vec![(1, vec![1; 100]), (2, vec![2; 100])]);
    assert_eq!(
        r.ep.unexp_charged
            .load(std::sync::atomic::Ordering::Acquire),
        0
    );
}

#[tokio::test]
async fn a_close_mid_frame_gives_the_receive_back() {
    let mut r = rig(1 << 20).await;
    r.post(3, 64, 1);
    let f = frame(3, &[9; 40], 1);
    let mut s = Script::default().bytes(&f[..f.len() - 10]).eof();
    assert_eq!(r.drive(&mut s), RxStatus::Closed(Some(Error::ConnReset)));
    assert!(
        r.completions().is_empty(),
        "the dead message completes nothing"
    );
    // The receive is still posted: the next message takes it.
    let mut r2 = Script::default().bytes(&frame(3, b"next", 1));
    r.rx = RxMachine::new(1 << 20);
    r.drive(&mut r2);
    assert_eq!(delivered(&r.completions()), vec![(1, b"next".to_vec())]);
}

#[tokio::test]
async fn a_close_between_frames_is_clean_and_garbage_is_not() {
    let mut r = rig(1 << 20).await;
    let mut s = Script::default().eof();
    assert_eq!(r.pass(&mut s), RxStatus::Closed(None));
    let mut r = rig(1 << 20).await;
    let mut s = Script::default().bytes(&[0xAB; 40]);
    assert!(matches!(r.drive(&mut s), RxStatus::Closed(Some(_))));
}

fn untagged(payload: &[u8], seq: u64) -> Vec<u8> {
    let mut h = Header::new(FrameKind::Msg);
    h.len = payload.len() as u64;
    h.seq = seq;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

/// A multi-receive buffer: a message that dies mid-way leaves its range
/// unused (the buffer goes on with the next message, after it), and a
/// large message is read straight into its part of the buffer.
#[tokio::test]
async fn a_multi_receive_part_whose_message_dies_leaves_its_range() {
    let mut r = rig(1 << 20).await;
    let mut req = RecvReq {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(64 * 1024)],
        tagged: false,
        tag: 0,
        ignore: 0,
        flags: OpFlags::MULTI_RECV,
        done: OpDone {
            context: 4,
            flags: OpFlags::RECV | OpFlags::MSG,
            report: true,
            cq: Some(r.cq.clone()),
            cntr: None,
            waiter: None,
        },
        multi: None,
    };
    let base = req.bufs[0].as_ptr() as usize;
    weft_core::multi_recv::attach(&mut req, 1024, None);
    r.ep.recv(req).map_err(|e| e.err).unwrap();
    let f = untagged(&[9; 100], 1);
    let mut s = Script::default().bytes(&f[..f.len() - 10]).eof();
    assert_eq!(r.drive(&mut s), RxStatus::Closed(Some(Error::ConnReset)));
    assert!(
        r.completions().is_empty(),
        "the dead message completes nothing"
    );
    r.rx = RxMachine::new(1 << 20);
    let big = vec![5u8; 20 * 1024];
    let mut s = Script::default()
        .bytes(&untagged(b"next", 1))
        .bytes(&untagged(&big, 2));
    r.drive(&mut s);
    let got = r.completions();
    let at: Vec<(usize, usize)> = got
        .iter()
        .map(|i| {
            let e = i.as_ref().unwrap();
            (e.bufs[0].as_ptr() as usize - base, e.len)
        })
        .collect();
    assert_eq!(at, [(100, 4), (104, 20 * 1024)]);
    let last = got[1].as_ref().unwrap();
    assert!(last.bufs[0].iter().all(|&x| x == 5));
    assert!(!last.flags.contains(OpFlags::MULTI_RECV), "room is left");
}
