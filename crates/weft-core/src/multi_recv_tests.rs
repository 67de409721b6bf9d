use super::*;
use crate::addr::FI_ADDR_UNSPEC;
use crate::completion::{CqFormat, CqItem, Returned, WaitMode};
use crate::credits::Credits;
use crate::recv_completion::{cancel_recv, deliver};
use crate::tagmatch::MsgInfo;

pub(crate) struct Ep(pub(crate) Credits);

impl RecvCtx for Ep {
    fn rx_credits(&self) -> &Credits {
        &self.0
    }
    fn reported_addr(&self, a: crate::addr::FiAddr) -> crate::addr::FiAddr {
        a
    }
    fn give_back(&self, _r: Returned) {}
}

fn ep() -> Ep {
    let c = Credits::new(4);
    assert!(c.try_take(), "the buffer's credit");
    Ep(c)
}

/// A multi-receive buffer of `cap` bytes reporting to `cq`.
pub(crate) fn buffer(cq: &Arc<CqShared>, cap: usize, min: usize) -> RecvReq {
    let mut req = RecvReq {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(cap)],
        tagged: false,
        tag: 0,
        ignore: 0,
        flags: OpFlags::MULTI_RECV,
        done: OpDone {
            context: 9,
            flags: OpFlags::RECV | OpFlags::MSG,
            report: true,
            cq: Some(cq.clone()),
            cntr: None,
            waiter: None,
        },
        multi: None,
    };
    attach(&mut req, min, None);
    req
}

pub(crate) fn msg(len: usize) -> MsgInfo {
    MsgInfo {
        src: 0,
        tagged: false,
        tag: 0,
        len,
        data: None,
        key: None,
    }
}

/// Fills a part with `len` bytes of `fill` and completes it.
fn land(ep: &Ep, mut part: RecvReq, len: usize, fill: u8) {
    let n = part.bufs[0].len().min(len);
    part.bufs[0][..n].fill(fill);
    deliver(ep, part, msg(len), n);
}

pub(crate) fn items(cq: &Arc<CqShared>) -> Vec<CqItem> {
    let mut out = Vec::new();
    cq.pop_batch(&mut out, 100);
    out
}

fn part(t: Take<RecvReq>) -> (RecvReq, bool) {
    match t {
        Take::Part(p) => (p, false),
        Take::Last(p) => (p, true),
        Take::Whole => panic!("a buffer is never taken whole"),
        Take::End => panic!("the buffer ended"),
    }
}

#[test]
fn messages_pack_and_the_last_completion_releases_below_the_minimum() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let mut b = buffer(&cq, 100, 30);
    let base = b.bufs[0].as_ptr() as usize;
    let (p1, last1) = part(take(&mut b, &msg(40)));
    let (p2, last2) = part(take(&mut b, &msg(20)));
    let (p3, last3) = part(take(&mut b, &msg(15)));
    assert_eq!((last1, last2, last3), (false, false, true), "25 < 30 free");
    land(&ep, p1, 40, 1);
    land(&ep, p2, 20, 2);
    assert_eq!(ep.0.left(), 3, "the buffer holds its credit until released");
    land(&ep, p3, 15, 3);
    assert_eq!(ep.0.left(), 4);
    let got = items(&cq);
    let mut offsets = Vec::new();
    for (i, it) in got.into_iter().enumerate() {
        let e = it.expect("completions");
        assert_eq!(e.context, 9);
        assert_eq!(e.flags.contains(OpFlags::MULTI_RECV), i == 2, "entry {i}");
        offsets.push((e.bufs[0].as_ptr() as usize - base, e.len));
        assert!(e.bufs[0].iter().all(|&x| x == i as u8 + 1));
    }
    assert_eq!(offsets, [(0, 40), (40, 20), (60, 15)]);
}

#[test]
fn a_message_that_does_not_fit_releases_the_buffer_and_goes_on() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let mut b = buffer(&cq, 100, 10);
    let (p1, _) = part(take(&mut b, &msg(60)));
    assert!(matches!(take(&mut b, &msg(50)), Take::End));
    // The part is still arriving: the release waits for it.
    end(&ep, b, false);
    assert!(items(&cq).is_empty());
    land(&ep, p1, 60, 1);
    let got = items(&cq);
    assert_eq!(got.len(), 1);
    let e = got.into_iter().next().unwrap().unwrap();
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(e.len, 60);
    assert_eq!(ep.0.left(), 4);

    // Nothing outstanding: a completion without a message releases it.
    let ep = self::ep();
    let mut b = buffer(&cq, 100, 10);
    let (p1, _) = part(take(&mut b, &msg(60)));
    land(&ep, p1, 60, 1);
    assert!(matches!(take(&mut b, &msg(50)), Take::End));
    end(&ep, b, false);
    let got = items(&cq);
    assert_eq!(got.len(), 2);
    let e = got.into_iter().nth(1).unwrap().unwrap();
    assert!(e.flags.contains(OpFlags::MULTI_RECV | OpFlags::RECV));
    assert_eq!((e.len, e.bufs[0].len()), (0, 0));
    assert_eq!(ep.0.left(), 4);
}

