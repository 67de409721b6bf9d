use std::any::Any;
use std::sync::Mutex;

use bytes::BytesMut;
use weft_core::provider::{PoolHome, PoolSend};

use weft_core::completion::Finished;

use super::*;
use crate::msg::complete::tests::{
    awaited, failed_arrival, message, number_of, remote_write_arrival,
};
use crate::msg::complete::Waiting;
use crate::msg::retired::{
    cancel_retired, clear_retired, give_back_routed, push_retired, RetiredList, RetiredQueue,
};
use crate::sys::{WcFlags, WcOpcode, WcStatus};

fn wc(wr_id: u64, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode: WcOpcode::Send,
        vendor_err: 0,
        byte_len: 0,
        imm_data: None,
        qp_num: 1,
        src_qp: 0,
        wc_flags: WcFlags::default(),
        invalidated_rkey: None,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

fn send(context: u64, op: Held) -> (Inflight, futures::channel::oneshot::Receiver<Finished>) {
    let (done, rx) = awaited(context);
    (Inflight { done, op }, rx)
}

#[test]
fn a_given_up_queue_keeps_its_receives_until_their_work_requests_report() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    let (d1, mut r1) = awaited(1);
    let (d2, mut r2) = awaited(2);
    let (d3, _r3) = awaited(3);
    {
        let mut q = lock(&rxq);
        for (id, d) in [(10, d1), (11, d2), (12, d3)] {
            assert!(credits.try_take() && q.needs_wr());
            q.push(
                id,
                d,
                Some(vec![BytesMut::zeroed(8)]),
                Some(RecvMem::Slot(id as u32)),
            );
        }
        // Receive 3 withdrawn: its work request stays posted, spare.
        assert!(q.cancel(3, &credits).is_some());
        assert!(!q.needs_wr());
    }
    let old = retire_queue(&rxq, &credits);
    // Nothing ends at the give-up: the device may still fill them.
    assert!(r1.try_recv().unwrap().is_none() && r2.try_recv().unwrap().is_none());
    assert_eq!(credits.left(), 2, "the waiting receives keep their credits");
    {
        let o = lock(&old);
        assert_eq!((o.waiting(), o.posted()), (2, 3));
    }
    // The next queue pair's first receive posts a work request: the dead
    // one is not counted spare.
    {
        let q = lock(&rxq);
        assert_eq!((q.waiting(), q.posted()), (0, 0));
        assert!(q.needs_wr());
    }
    // The task's last step, every work request reported (here: none did,
    // the queue pair destroyed): each waiting receive fails `Canceled`
    // with its own buffers and its credit.
    let mut o = old.into_inner();
    fail_left(o.drain(), &credits, true);
    assert_eq!(credits.left(), 4, "every credit back");
    for r in [&mut r1, &mut r2] {
        canceled_once(r);
    }
}

#[test]
fn messages_a_given_up_queue_held_go_to_the_next_in_order() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    {
        let mut q = lock(&rxq);
        for n in [1, 2] {
            assert!(q.route(message(n), false, &credits).is_none(), "held");
        }
    }
    let old = retire_queue(&rxq, &credits);
    assert_eq!(lock(&old).take_held().map(|_| ()), None, "all carried");
    holds_in_order(&rxq, &[1, 2]);
}

#[test]
fn retired_sends_are_taken_and_none_is_posted_after() {
    let inflight = FastMutex::new(InflightQueue::default());
    let retired = AtomicBool::new(false);
    let mut keep = Vec::new();
    for id in 1..=3 {
        let (op, r) = send(id, Held::SendInline { len: 8 });
        lock(&inflight).insert(id, op);
        keep.push(r);
    }
    assert!(
        open_table(&inflight, &retired).is_some(),
        "a live link's posts go on"
    );
    let taken = retire_sends(&inflight, &retired);
    assert_eq!(taken.len(), 3);
    // What `post_send` and `post_rma` ask before posting: refused.
    assert!(
        open_table(&inflight, &retired).is_none(),
        "no post on a given-up link"
    );
    assert!(
        lock(&inflight).is_empty(),
        "the next link's table starts empty"
    );
    assert!(
        retired.load(Ordering::Relaxed),
        "posts look at it under the lock"
    );
}

