//! Tests of `completion` and its modules.

use super::*;
use crate::addr::FI_ADDR_NOTAVAIL;
use crate::counter::CounterShared;
use crate::error::Error;
use crate::flags::OpFlags;
use crate::progress::{InlineWait, Progress};
use crate::sync::lock;
use futures::channel::oneshot;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A receive with context 1 reporting to `cq`, awaited through `tx`.
fn awaited_recv(cq: &Arc<CqShared>, tx: Waiter) -> OpDone {
    OpDone {
        context: 1,
        flags: OpFlags::RECV,
        report: true,
        cq: Some(cq.clone()),
        cntr: None,
        waiter: Some(tx),
    }
}

fn entry(ctx: u64) -> CqEntry {
    CqEntry {
        context: ctx,
        len: 4,
        ..CqEntry::default()
    }
}

#[test]
fn read_stops_at_error_and_readerr_takes_it() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    cq.push(Ok(entry(1)));
    cq.push(Err(CqErrEntry::new(2, OpFlags::RECV, Error::Canceled)));
    cq.push(Ok(entry(3)));
    let got = cq.read(10).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(cq.read(10).unwrap_err(), Error::Avail);
    let e = cq.read_err().unwrap();
    assert_eq!((e.context, e.err), (2, Error::Canceled));
    assert_eq!(cq.read_err().unwrap_err(), Error::Again);
    assert_eq!(cq.read(10).unwrap()[0].context, 3);
    assert_eq!(cq.read(10).unwrap_err(), Error::Again);
}

#[test]
fn formats_mask_fields() {
    let cq = CqShared::new(1, CqFormat::Context, WaitMode::Interrupt, 4);
    let mut e = entry(9);
    e.tag = 5;
    e.data = 6;
    e.flags = OpFlags::RECV;
    cq.push(Ok(e));
    let got = cq.read(1).unwrap().pop().unwrap();
    assert_eq!((got.context, got.len, got.tag, got.data), (9, 0, 0, 0));
    assert!(got.flags.is_empty());
}

#[test]
fn selective_completion_suppresses_success_not_errors() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let cntr = CounterShared::new(2);
    let mk = || OpDone {
        context: 7,
        flags: OpFlags::SEND | OpFlags::MSG,
        report: false,
        cq: Some(cq.clone()),
        cntr: Some(cntr.clone()),
        waiter: None,
    };
    mk().complete(CqEntry::default());
    assert!(cq.is_empty());
    assert_eq!(cntr.read(), 1);
    mk().fail_with(Error::ConnReset);
    assert_eq!(cntr.read_err(), 1);
    let e = cq.read_err().unwrap();
    assert_eq!(e.err, Error::ConnReset);
    assert!(e.flags.contains(OpFlags::SEND | OpFlags::MSG));
}

/// `complete_len` does what `complete` of a length-only entry does: an
/// unreported success only moves the counter; a reported one queues the
/// entry with the operation's context, flags and length.
#[test]
fn complete_len_is_complete_of_a_length() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let cntr = CounterShared::new(2);
    let mk = |report| OpDone {
        context: 7,
        flags: OpFlags::SEND | OpFlags::MSG,
        report,
        cq: Some(cq.clone()),
        cntr: Some(cntr.clone()),
        waiter: None,
    };
    mk(false).complete_len(64);
    assert!(cq.is_empty());
    assert_eq!(cntr.read(), 1);
    mk(true).complete_len(64);
    assert_eq!(cntr.read(), 2);
    let e = cq.read(1).unwrap().pop().unwrap();
    assert_eq!((e.context, e.len), (7, 64));
    assert_eq!(e.flags, OpFlags::SEND | OpFlags::MSG);
    // An awaited send's entry goes to its future, not the queue.
    let (tx, mut rx) = oneshot::channel();
    OpDone {
        waiter: Some(tx),
        ..mk(false)
    }
    .complete_len(8);
    assert!(cq.is_empty());
    assert!(rx.try_recv().is_ok());
}

#[test]
fn a_receive_whose_future_is_gone_hands_its_message_back() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let (tx, rx) = oneshot::channel();
    drop(rx);
    let d = awaited_recv(&cq, tx);
    let mut e = entry(1);
    e.flags = OpFlags::TAGGED | OpFlags::REMOTE_CQ_DATA;
    e.tag = 9;
    e.data = 5;
    e.bufs = vec![BytesMut::from(&b"ab"[..]), BytesMut::from(&b"cd"[..])];
    let mut back = d.complete_from(e, 42).expect("the message comes back");
    assert!(cq.is_empty(), "nor does the CQ get it");
    let info = back.info();
    assert_eq!(
        (info.src, info.tagged, info.tag, info.len, info.data),
        (42, true, 9, 4, Some(5))
    );
    assert!(Arc::ptr_eq(back.origin.cq.as_ref().unwrap(), &cq));
    assert_eq!(&back.take_bytes()[..], b"abcd");
}

