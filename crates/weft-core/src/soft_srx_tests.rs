//! A shared context of two fake endpoints: receives report on the queues
//! of the endpoint their message arrived at, what ends without a message
//! on the first bound one's, and the budget and credits are the
//! context's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::addr::FI_ADDR_UNSPEC;
use crate::completion::{CqFormat, CqItem, OpDone, WaitMode};
use crate::multi_recv::tests::{items, msg};
use crate::soft_rx::Charge;
use bytes::BytesMut;

#[derive(Debug)]
struct FakeEp {
    this: Weak<FakeEp>,
    side: Arc<SoftSide<FakeEp>>,
    cq: Arc<CqShared>,
    woken: AtomicUsize,
}

impl RecvCtx for FakeEp {
    fn rx_credits(&self) -> &Credits {
        &self.side.rx
    }
    fn reported_addr(&self, a: FiAddr) -> FiAddr {
        a
    }
    fn give_back(&self, _r: Returned) {}
}

impl SrxEp for FakeEp {
    type Addr = ();
    fn this(&self) -> Weak<FakeEp> {
        self.this.clone()
    }
    fn handle_of(&self, _: &()) -> FiAddr {
        0
    }
    fn deliver_held(&self, mut req: RecvReq, info: MsgInfo, held: Held<FakeEp>) {
        self.report_here(&mut req);
        copy_and_deliver(self, req, info, &held.data);
    }
    fn rx_queues(&self) -> Queues {
        (Some(self.cq.clone()), None)
    }
    fn shared(&self) -> bool {
        true
    }
    fn wake(&self) {
        self.woken.fetch_add(1, Ordering::Relaxed);
    }
}

impl FakeEp {
    /// A message of `len` bytes (each byte `len`) arrives here: the
    /// oldest posted receive that accepts it takes it, else it is held
    /// within the budget (false: it does not fit).
    fn arrive(&self, len: usize) -> bool {
        let info = msg(len);
        let data = vec![len as u8; len];
        let mut m = lock(&self.side.matcher);
        let (got, ended) = crate::soft_rx::arrival(&mut m, &info);
        if let Some(mut req) = got {
            drop(m);
            ended.report(self);
            self.report_here(&mut req);
            copy_and_deliver(self, req, info, &data);
            return true;
        }
        let held = Charge::try_new(&self.side.unexp, len, self.side.limit)
            .map(|c| Held::new(self, BytesMut::from(&data[..]), (), c));
        let fits = held.is_some();
        if let Some(h) = held {
            m.push_unexpected(self.sender(()), info, h);
        }
        drop(m);
        ended.report(self);
        fits
    }
}

fn bound(srx: &Arc<SoftSrx<FakeEp>>) -> Arc<FakeEp> {
    let ep = Arc::new_cyclic(|this| FakeEp {
        this: this.clone(),
        side: srx.side.clone(),
        cq: CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8),
        woken: AtomicUsize::new(0),
    });
    srx.join(Arc::downgrade(&ep));
    ep
}

fn recv(context: u64, len: usize, flags: OpFlags) -> RecvReq {
    RecvReq {
        src: FI_ADDR_UNSPEC,
        bufs: if len == 0 {
            Vec::new()
        } else {
            vec![BytesMut::zeroed(len)]
        },
        tagged: false,
        tag: 0,
        ignore: 0,
        flags,
        done: OpDone {
            context,
            flags: OpFlags::RECV | OpFlags::MSG,
            report: true,
            cq: None,
            cntr: None,
            waiter: None,
        },
        multi: None,
    }
}

fn open(size: usize, limit: usize) -> Arc<SoftSrx<FakeEp>> {
    let attr = RxAttr {
        size,
        total_buffered_recv: limit,
        ..RxAttr::default()
    };
    SoftSrx::open(&attr, 1 << 20, 4)
}

fn one(cq: &Arc<CqShared>) -> CqItem {
    let mut got = items(cq);
    assert_eq!(got.len(), 1, "one completion");
    got.remove(0)
}