#[test]
fn a_given_up_send_ends_with_its_completion_and_gives_back_its_credit() {
    let tx = Credits::new(4);
    let cases = [
        (Some(wc(1, WcStatus::WrFlushErr)), Err(Error::Canceled)),
        // Acked by the peer before the move: delivered, so a success.
        (Some(wc(2, WcStatus::Success)), Ok(8)),
        (Some(wc(3, WcStatus::RetryExcErr)), Err(Error::TimedOut)),
        // Never reported, the queue pair destroyed.
        (None, Err(Error::Canceled)),
    ];
    for (i, (c, want)) in cases.into_iter().enumerate() {
        assert!(tx.try_take());
        let (op, mut r) = send(i as u64, Held::SendInline { len: 8 });
        end_op(op, c.as_ref(), None, &tx, true);
        assert_eq!(tx.left(), 4, "credit back");
        let got = r
            .try_recv()
            .unwrap()
            .expect("completed")
            .into_result(0)
            .map(|e| e.len)
            .map_err(|e| e.err);
        assert_eq!(got, want, "case {i}");
    }
}

/// A pool that records what comes back, and whether the send's
/// completion was out by then.
#[derive(Default)]
struct Home {
    back: Mutex<usize>,
    /// The send's completion, looked at as its buffer comes back.
    done: Mutex<Option<futures::channel::oneshot::Receiver<Finished>>>,
    reported_first: Mutex<Option<bool>>,
}

impl PoolHome for Home {
    fn put_back(&self, _buf: Vec<BytesMut>) {
        *self.back.lock().unwrap() += 1;
        let seen = self
            .done
            .lock()
            .unwrap()
            .as_mut()
            .map(|r| r.try_recv().unwrap().is_some());
        *self.reported_first.lock().unwrap() = seen;
    }
    fn registration(&self) -> &(dyn Any + Send + Sync) {
        &()
    }
}

#[test]
fn a_given_up_pool_send_is_back_in_its_pool_before_it_is_reported() {
    let tx = Credits::new(1);
    let home = Arc::new(Home::default());
    let buf = PoolSend::new(BytesMut::zeroed(64), Vec::new(), home.clone());
    assert!(tx.try_take());
    let (op, r) = send(
        1,
        Held::SendPool {
            len: 64,
            _buf: Some(buf),
        },
    );
    *home.done.lock().unwrap() = Some(r);
    assert_eq!(
        *home.back.lock().unwrap(),
        0,
        "the device's until it reports"
    );
    end_op(op, Some(&wc(1, WcStatus::WrFlushErr)), None, &tx, true);
    assert_eq!(*home.back.lock().unwrap(), 1, "back in its pool");
    assert_eq!(
        *home.reported_first.lock().unwrap(),
        Some(false),
        "back before its completion is out"
    );
    let mut r = home.done.lock().unwrap().take().unwrap();
    let e = r.try_recv().unwrap().unwrap().into_result(1).unwrap_err();
    assert_eq!(e.err, Error::Canceled);
}

#[test]
fn only_messages_a_given_up_queue_held_are_carried() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    {
        let mut q = lock(&rxq);
        for a in [
            failed_arrival(Error::Trunc),
            message(1),
            remote_write_arrival(16),
            message(2),
        ] {
            assert!(q.route(a, false, &credits).is_none(), "held");
        }
    }
    let _old = retire_queue(&rxq, &credits);
    let mut q = lock(&rxq);
    for n in [1, 2] {
        let a = q.take_held().expect("carried");
        assert!(a.is_message(), "no failed receive nor write carried");
        let (done, mut r) = awaited(n);
        let w = Waiting::new(n, done, Some(vec![BytesMut::zeroed(8)]));
        assert!(crate::msg::complete::deliver(w, a).is_none());
        assert_eq!(number_of(r.try_recv().unwrap().unwrap()), n);
    }
    assert!(q.take_held().is_none());
}