#[test]
fn an_unknown_senders_message_comes_back_with_its_address() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let (tx, rx) = oneshot::channel();
    drop(rx);
    let d = awaited_recv(&cq, tx);
    let mut e = CqErrEntry::new(0, OpFlags::MSG, Error::AddrNotAvail);
    e.bufs = vec![BytesMut::from(&b"xyz"[..])];
    e.len = 3;
    e.err_data = vec![2, 0, 1];
    let mut back = d
        .fail_from(e, FI_ADDR_NOTAVAIL)
        .expect("the message comes back");
    assert!(cq.is_empty());
    assert_eq!(back.raw, vec![2, 0, 1]);
    assert_eq!(back.info().len, 3);
    assert_eq!(&back.take_bytes()[..], b"xyz");

    // With its future alive, the error reaches it.
    let (tx, mut rx) = oneshot::channel();
    let d = awaited_recv(&cq, tx);
    let e = CqErrEntry::new(0, OpFlags::MSG, Error::AddrNotAvail);
    assert!(d.fail_from(e, FI_ADDR_NOTAVAIL).is_none());
    let got = rx.try_recv().unwrap().unwrap().into_result(0).unwrap_err();
    assert_eq!(got.err, Error::AddrNotAvail);
}

#[test]
fn waiter_takes_completion_instead_of_cq() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let (tx, mut rx) = oneshot::channel();
    let d = awaited_recv(&cq, tx);
    d.complete(entry(1));
    assert!(cq.is_empty());
    assert!(rx.try_recv().unwrap().unwrap().into_result(0).is_ok());
}

/// Pushes one entry into its queue on the first pass, as an answer
/// arriving during a reader's progress pass would.
#[derive(Debug)]
struct AnswerOnce {
    cq: std::sync::Weak<CqShared>,
    sent: std::sync::atomic::AtomicBool,
}

impl Progress for AnswerOnce {
    fn progress(&self) -> usize {
        match self.cq.upgrade() {
            Some(cq) if !self.sent.swap(true, Ordering::SeqCst) => {
                cq.push(Err(CqErrEntry::new(3, OpFlags::RECV, Error::Canceled)));
                1
            }
            _ => 0,
        }
    }
}

#[test]
fn poll_batch_takes_what_is_queued_and_what_a_pass_brings_in_order() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Inline, 4);
    let hook: Arc<dyn Progress> = Arc::new(AnswerOnce {
        cq: Arc::downgrade(&cq),
        sent: Default::default(),
    });
    cq.add_progress(&hook);
    cq.push(Ok(entry(1)));
    cq.push(Ok(entry(2)));
    let w = futures::task::noop_waker();
    let mut cx = Context::from_waker(&w);
    let mut wait = InlineWait::reader();
    let mut out = Vec::new();
    // Two queued, room for more: the pass's error entry joins them.
    assert_eq!(
        cq.poll_batch(&mut cx, &mut wait, &mut out, 8),
        Poll::Ready(3)
    );
    let ctxs: Vec<u64> = out
        .iter()
        .map(|i| match i {
            Ok(e) => e.context,
            Err(e) => e.context,
        })
        .collect();
    assert_eq!(ctxs, [1, 2, 3]);
    assert!(matches!(&out[2], Err(e) if e.err == Error::Canceled && e.flags == OpFlags::RECV));
    assert!(cq.is_empty());
    // A batch of at most one still takes one, in order.
    cq.push(Ok(entry(4)));
    cq.push(Ok(entry(5)));
    out.clear();
    assert_eq!(
        cq.poll_batch(&mut cx, &mut wait, &mut out, 0),
        Poll::Ready(1)
    );
    assert!(matches!(&out[0], Ok(e) if e.context == 4));
    assert_eq!(cq.len(), 1);
    // Closed: what is left, then the end.
    cq.close();
    out.clear();
    assert_eq!(
        cq.poll_batch(&mut cx, &mut wait, &mut out, 8),
        Poll::Ready(1)
    );
    assert_eq!(
        cq.poll_batch(&mut cx, &mut wait, &mut out, 8),
        Poll::Ready(0)
    );
    assert_eq!(out.len(), 1);
}

/// A hook with nothing to do.
#[derive(Debug)]
struct Idle;