#[test]
fn a_message_larger_than_the_unused_buffer_is_truncated_into_it() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let mut b = buffer(&cq, 100, 10);
    let (p, last) = part(take(&mut b, &msg(150)));
    assert!(last);
    land(&ep, p, 150, 7);
    let e = items(&cq).pop().unwrap().unwrap_err();
    assert_eq!((e.err, e.len, e.olen), (Error::Trunc, 100, 50));
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
}

#[test]
fn cancel_releases_with_what_it_has_after_the_parts_complete() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let mut b = buffer(&cq, 100, 10);
    let (p1, _) = part(take(&mut b, &msg(30)));
    cancel_recv(&ep, b);
    assert!(items(&cq).is_empty(), "the part is still arriving");
    land(&ep, p1, 30, 1);
    let got = items(&cq);
    assert_eq!(got.len(), 2);
    let mut it = got.into_iter();
    let m = it.next().unwrap().unwrap();
    assert_eq!(m.len, 30);
    assert!(!m.flags.contains(OpFlags::MULTI_RECV));
    let c = it.next().unwrap().unwrap_err();
    assert_eq!(c.err, Error::Canceled);
    assert!(c.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(c.bufs[0].len(), 70, "the space left comes back");
    assert_eq!(ep.0.left(), 4);
}

#[test]
fn a_dead_part_leaves_its_range_unused_and_still_releases() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let mut b = buffer(&cq, 100, 50);
    let (p1, last) = part(take(&mut b, &msg(60)));
    assert!(last);
    drop_piece(&ep, p1);
    let e = items(&cq).pop().unwrap().unwrap();
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(e.len, 0);
    assert_eq!(ep.0.left(), 4);
}

#[test]
fn an_awaited_buffer_yields_in_buffer_order_and_ends() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = ep();
    let sink = MultiSink::new();
    let mut b = buffer(&cq, 100, 30);
    if let Some(MultiPart::Buffer(mb)) = &mut b.multi {
        Arc::get_mut(&mut mb.shared).expect("unshared").sink = Some(sink.clone());
    }
    let (p1, _) = part(take(&mut b, &msg(40)));
    let (p2, _) = part(take(&mut b, &msg(40)));
    drop(b);
    // The second completes first; the stream still yields the first.
    land(&ep, p2, 40, 2);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(sink.poll_next(&mut cx).is_pending());
    land(&ep, p1, 40, 1);
    let first = match sink.poll_next(&mut cx) {
        Poll::Ready(Some(f)) => f.into_result(0).unwrap(),
        _ => panic!("the first message"),
    };
    assert_eq!(first.bufs[0][0], 1);
    // The last completion carries the release; the stream keeps buffer
    // order and ends once everything is out.
    assert!(first.flags.contains(OpFlags::MULTI_RECV));
    let second = match sink.poll_next(&mut cx) {
        Poll::Ready(Some(f)) => f.into_result(0).unwrap(),
        _ => panic!("the second message"),
    };
    assert!(!second.flags.contains(OpFlags::MULTI_RECV));
    assert!(matches!(sink.poll_next(&mut cx), Poll::Ready(None)));
    assert!(cq.is_empty(), "the awaited form never reports to the CQ");
}

/// Records the lengths of the messages given back, in their order.
struct Recorder(Credits, std::sync::Mutex<Vec<usize>>);

impl RecvCtx for Recorder {
    fn rx_credits(&self) -> &Credits {
        &self.0
    }
    fn reported_addr(&self, a: crate::addr::FiAddr) -> crate::addr::FiAddr {
        a
    }
    fn give_back(&self, r: Returned) {
        self.1.lock().unwrap().push(r.info().len);
    }
}