/// Message `n` as its receive's completion gives it back.
fn returned(n: u64) -> weft_core::completion::Returned {
    let entry = CqEntry {
        len: 8,
        bufs: vec![BytesMut::from(&n.to_le_bytes()[..])],
        ..CqEntry::default()
    };
    weft_core::completion::Returned {
        entry,
        src: weft_core::addr::FI_ADDR_NOTAVAIL,
        origin: weft_core::completion::Origin {
            cq: None,
            cntr: None,
        },
        raw: Vec::new(),
    }
}

/// The messages `q` holds, read by receives in turn, are `numbers`.
fn holds_in_order(q: &FastMutex<RxQueue<RecvMem>>, numbers: &[u64]) {
    let mut q = lock(q);
    for &n in numbers {
        let a = q.take_held().expect("held");
        let (done, mut rx) = awaited(n);
        let w = Waiting::new(n, done, Some(vec![BytesMut::zeroed(8)]));
        assert!(crate::msg::complete::deliver(w, a).is_none());
        assert_eq!(number_of(rx.try_recv().unwrap().unwrap()), n);
    }
    assert!(q.take_held().is_none());
}

#[test]
fn a_message_given_back_after_the_give_up_goes_ahead_of_those_carried() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    // Messages 2 and 3 arrived with no receive waiting; message 1's
    // receive completed, its future not yet dropped.
    for n in [2, 3] {
        assert!(lock(&rxq).route(message(n), false, &credits).is_none());
    }
    // The give-up: 2 and 3 are the endpoint's queue's at once.
    let old = Arc::new(retire_queue(&rxq, &credits));
    // Message 1 given back while the task lives, no link current and no
    // receive waiting in the retired queue.
    back_via(&old, false, &rxq, &credits, false, returned(1));
    // A late message of the failed connection, carried at the task's end.
    assert!(lock(&old).route(message(4), false, &credits).is_none());
    carry_held(&mut lock(&old), &rxq, &credits);
    holds_in_order(&rxq, &[1, 2, 3, 4]);
}

type Queue = FastMutex<RxQueue<RecvMem>>;

/// [`give_back_routed`] with `old` the one retired queue.
fn back_via(
    old: &RetiredQueue,
    linked: bool,
    rxq: &Queue,
    credits: &Credits,
    closed: bool,
    r: weft_core::completion::Returned,
) {
    give_back_routed(linked, std::slice::from_ref(old), rxq, credits, closed, r);
}

/// A fresh endpoint queue and a retired queue in which receive 7 (its
/// credit taken from 4) still waits, with that receive's completion.
fn one_waiting_in_retired() -> (
    Credits,
    Queue,
    RetiredQueue,
    futures::channel::oneshot::Receiver<Finished>,
) {
    let credits = Credits::new(4);
    let old = RetiredQueue::default();
    assert!(credits.try_take());
    let (d, r) = awaited(7);
    lock(&old).push(7, d, Some(vec![BytesMut::zeroed(8)]), None);
    (credits, Queue::default(), old, r)
}

#[test]
fn a_message_given_back_takes_a_receive_still_waiting_in_the_retired_queue() {
    let (credits, rxq, old, mut r) = one_waiting_in_retired();
    back_via(&old, false, &rxq, &credits, false, returned(1));
    assert_eq!(number_of(r.try_recv().unwrap().unwrap()), 1);
    assert_eq!(credits.left(), 4, "its credit back");
    assert!(lock(&rxq).take_held().is_none());
}

#[test]
fn with_a_link_a_message_given_back_still_takes_a_receive_waiting_in_the_retired_queue() {
    // A receive of the failed connection still waits in the retired
    // queue (its task lives); the new connection is established and a
    // newer receive waits in its queue.
    let (credits, rxq, old, mut r) = one_waiting_in_retired();
    assert!(credits.try_take());
    let (d, mut newer) = awaited(8);
    lock(&rxq).push(8, d, Some(vec![BytesMut::zeroed(8)]), None);
    // Message 1 given back, then message 2 arrives on the new link.
    back_via(&old, true, &rxq, &credits, false, returned(1));
    assert_eq!(
        number_of(r.try_recv().unwrap().unwrap()),
        1,
        "the receive posted first reads the message that arrived first"
    );
    assert_eq!(lock(&old).waiting(), 0);
    assert!(newer.try_recv().unwrap().is_none(), "the newer still waits");
    // With none waiting there any more, the link's queue takes it.
    back_via(&old, true, &rxq, &credits, false, returned(2));
    assert_eq!(number_of(newer.try_recv().unwrap().unwrap()), 2);
    assert_eq!(credits.left(), 4);
}