impl Progress for Idle {
    fn progress(&self) -> usize {
        0
    }
}

#[test]
fn a_spinning_reader_registers_only_once_it_sleeps_and_a_push_wakes_it() {
    struct Count(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Inline, 4);
    let hook: Arc<dyn Progress> = Arc::new(Idle);
    cq.add_progress(&hook);
    let count = Arc::new(Count(Default::default()));
    let w = std::task::Waker::from(count.clone());
    let mut cx = Context::from_waker(&w);
    let mut wait = InlineWait::reader();
    let mut out = Vec::new();
    // Within the spin budget every empty poll asks for a re-poll itself
    // and registers nothing; past it (the default budget is 200 µs, and
    // this gives up after 10 s) the poll leaves the waker registered.
    let start = std::time::Instant::now();
    loop {
        let before = count.0.load(Ordering::SeqCst);
        assert_eq!(
            cq.poll_batch(&mut cx, &mut wait, &mut out, 8),
            Poll::Pending
        );
        if count.0.load(Ordering::SeqCst) == before {
            break;
        }
        assert!(
            lock(&cq.inner).readers.is_empty(),
            "a spinning reader registered"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(10));
    }
    assert!(!lock(&cq.inner).readers.is_empty());
    let before = count.0.load(Ordering::SeqCst);
    cq.push(Ok(entry(7)));
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        before + 1,
        "the push woke it"
    );
    assert_eq!(
        cq.poll_batch(&mut cx, &mut wait, &mut out, 8),
        Poll::Ready(1)
    );
    assert!(matches!(&out[0], Ok(e) if e.context == 7));
}

/// A reader of an inline CQ with no endpoint bound spins with the lock
/// let go; a close in that window must not leave it registered after the
/// close took the wakers (a reader asleep for ever at teardown).
#[test]
fn a_close_while_an_unbound_reader_spins_ends_its_wait() {
    struct Flag(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    for round in 0..2000 {
        let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Inline, 4);
        let flag = Arc::new(Flag(Default::default()));
        let w = std::task::Waker::from(flag.clone());
        let closer = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                for _ in 0..(round % 64) {
                    std::hint::spin_loop();
                }
                cq.close();
            })
        };
        let mut wait = InlineWait::reader();
        let got = cq.poll_next(&mut Context::from_waker(&w), &mut wait);
        closer.join().unwrap();
        match got {
            Poll::Ready(None) => {}
            Poll::Pending => assert!(
                flag.0.load(Ordering::SeqCst),
                "round {round}: a reader left registered after the close"
            ),
            Poll::Ready(Some(_)) => panic!("round {round}: an item from an empty queue"),
        }
    }
}

fn contexts(items: &[CqItem]) -> Vec<u64> {
    items
        .iter()
        .map(|i| match i {
            Ok(e) => e.context,
            Err(e) => e.context,
        })
        .collect()
}