#[test]
fn held_messages_report_where_they_arrived_and_share_one_budget() {
    let srx = open(4, 100);
    let (a, b) = (bound(&srx), bound(&srx));
    assert!(a.arrive(40));
    assert!(b.arrive(50));
    // 90 of 100 held, between both endpoints: 20 more do not fit.
    assert!(!a.arrive(20));
    assert_eq!(srx.side.unexp.load(Ordering::Acquire), 90);
    srx.post(recv(1, 64, OpFlags::empty())).unwrap();
    let CqItem::Ok(e) = one(&a.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, e.len), (1, 40));
    assert!(items(&b.cq).is_empty());
    assert_eq!(srx.side.unexp.load(Ordering::Acquire), 50);
    assert!(a.woken.load(Ordering::Relaxed) > 0, "budget came back");
    srx.post(recv(2, 64, OpFlags::empty())).unwrap();
    let CqItem::Ok(e) = one(&b.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, e.len), (2, 50));
    assert_eq!(srx.side.rx.left(), 4, "every credit is back");
}

#[test]
fn peeks_claims_and_cancels_report_on_the_right_queues() {
    let srx = open(4, 1000);
    let (a, b) = (bound(&srx), bound(&srx));
    assert!(b.arrive(7));
    // A peek that finds it reports on b's queues, one that does not (and
    // a cancel) on a's, the first bound.
    srx.post(recv(3, 0, OpFlags::PEEK | OpFlags::CLAIM))
        .unwrap();
    let CqItem::Ok(e) = one(&b.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, e.len), (3, 7));
    srx.post(recv(4, 0, OpFlags::PEEK)).unwrap();
    let CqItem::Err(e) = one(&a.cq) else {
        panic!("the claimed message was seen")
    };
    assert_eq!(e.err, Error::NoMsg);
    srx.post(recv(3, 16, OpFlags::CLAIM)).unwrap();
    let CqItem::Ok(e) = one(&b.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, &e.bufs[0][..]), (3, &[7u8; 7][..]));
    srx.post(recv(5, 16, OpFlags::empty())).unwrap();
    assert_eq!(srx.side.rx.left(), 3);
    assert!(srx.cancel(5));
    assert!(!srx.cancel(5));
    let CqItem::Err(e) = one(&a.cq) else {
        panic!("a cancel completed")
    };
    assert_eq!((e.context, e.err), (5, Error::Canceled));
    assert_eq!(srx.side.rx.left(), 4);
    // Refused: receives directed by key, too many buffers, and anything
    // after close.
    let r = srx.post(recv(6, 16, OpFlags::AUTH_KEY)).unwrap_err();
    assert_eq!(r.err, Error::BadFlags);
    let mut many = recv(7, 16, OpFlags::empty());
    many.bufs = vec![BytesMut::zeroed(1); 5];
    assert_eq!(srx.post(many).unwrap_err().err, Error::Inval);
    srx.close();
    let r = srx.post(recv(8, 16, OpFlags::empty())).unwrap_err();
    assert_eq!(r.err, Error::OpBadState);
}

#[test]
fn a_message_outlives_the_endpoint_it_arrived_at() {
    let srx = open(4, 1000);
    let a = bound(&srx);
    let b = bound(&srx);
    assert!(b.arrive(5));
    srx.leave(&b);
    drop(b);
    srx.post(recv(9, 16, OpFlags::empty())).unwrap();
    let CqItem::Ok(e) = one(&a.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, &e.bufs[0][..]), (9, &[5u8; 5][..]));
}