fn returned_write() -> weft_core::completion::Returned {
    let mut r = returned(0);
    r.entry.flags = OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA;
    r.entry.bufs = Vec::new();
    r
}

#[test]
fn without_a_link_a_write_notification_given_back_is_not_carried() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    let old = RetiredQueue::default();
    back_via(&old, false, &rxq, &credits, false, returned_write());
    // The next connection's first receive reads its first message.
    assert!(lock(&rxq).route(message(3), false, &credits).is_none());
    holds_in_order(&rxq, &[3]);
}

#[test]
fn closed_with_no_link_a_given_back_message_completes_no_retired_receive() {
    let (credits, rxq, old, mut r) = one_waiting_in_retired();
    back_via(&old, false, &rxq, &credits, true, returned(1));
    assert!(r.try_recv().unwrap().is_none(), "no completion once closed");
    assert_eq!(lock(&old).waiting(), 1);
    assert!(lock(&rxq).take_held().is_none());
    // A close leaves the link in its slot: closed with a link, the
    // retired receive is not completed either.
    back_via(&old, true, &rxq, &credits, true, returned(2));
    assert!(r.try_recv().unwrap().is_none(), "no completion once closed");
    assert_eq!(lock(&old).waiting(), 1);
}

#[test]
fn a_retired_queue_leaves_the_list_alone_in_whatever_order_the_tasks_end() {
    let list = RetiredList::default();
    let first = RetiredQueue::default();
    let second = RetiredQueue::default();
    push_retired(&list, first.clone());
    push_retired(&list, second.clone());
    // The second give-up's task ends first: the first queue stays.
    clear_retired(&list, &second);
    {
        let l = lock(&list);
        assert_eq!(l.len(), 1);
        assert!(Arc::ptr_eq(&l[0], &first), "the earlier give-up's stays");
    }
    // Cleared twice (the task's end, then its guard): nothing else goes.
    push_retired(&list, second.clone());
    clear_retired(&list, &first);
    clear_retired(&list, &first);
    {
        let l = lock(&list);
        assert_eq!(l.len(), 1);
        assert!(Arc::ptr_eq(&l[0], &second));
    }
    clear_retired(&list, &second);
    assert!(lock(&list).is_empty());
}

#[test]
fn closed_with_no_link_a_message_given_back_is_dropped() {
    let credits = Credits::new(4);
    let rxq = FastMutex::new(RxQueue::<RecvMem>::default());
    give_back_routed(false, &[], &rxq, &credits, true, returned(1));
    assert!(lock(&rxq).take_held().is_none());
}

#[test]
fn once_closed_a_given_up_operation_ends_without_a_completion() {
    let tx = Credits::new(2);
    assert!(tx.try_take());
    let (op, mut r) = send(1, Held::SendInline { len: 8 });
    end_op(op, Some(&wc(1, WcStatus::Success)), None, &tx, false);
    assert_eq!(tx.left(), 2, "credit back");
    assert!(r.try_recv().is_err(), "no completion: its sender went");

    let rx = Credits::new(2);
    let q = FastMutex::new(RxQueue::<RecvMem>::default());
    assert!(rx.try_take());
    let (d, mut rr) = awaited(2);
    lock(&q).push(2, d, Some(vec![BytesMut::zeroed(8)]), None);
    fail_left(lock(&q).drain(), &rx, false);
    assert_eq!(rx.left(), 2);
    assert!(rr.try_recv().is_err(), "no completion");
}