/// A batch that takes everything queued trades buffers with the queue
/// (`CqShared::take`): the order holds, and the queue
/// goes on taking items afterwards; a batch that cannot take it all, or
/// is not empty, is filled item by item as before.
#[test]
fn batches_keep_order_whether_they_trade_buffers_or_not() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
    let mut out = Vec::new();
    let mut next = 0;
    for round in 0..6 {
        // A partial read first in odd rounds, so that the queue's items
        // no longer start at its buffer's start.
        let n = 3 + round % 2;
        for _ in 0..n {
            cq.push(Ok(entry(next)));
            next += 1;
        }
        if round % 2 == 1 {
            assert_eq!(cq.pop_batch(&mut out, 2), 2);
            out.clear();
            cq.push(Ok(entry(next)));
            next += 1;
        }
        cq.push(Err(CqErrEntry::new(next, OpFlags::RECV, Error::Canceled)));
        next += 1;
        let queued = cq.len();
        // Room for a whole batch: this read trades buffers.
        out = Vec::with_capacity(LEND_MIN);
        let lent = out.as_ptr();
        assert_eq!(cq.pop_batch(&mut out, LEND_MIN), queued);
        assert_ne!(out.as_ptr(), lent, "a whole batch trades buffers");
        let want: Vec<u64> = (next - queued as u64..next).collect();
        assert_eq!(contexts(&out), want);
        assert!(cq.is_empty());
        assert_eq!(cq.read(1).unwrap_err(), Error::Again);
        out.clear();
    }
    // Not everything: item by item, the rest stays queued in order.
    for c in 0..5 {
        cq.push(Ok(entry(100 + c)));
    }
    assert_eq!(cq.pop_batch(&mut out, 3), 3);
    assert_eq!(contexts(&out), [100, 101, 102]);
    // A batch holding items already is appended to.
    assert_eq!(cq.pop_batch(&mut out, 8), 2);
    assert_eq!(contexts(&out), [100, 101, 102, 103, 104]);
    // A batch without room for `max` items (or `LEND_MIN`) never lends
    // the queue its buffer.
    let mut small = Vec::with_capacity(8);
    let own = small.as_ptr();
    cq.push(Ok(entry(200)));
    assert_eq!(cq.pop_batch(&mut small, 8), 1);
    assert_eq!(contexts(&small), [200]);
    assert_eq!(small.as_ptr(), own, "too small to lend: item by item");
    assert_eq!(small.capacity(), 8);
    // An empty queue takes nothing and trades nothing.
    let mut idle: Vec<CqItem> = Vec::with_capacity(LEND_MIN);
    let own = idle.as_ptr();
    assert_eq!(cq.pop_batch(&mut idle, LEND_MIN), 0);
    assert_eq!(
        idle.as_ptr(),
        own,
        "nothing taken: the batch keeps its buffer"
    );
    // A one-off drain with a huge batch does not leave the queue holding
    // its buffer.
    let mut huge: Vec<CqItem> = Vec::with_capacity(LEND_MAX * 2);
    let own = huge.as_ptr();
    cq.push(Ok(entry(300)));
    assert_eq!(cq.pop_batch(&mut huge, 64), 1);
    assert_eq!(contexts(&huge), [300]);
    assert_eq!(huge.as_ptr(), own, "a buffer above LEND_MAX is not lent");
    cq.push(Ok(entry(201)));
    assert_eq!(cq.read(1).unwrap()[0].context, 201);
}

/// Counts its passes; pushes one entry into its queue on pass `at`.
#[derive(Debug)]
struct AnswerAt {
    cq: std::sync::Weak<CqShared>,
    passes: std::sync::atomic::AtomicU32,
    at: u32,
}

impl Progress for AnswerAt {
    fn progress(&self) -> usize {
        let k = self.passes.fetch_add(1, Ordering::SeqCst) + 1;
        match self.cq.upgrade() {
            Some(cq) if k == self.at => {
                cq.push(Ok(entry(u64::from(k))));
                1
            }
            _ => 0,
        }
    }
}

#[test]
fn pop_batch_passes_passes_until_something_is_queued() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::BusyPoll, 4);
    let hook = Arc::new(AnswerAt {
        cq: Arc::downgrade(&cq),
        passes: Default::default(),
        at: 5,
    });
    let dyn_hook: Arc<dyn Progress> = hook.clone();
    cq.add_progress(&dyn_hook);
    let mut out = Vec::new();
    // Nothing in three passes: three passes made, nothing taken.
    assert_eq!(cq.pop_batch_passes(&mut out, 8, 3), 0);
    assert_eq!(hook.passes.load(Ordering::SeqCst), 3);
    assert!(out.is_empty());
    // The fifth pass brings an entry: taken at once, no pass after it.
    assert_eq!(cq.pop_batch_passes(&mut out, 8, 16), 1);
    assert_eq!(hook.passes.load(Ordering::SeqCst), 5);
    assert_eq!(contexts(&out), [5]);
    // A queue holding `max` items already is taken without a pass.
    out.clear();
    cq.push(Ok(entry(6)));
    cq.push(Ok(entry(7)));
    assert_eq!(cq.pop_batch_passes(&mut out, 2, 16), 2);
    assert_eq!(hook.passes.load(Ordering::SeqCst), 5);
    assert_eq!(contexts(&out), [6, 7]);
    // Fewer queued than `max`: one pass first, as `pop_batch` makes.
    out.clear();
    cq.push(Ok(entry(8)));
    assert_eq!(cq.pop_batch_passes(&mut out, 8, 16), 1);
    assert_eq!(hook.passes.load(Ordering::SeqCst), 6);
    // The hook is not held past the call: the endpoint's drop is seen.
    assert_eq!(Arc::strong_count(&hook), 2);
    drop(dyn_hook);
    drop(hook);
    assert_eq!(cq.pop_batch_passes(&mut out, 8, 4), 0);
    // No hook bound: passes look at the queue only.
    let bare = CqShared::new(2, CqFormat::Tagged, WaitMode::BusyPoll, 4);
    assert_eq!(bare.pop_batch_passes(&mut out, 8, 4), 0);
    assert_eq!(bare.pop_batch_passes(&mut out, 0, 4), 0);
}