/// A dropped stream gives back the completions already in its slots, in
/// order, while a part still arriving gives its message back itself once
/// whole. That keeps the order only if every part cut has its slot among
/// those the drop closes: no part is cut once the stream is closed (its
/// message goes on to the next receive, behind the ones given back).
#[test]
fn no_part_is_cut_once_the_stream_is_dropped() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let ep = Recorder(Credits::new(4), std::sync::Mutex::new(Vec::new()));
    assert!(ep.0.try_take(), "the buffer's credit");
    let sink = MultiSink::new();
    let mut b = buffer(&cq, 100, 10);
    if let Some(MultiPart::Buffer(mb)) = &mut b.multi {
        Arc::get_mut(&mut mb.shared).expect("unshared").sink = Some(sink.clone());
    }
    let (p1, _) = part(take(&mut b, &msg(20)));
    let n = p1.bufs[0].len();
    deliver(&ep, p1, msg(20), n);
    // The second is still arriving when the stream goes.
    let (p2, _) = part(take(&mut b, &msg(30)));
    let slots = sink.close();
    assert_eq!(slots.len(), 2, "both parts' slots are the drop's");
    assert!(sink.slot().is_none(), "no slot after the drop");
    assert!(matches!(take(&mut b, &msg(40)), Take::End));
    // The drop's part: what its slots hold, in order.
    for mut rx in slots {
        rx.close();
        if let Some(f) = rx.try_recv().ok().flatten() {
            ep.give_back_after(Returned::from_finished(f).expect("a message"));
        }
    }
    let n = p2.bufs[0].len();
    deliver(&ep, p2, msg(30), n);
    assert_eq!(*ep.1.lock().unwrap(), [20, 30]);
    end(&ep, b, true);
    assert_eq!(ep.0.left(), 4, "released once both parts are in");
}

/// What a provider taking the places of a dropped stream's parts still
/// arriving needs to know (`weft-verbs`' RDM endpoint): which buffer a
/// given-back message lies in, and whether the drop has given back what
/// its slots held (until then nobody else may take those places).
#[test]
fn a_buffer_knows_its_span_and_when_its_drop_has_given_back() {
    let cq = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 8);
    let sink = MultiSink::new();
    let mut b = buffer(&cq, 100, 10);
    if let Some(MultiPart::Buffer(mb)) = &mut b.multi {
        Arc::get_mut(&mut mb.shared).expect("unshared").sink = Some(sink.clone());
    }
    let start = b.bufs[0].as_ptr() as usize;
    let (p1, _) = part(take(&mut b, &msg(20)));
    let (p2, _) = part(take(&mut b, &msg(30)));
    let shared = buffer_of(&p2).expect("a part of a buffer");
    let at = |p: &RecvReq| p.bufs[0].as_ptr() as usize;
    assert_eq!(at(&p1), start);
    assert!(shared.holds(at(&p1)) && shared.holds(at(&p2)));
    assert!(shared.holds(start + 99), "the last byte");
    assert!(!shared.holds(start + 100) && !shared.holds(start.wrapping_sub(1)));
    assert!(!shared.is_abandoned() && !shared.is_drained());
    let slots = sink.close();
    assert!(shared.is_abandoned());
    assert!(!shared.is_drained(), "closed, not yet given back");
    drop(slots);
    sink.given_back();
    assert!(shared.is_drained());
}

/// `deliver_in` (the by-reference form the providers' arrival paths use)
/// reports exactly what `deliver` reports, for a receive that fits and
/// one that truncates, and leaves a request that owns nothing.
#[test]
fn deliver_in_reports_what_deliver_reports() {
    use crate::recv_completion::deliver_in;
    let req = |cq: &Arc<CqShared>| RecvReq {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(8)],
        tagged: true,
        tag: 5,
        ignore: 0,
        flags: OpFlags::empty(),
        done: OpDone {
            context: 3,
            flags: OpFlags::RECV | OpFlags::TAGGED,
            report: true,
            cq: Some(cq.clone()),
            cntr: None,
            waiter: None,
        },
        multi: None,
    };
    for len in [4, 12] {
        let info = MsgInfo {
            src: 7,
            tagged: true,
            tag: 5,
            len,
            data: Some(0xd),
            key: None,
        };
        let placed = len.min(8);
        let (by_value, by_ref) = (ep(), ep());
        let cq_a = CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, 4);
        let cq_b = CqShared::new(2, CqFormat::Tagged, WaitMode::Interrupt, 4);
        let mut a = req(&cq_a);
        a.bufs[0][..placed].fill(0xab);
        deliver(&by_value, a, info, placed);
        let mut b = req(&cq_b);
        b.bufs[0][..placed].fill(0xab);
        deliver_in(&by_ref, &mut b, &info, placed);
        assert!(b.owns_nothing(), "len {len}: the request was emptied");
        let take = |cq: &Arc<CqShared>| -> String {
            match cq.read(4) {
                Ok(v) => format!("{v:?}"),
                Err(Error::Avail) => format!("{:?}", cq.read_err()),
                Err(e) => format!("{e:?}"),
            }
        };
        let (got_a, got_b) = (take(&cq_a), take(&cq_b));
        assert_eq!(got_a, got_b, "len {len}");
        assert!(got_a.contains("context: 3"), "len {len}: {got_a}");
        assert_eq!(
            by_value.0.left(),
            by_ref.0.left(),
            "len {len}: the credit given back"
        );
    }
}