/// A retired queue in which each receive of `contexts` waits with a work
/// request of its own (a bounce slot, id `100 + context`), credits taken
/// from `credits`, with the receives' completions.
fn retired_with(
    credits: &Credits,
    contexts: &[u64],
) -> (
    RetiredQueue,
    Vec<futures::channel::oneshot::Receiver<Finished>>,
) {
    let q = RetiredQueue::default();
    let mut rs = Vec::new();
    for &c in contexts {
        assert!(credits.try_take());
        let (d, r) = awaited(c);
        let id = 100 + c;
        lock(&q).push(
            id,
            d,
            Some(vec![BytesMut::zeroed(8)]),
            Some(RecvMem::Slot(id as u32)),
        );
        rs.push(r);
    }
    (q, rs)
}

fn canceled_once(r: &mut futures::channel::oneshot::Receiver<Finished>) {
    let done = r.try_recv().unwrap().expect("ended");
    let e = done.into_result(0).expect_err("failed");
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.bufs.len(), 1, "its buffers back");
}

#[test]
fn a_message_given_back_goes_to_the_oldest_give_ups_waiting_receive_first() {
    let credits = Credits::new(8);
    // Two give-ups whose tasks both live: receive 1 waits in the first
    // queue, receive 2 in the second; receive 3 in the current link's.
    let (first, mut r1) = retired_with(&credits, &[1]);
    let (second, mut r2) = retired_with(&credits, &[2]);
    let list = RetiredList::default();
    push_retired(&list, first.clone());
    push_retired(&list, second.clone());
    let rxq = Queue::default();
    assert!(credits.try_take());
    let (d, mut r3) = awaited(3);
    lock(&rxq).push(3, d, Some(vec![BytesMut::zeroed(8)]), None);
    let retired = lock(&list).clone();
    for n in [11, 12, 13] {
        give_back_routed(true, &retired, &rxq, &credits, false, returned(n));
    }
    assert_eq!(number_of(r1[0].try_recv().unwrap().unwrap()), 11);
    assert_eq!(number_of(r2[0].try_recv().unwrap().unwrap()), 12);
    assert_eq!(number_of(r3.try_recv().unwrap().unwrap()), 13);
    assert_eq!(credits.left(), 8, "every credit back");
    // Their work requests stay for the tasks to see reported.
    assert_eq!((lock(&first).posted(), lock(&second).posted()), (1, 1));
}

#[test]
fn a_first_retired_queue_with_none_waiting_passes_a_message_given_back_on() {
    let credits = Credits::new(8);
    // The first queue's receives: one withdrawn (its work request stays
    // posted, spare), one whose future went.
    let (first, mut rs) = retired_with(&credits, &[1, 2]);
    assert!(lock(&first).cancel(1, &credits).is_some());
    drop(rs.pop());
    let (second, mut r3) = retired_with(&credits, &[3]);
    let retired = [first.clone(), second.clone()];
    let rxq = Queue::default();
    give_back_routed(false, &retired, &rxq, &credits, false, returned(21));
    assert_eq!(number_of(r3[0].try_recv().unwrap().unwrap()), 21);
    assert_eq!(lock(&first).waiting(), 0, "the gone receive found out");
    assert_eq!(credits.left(), 8, "every credit back");
    // None waits anywhere now: with no link it is held first in the
    // endpoint's queue, ahead of what a give-up moved there.
    assert!(lock(&rxq).route(message(23), false, &credits).is_none());
    give_back_routed(false, &retired, &rxq, &credits, false, returned(22));
    holds_in_order(&rxq, &[22, 23]);
}

#[test]
fn without_a_link_a_write_notification_given_back_takes_a_retired_receive_or_goes() {
    let credits = Credits::new(8);
    let first = RetiredQueue::default();
    let (second, mut r) = retired_with(&credits, &[5]);
    let retired = [first, second];
    let rxq = Queue::default();
    give_back_routed(false, &retired, &rxq, &credits, false, returned_write());
    let e = r[0]
        .try_recv()
        .unwrap()
        .unwrap()
        .into_result(0)
        .expect("a write");
    assert!(e.flags.contains(OpFlags::REMOTE_WRITE));
    // None waits now: the next one is the failed connection's, dropped.
    give_back_routed(false, &retired, &rxq, &credits, false, returned_write());
    assert!(lock(&rxq).take_held().is_none());
    assert_eq!(credits.left(), 8);
}