#[test]
fn another_providers_context_is_inval() {
    #[derive(Debug)]
    struct Other;
    impl ProviderSrx for Other {
        fn post_recv(&self, req: RecvReq) -> std::result::Result<(), Rejected<RecvReq>> {
            Err(Rejected {
                err: Error::NoSys,
                req,
            })
        }
        fn cancel(&self, _: u64) -> bool {
            false
        }
        fn give_back(&self, _: Returned) {}
        fn rx_size_left(&self) -> usize {
            0
        }
        fn close(&self) {}
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    let other: Option<Arc<dyn ProviderSrx>> = Some(Arc::new(Other));
    assert_eq!(SoftSrx::<FakeEp>::of(&other).unwrap_err(), Error::Inval);
    let ours: Option<Arc<dyn ProviderSrx>> = Some(Arc::new(SrxHandle(open(1, 1))));
    assert!(SoftSrx::<FakeEp>::of(&ours).unwrap().is_some());
    assert!(SoftSrx::<FakeEp>::of(&None).unwrap().is_none());
}

/// A multi-receive buffer of `cap` bytes posted to a context (no queues:
/// they are the endpoints').
fn multi(context: u64, cap: usize, min: usize) -> RecvReq {
    let mut req = recv(context, cap, OpFlags::MULTI_RECV);
    crate::multi_recv::attach(&mut req, min, None);
    req
}

/// Messages held at two endpoints are packed into one buffer in arrival
/// order, each reported on the queues of the endpoint it arrived at; the
/// completion of the message that leaves less than the minimum free
/// carries the release.
#[test]
fn a_multi_receive_packs_every_endpoints_messages() {
    let srx = open(4, 1000);
    let (a, b) = (bound(&srx), bound(&srx));
    assert!(b.arrive(10));
    assert!(a.arrive(20));
    assert!(b.arrive(30));
    srx.post(multi(5, 100, 16)).unwrap();
    assert_eq!(srx.side.rx.left(), 3, "the buffer holds one credit");
    assert_eq!(srx.side.unexp.load(Ordering::Acquire), 0);
    let (ga, gb) = (items(&a.cq), items(&b.cq));
    assert_eq!((ga.len(), gb.len()), (1, 2));
    let CqItem::Ok(e) = &ga[0] else {
        panic!("an error")
    };
    assert_eq!((e.context, &e.bufs[0][..]), (5, &[20u8; 20][..]));
    assert!(!e.flags.contains(OpFlags::MULTI_RECV));
    let lens: Vec<usize> = gb
        .iter()
        .map(|i| match i {
            CqItem::Ok(e) => e.len,
            CqItem::Err(e) => panic!("{:?}", e.err),
        })
        .collect();
    assert_eq!(lens, [10, 30]);
    // 40 bytes left: a message of 30 arriving at a leaves 10, below the
    // minimum, so it is the last, and carries the flag, on a's queues.
    assert!(a.arrive(30));
    let CqItem::Ok(e) = one(&a.cq) else {
        panic!("an error")
    };
    assert_eq!((e.context, e.len), (5, 30));
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert!(items(&b.cq).is_empty());
    assert_eq!(srx.side.rx.left(), 4, "released");
    // A second buffer ends by cancel: its error, flagged, reports on the
    // first bound endpoint's queues.
    srx.post(multi(7, 100, 16)).unwrap();
    assert!(srx.cancel(7));
    let CqItem::Err(e) = one(&a.cq) else {
        panic!("a message")
    };
    assert_eq!((e.context, e.err), (7, Error::Canceled));
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(srx.side.rx.left(), 4);
}

/// A message that does not fit what a buffer has left releases it by a
/// completion without a message (on the first bound endpoint's queues)
/// and goes on to the next receive.
#[test]
fn a_message_that_does_not_fit_releases_the_buffer() {
    let srx = open(4, 1000);
    let (a, b) = (bound(&srx), bound(&srx));
    srx.post(multi(1, 64, 8)).unwrap();
    srx.post(recv(2, 64, OpFlags::empty())).unwrap();
    assert!(b.arrive(40));
    assert!(b.arrive(40));
    let CqItem::Ok(release) = one(&a.cq) else {
        panic!("an error")
    };
    assert_eq!((release.context, release.len), (1, 0));
    assert!(release.flags.contains(OpFlags::MULTI_RECV));
    assert!(!release.flags.contains(OpFlags::MSG));
    let contexts: Vec<u64> = items(&b.cq)
        .iter()
        .map(|i| match i {
            CqItem::Ok(e) => e.context,
            CqItem::Err(e) => panic!("{:?}", e.err),
        })
        .collect();
    assert_eq!(
        contexts,
        [1, 2],
        "the second message went to the next receive"
    );
    assert_eq!(srx.side.rx.left(), 4);
}