#[test]
fn once_closed_no_retired_queue_is_offered_a_message_given_back() {
    let credits = Credits::new(8);
    let (first, mut r1) = retired_with(&credits, &[1]);
    let (second, mut r2) = retired_with(&credits, &[2]);
    let retired = [first, second];
    let rxq = Queue::default();
    // With a link (a close leaves it in its slot): held in its queue.
    give_back_routed(true, &retired, &rxq, &credits, true, returned(31));
    // Without: dropped.
    give_back_routed(false, &retired, &rxq, &credits, true, returned(32));
    assert!(r1[0].try_recv().unwrap().is_none() && r2[0].try_recv().unwrap().is_none());
    holds_in_order(&rxq, &[31]);
}

#[test]
fn cancel_ends_a_receive_of_a_retired_queue_once_and_its_work_request_stays() {
    let credits = Credits::new(8);
    let (first, mut r1) = retired_with(&credits, &[1, 2]);
    let (second, mut r2) = retired_with(&credits, &[3]);
    let retired = [first.clone(), second.clone()];
    assert!(cancel_retired(&retired, &credits, false, 3));
    canceled_once(&mut r2[0]);
    assert_eq!(credits.left(), 6, "its credit back at once");
    assert!(
        !cancel_retired(&retired, &credits, false, 3),
        "withdrawn once"
    );
    assert_eq!(credits.left(), 6);
    // Its work request is still the device's: the task waits for it.
    {
        let q = lock(&second);
        assert_eq!((q.waiting(), q.posted()), (0, 1));
    }
    // Its flush hands back only its memory: no receive ends with it.
    let (mem, own) = lock(&second).landed(103, &credits).expect("posted");
    assert!(own.is_none() && matches!(mem, RecvMem::Slot(103)));
    assert!(lock(&second).take_wrless(&credits).is_none());
    // A message that lands in it instead goes to the queue's next
    // waiting receive, or is held and carried at the task's end.
    assert!(cancel_retired(&retired, &credits, false, 1));
    canceled_once(&mut r1[0]);
    let (_, own) = lock(&first).landed(101, &credits).expect("posted");
    assert!(own.is_none());
    reroute_on(&first, &credits, message(41), false);
    assert_eq!(number_of(r1[1].try_recv().unwrap().unwrap()), 41);
    assert_eq!(credits.left(), 8, "every credit back, each once");
    // The task's last step finds nothing left to end.
    assert!(lock(&first).drain().is_empty() && lock(&second).drain().is_empty());
}

#[test]
fn cancel_takes_the_oldest_retired_receive_and_leaves_the_task_the_rest() {
    let credits = Credits::new(8);
    // The same context in both queues: the oldest give-up's goes.
    let (first, mut r1) = retired_with(&credits, &[4]);
    let (second, mut r2) = retired_with(&credits, &[4]);
    let retired = [first.clone(), second.clone()];
    assert!(cancel_retired(&retired, &credits, false, 4));
    canceled_once(&mut r1[0]);
    assert!(r2[0].try_recv().unwrap().is_none(), "the newer still waits");
    // Unknown context: nothing withdrawn.
    assert!(!cancel_retired(&retired, &credits, false, 9));
    // Once closed the tasks end them without completions.
    assert!(!cancel_retired(&retired, &credits, true, 4));
    assert!(r2[0].try_recv().unwrap().is_none());
    // The second task's last step (its work request reported): the
    // receive still waiting fails `Canceled` there, its credit back.
    let (_, own) = lock(&second).landed(104, &credits).expect("posted");
    let w = own.expect("still its receive's");
    fail_left(vec![(w, None)], &credits, true);
    canceled_once(&mut r2[0]);
    assert_eq!(credits.left(), 8);
    // The first task's: its withdrawn receive's memory only.
    assert!(lock(&first).drain().is_empty());
    assert_eq!(lock(&first).posted(), 1);
}

/// Pushes on `q` receive `context` whose buffer is its work request's
/// memory (work request `100 + context`), its credit taken: its
/// completion and where its buffer's bytes lie.
fn push_in_own_memory(
    q: &RetiredQueue,
    credits: &Credits,
    context: u64,
) -> (futures::channel::oneshot::Receiver<Finished>, *const u8) {
    assert!(credits.try_take());
    let (d, r) = awaited(context);
    let own = BytesMut::from(&b"own-mem!"[..]);
    let at = own.as_ptr();
    let mem = RecvMem::Registered {
        mrs: Default::default(),
        empty: vec![own],
    };
    lock(q).push(100 + context, d, None, Some(mem));
    (r, at)
}

/// Ends the receive of work request `id` of `q` as the task's last step
/// does, and checks it failed `Canceled` with its own buffer (at `at`).
fn flushed_with_own(
    q: &RetiredQueue,
    credits: &Credits,
    id: u64,
    r: &mut futures::channel::oneshot::Receiver<Finished>,
    at: *const u8,
) {
    let (mem, w) = lock(q).landed(id, credits).expect("posted");
    fail_left(vec![(w.expect("its receive's"), Some(mem))], credits, true);
    let e = r
        .try_recv()
        .unwrap()
        .expect("ended")
        .into_result(0)
        .expect_err("failed");
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.bufs.len(), 1);
    assert_eq!(e.bufs[0].as_ptr(), at, "its own buffer, not a stand-in");
}

/// A retired receive whose buffers are its work request's memory (a
/// registered or pool receive) is found by cancel but left to its flush,
/// which ends it `Canceled` with its own buffers: withdrawn at once it
/// would get stand-ins, and its own (a pool buffer among them) would stay
/// on a work request that can only be flushed.
#[test]
fn cancel_leaves_a_retired_receive_in_its_own_memory_to_its_flush() {
    let credits = Credits::new(4);
    let q = RetiredQueue::default();
    let (mut r, at) = push_in_own_memory(&q, &credits, 6);
    let retired = [q.clone()];
    assert!(cancel_retired(&retired, &credits, false, 6), "found");
    assert!(r.try_recv().unwrap().is_none(), "not ended with stand-ins");
    assert_eq!(credits.left(), 3, "its credit stays with it");
    assert_eq!(lock(&q).waiting(), 1);
    // Its flush reaches the task, whose last step ends it.
    flushed_with_own(&q, &credits, 106, &mut r, at);
    assert_eq!(credits.left(), 4);
}

/// A receive left to its flush by a cancel is handed no other message:
/// one that landed in a withdrawn receive's work request is held (the
/// task carries it on at its end), and the left receive still ends
/// `Canceled` with its own buffer when its flush comes.
#[test]
fn a_receive_left_to_its_flush_is_handed_no_other_message() {
    let credits = Credits::new(4);
    let q = RetiredQueue::default();
    // Receive 1 with a bounce slot, receive 2 in its own memory.
    assert!(credits.try_take());
    let (d1, mut r1) = awaited(1);
    lock(&q).push(
        101,
        d1,
        Some(vec![BytesMut::zeroed(8)]),
        Some(RecvMem::Slot(101)),
    );
    let (mut r2, at) = push_in_own_memory(&q, &credits, 2);
    let retired = [q.clone()];
    assert!(cancel_retired(&retired, &credits, false, 1));
    canceled_once(&mut r1);
    assert!(cancel_retired(&retired, &credits, false, 2));
    assert!(r2.try_recv().unwrap().is_none());
    // A message lands in receive 1's work request before the move.
    let (_, w) = lock(&q).landed(101, &credits).expect("posted");
    assert!(w.is_none(), "withdrawn");
    reroute_on(&q, &credits, message(51), false);
    assert!(
        r2.try_recv().unwrap().is_none(),
        "not handed to the left one"
    );
    holds_in_order(&q, &[51]);
    // Its flush ends it with its own buffer.
    flushed_with_own(&q, &credits, 102, &mut r2, at);
    assert_eq!(credits.left(), 4);
}
