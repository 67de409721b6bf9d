//! Event queues, completion queues and counters (fabtests eq_test,
//! cq_test, cntr_test).

use std::pin::pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::poll;
use weft::{
    BindFlags, CqAttr, CqFormat, EqErrEntry, EqEvent, EqEventKind, Error, OpFlags, WaitMode,
};
use weft_integration::{next_cq, within, Harness, Provider, TIMEOUT};

fn notify(ctx: u64, data: u64) -> EqEvent {
    EqEvent::new(EqEventKind::Notify, 0, ctx, data)
}

async fn eq_open_sizes(p: Provider) {
    let h = Harness::connless(&p);
    for shift in 0..=16u32 {
        let eq = h.fabric.eq(1 << shift).unwrap();
        assert!(eq.is_empty());
    }
    assert_eq!(h.fabric.eq(0).unwrap_err(), Error::Inval);
}

async fn eq_write_read_self(p: Provider) {
    let h = Harness::connless(&p);
    let eq = h.fabric.eq(8).unwrap();
    eq.write(Ok(notify(11, 111))).unwrap();
    eq.write(Ok(notify(22, 222))).unwrap();
    let a = eq.read(false).unwrap();
    assert_eq!((a.kind, a.context, a.data), (EqEventKind::Notify, 11, 111));
    let b = within("eq next", eq.next_timeout(TIMEOUT))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b.context, b.data), (22, 222));
    assert_eq!(eq.read(false).unwrap_err(), Error::Again);
}

async fn eq_peek_leaves_entry(p: Provider) {
    let h = Harness::connless(&p);
    let eq = h.fabric.eq(4).unwrap();
    eq.write(Ok(notify(1, 10))).unwrap();
    assert_eq!(eq.read(true).unwrap().context, 1);
    assert_eq!(eq.read(true).unwrap().context, 1);
    assert_eq!(eq.len(), 1);
    assert_eq!(eq.read(false).unwrap().data, 10);
    assert!(eq.is_empty());
}

async fn eq_readerr_without_error_is_again(p: Provider) {
    let h = Harness::connless(&p);
    let eq = h.fabric.eq(4).unwrap();
    assert_eq!(eq.read_err().unwrap_err(), Error::Again);
    eq.write(Ok(notify(1, 1))).unwrap();
    assert_eq!(eq.read_err().unwrap_err(), Error::Again);
    assert_eq!(eq.len(), 1, "readerr leaves a normal event queued");
    // An error at the head: read is Avail, readerr takes it.
    eq.read(false).unwrap();
    eq.write(Err(EqErrEntry {
        fid: 0,
        context: 9,
        data: 3,
        err: Error::Io,
        prov_errno: 5,
        err_data: vec![1, 2],
        peer_addr: None,
    }))
    .unwrap();
    assert_eq!(eq.read(false).unwrap_err(), Error::Avail);
    let e = eq.read_err().unwrap();
    assert_eq!((e.context, e.data, e.err), (9, 3, Error::Io));
    assert_eq!(e.err_data, vec![1, 2]);
    assert_eq!(eq.read_err().unwrap_err(), Error::Again);
}

async fn eq_size_respected(p: Provider) {
    let h = Harness::connless(&p);
    for size in [1usize, 2, 7] {
        let eq = h.fabric.eq(size).unwrap();
        for i in 0..size as u64 {
            eq.write(Ok(notify(i, i))).unwrap();
        }
        assert_eq!(
            eq.write(Ok(notify(99, 99))).unwrap_err(),
            Error::Again,
            "size {size}"
        );
        eq.read(false).unwrap();
        eq.write(Ok(notify(100, 100))).unwrap();
        assert_eq!(eq.len(), size);
    }
}

async fn eq_next_timeout_returns_again(p: Provider) {
    let h = Harness::connless(&p);
    let eq = h.fabric.eq(4).unwrap();
    let r = within(
        "eq sread with timeout",
        eq.next_timeout(Duration::from_millis(50)),
    )
    .await;
    assert_eq!(r.unwrap_err(), Error::Again);
}

async fn eq_next_timeout_woken_by_write(p: Provider) {
    let h = Harness::connless(&p);
    let eq = h.fabric.eq(4).unwrap();
    // The reader waits first (its first poll finds nothing), then the
    // write wakes it.
    let mut read = pin!(eq.next_timeout(TIMEOUT));
    assert!(poll!(read.as_mut()).is_pending(), "the queue is empty");
    eq.write(Ok(notify(5, 55))).unwrap();
    let ev = within("eq sread", read).await.unwrap().unwrap();
    assert_eq!(ev.data, 55);
}

async fn cq_open_sizes(p: Provider) {
    let h = Harness::connless(&p);
    for shift in [0u32, 1, 4, 8, 12, 16, 20] {
        let cq = h
            .domain
            .cq(CqAttr {
                size: 1 << shift,
                ..CqAttr::default()
            })
            .unwrap();
        assert!(cq.is_empty());
        assert_eq!(cq.read(1).unwrap_err(), Error::Again);
        assert_eq!(cq.read_err().unwrap_err(), Error::Again);
    }
    let zero = h.domain.cq(CqAttr {
        size: 0,
        ..CqAttr::default()
    });
    assert_eq!(zero.unwrap_err(), Error::Inval);
}

async fn cq_unspec_format_is_chosen(p: Provider) {
    let h = Harness::connless(&p);
    let cq = h
        .domain
        .cq(CqAttr {
            format: CqFormat::Unspec,
            ..CqAttr::default()
        })
        .unwrap();
    assert_ne!(cq.format(), CqFormat::Unspec);
}

async fn cq_signal_wakes_reader(p: Provider) {
    let h = Harness::connless(&p);
    for wait in [WaitMode::Interrupt, WaitMode::Inline, WaitMode::BusyPoll] {
        let cq = h
            .domain
            .cq(CqAttr {
                wait,
                ..CqAttr::default()
            })
            .unwrap();
        // Far longer than the test's timeout: only the signal ends it.
        let mut reader = pin!(cq.next_timeout(Duration::from_secs(3600)));
        assert!(poll!(reader.as_mut()).is_pending(), "{wait:?}: nothing yet");
        cq.signal();
        let got = within("signalled reader", reader).await;
        assert!(got.is_none(), "{wait:?}: a signal wakes with no item");
    }
}

/// Sends one tagged message with remote CQ data and returns the receive
/// entry as seen through a receive CQ of `format`.
async fn recv_entry_in_format(h: &Harness, format: CqFormat) -> weft::CqEntry {
    let rx_cq = h
        .domain
        .cq(CqAttr {
            format,
            ..CqAttr::default()
        })
        .unwrap();
    let tx = h.rdm_ep();
    let av = h.av();
    let ep = h.endpoint();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&rx_cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();
    let dest = tx
        .av
        .insert_sync(&[ep.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    ep.post_trecv(BytesMut::zeroed(32), weft::FI_ADDR_UNSPEC, 0x5A, 0, 0xC0)
        .unwrap();
    tx.ep
        .post_sendmsg(
            weft::SendMsg {
                dest,
                iov: vec![Bytes::from_static(b"format")],
                tag: Some(0x5A),
                data: Some(0xDA7A),
                context: 1,
            },
            OpFlags::REMOTE_CQ_DATA,
        )
        .unwrap();
    let e = next_cq(&rx_cq).await.unwrap();
    assert_eq!(e.context, 0xC0, "{format:?}: context always present");
    assert!(next_cq(&tx.cq).await.is_ok());
    e
}

async fn cq_formats_mask_fields(p: Provider) {
    let h = Harness::connless(&p);
    let e = recv_entry_in_format(&h, CqFormat::Context).await;
    assert!(e.flags.is_empty());
    assert_eq!((e.len, e.data, e.tag), (0, 0, 0));

    let e = recv_entry_in_format(&h, CqFormat::Msg).await;
    assert!(e.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
    assert_eq!(e.len, 6);
    assert_eq!((e.data, e.tag), (0, 0));

    let e = recv_entry_in_format(&h, CqFormat::Data).await;
    assert!(e.flags.contains(OpFlags::RECV | OpFlags::REMOTE_CQ_DATA));
    assert_eq!((e.len, e.data, e.tag), (6, 0xDA7A, 0));

    let e = recv_entry_in_format(&h, CqFormat::Tagged).await;
    assert!(e.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
    assert_eq!((e.len, e.data, e.tag), (6, 0xDA7A, 0x5A));
    assert_eq!(&e.into_bytes()[..], b"format");
}

async fn counter_ops_visible_immediately(p: Provider) {
    let h = Harness::connless(&p);
    let c = h.domain.counter().unwrap();
    assert_eq!((c.read(), c.read_err()), (0, 0));
    c.add(3);
    assert_eq!(c.read(), 3);
    c.set(10);
    assert_eq!(c.read(), 10);
    c.add(5);
    assert_eq!(c.read(), 15);
    c.add_err(2);
    assert_eq!(c.read_err(), 2);
    c.set_err(7);
    assert_eq!(c.read_err(), 7);
    c.add_err(1);
    assert_eq!(c.read_err(), 8);
    assert_eq!(c.read(), 15, "errors do not touch the success count");
    c.set(0);
    c.set_err(0);
    assert_eq!((c.read(), c.read_err()), (0, 0));
}

async fn counter_wait_threshold(p: Provider) {
    let h = Harness::connless(&p);
    let c = h.domain.counter().unwrap();
    // Already reached: resolves at once.
    c.set(4);
    assert_eq!(within("wait(4)", c.wait(4)).await.unwrap(), 4);
    // The wait is pending below the threshold and ends on reaching it.
    let mut wait = pin!(c.wait(10));
    for _ in 0..6 {
        assert!(poll!(wait.as_mut()).is_pending(), "at {}", c.read());
        c.add(1);
    }
    let v = within("wait(10)", wait).await.unwrap();
    assert_eq!(v, 10);
    assert_eq!(c.read(), 10);
}

async fn counter_wait_returns_avail_on_error(p: Provider) {
    let h = Harness::connless(&p);
    let c = h.domain.counter().unwrap();
    c.add_err(1);
    let mut wait = pin!(c.wait(100));
    assert!(
        poll!(wait.as_mut()).is_pending(),
        "earlier errors do not end a new wait"
    );
    c.add_err(1);
    let r = within("wait(100)", wait).await;
    assert_eq!(r.unwrap_err(), Error::Avail);
    assert_eq!(c.read_err(), 2);
}

async fn counter_counts_sends_and_recvs(p: Provider) {
    let h = Harness::connless(&p);
    let tx = h.rdm_ep();
    // Receiver with counters only (no CQ).
    let av = h.av();
    let ep = h.endpoint();
    let rc = h.domain.counter().unwrap();
    let sc = h.domain.counter().unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_counter(&sc, BindFlags::SEND).unwrap();
    ep.bind_counter(&rc, BindFlags::RECV).unwrap();
    ep.enable().unwrap();
    let dest = tx
        .av
        .insert_sync(&[ep.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    for i in 0..3 {
        ep.post_recv(BytesMut::zeroed(8), i).unwrap();
    }
    for i in 0..3 {
        tx.ep
            .post_send(dest, Bytes::from_static(b"cnt"), i)
            .unwrap();
    }
    assert_eq!(within("recv counter", rc.wait(3)).await.unwrap(), 3);
    assert_eq!(rc.read_err(), 0);
    assert_eq!(sc.read(), 0, "nothing was sent by the receiver");
}

/// A closed CQ or EQ ends its stream after what is queued, for every
/// handle; closing one that an open endpoint is bound to is `Busy`.
async fn closed_queues_end_their_streams(p: Provider) {
    use futures::StreamExt;
    let h = Harness::connless(&p);
    let a = h.rdm_ep();
    let eq = h.fabric.eq(4).unwrap();
    let ep = h.endpoint();
    ep.bind_eq(&eq).unwrap();
    assert_eq!(
        a.cq.close().unwrap_err(),
        Error::Busy,
        "bound to an endpoint"
    );
    assert_eq!(eq.close().unwrap_err(), Error::Busy, "bound to an endpoint");
    let av = h.av();
    let eq2 = h.fabric.eq(4).unwrap();
    av.bind_eq(&eq2, 0).unwrap();
    assert_eq!(eq2.close().unwrap_err(), Error::Busy, "bound to an AV");
    av.close().unwrap();
    eq2.close().unwrap();

    ep.close().unwrap();
    eq.write(Ok(notify(1, 5))).unwrap();
    let mut reader = eq.clone();
    let waiting = tokio::spawn(async move {
        let first = reader.next().await;
        let end = reader.next().await;
        (first, end)
    });
    eq.close().unwrap();
    let (first, end) = within("eq stream end", waiting).await.unwrap();
    assert_eq!(first.unwrap().unwrap().data, 5, "queued events come first");
    assert!(end.is_none(), "then the stream ends");

    a.ep.close().unwrap();
    let mut cq = a.cq.clone();
    let waiting = tokio::spawn(async move { cq.next().await });
    a.cq.close().unwrap();
    assert!(within("cq stream end", waiting).await.unwrap().is_none());
}

/// `Counter::wait_timeout` gives up with `TimedOut`; `Counter::changes`
/// yields every state the counter reached (coalescing what came between
/// two polls) and wakes on each change.
async fn counter_wait_timeout_and_changes(p: Provider) {
    use futures::StreamExt;
    let h = Harness::connless(&p);
    let c = h.domain.counter().unwrap();
    let r = within("wait_timeout", c.wait_timeout(1, Duration::from_millis(50))).await;
    assert_eq!(r.unwrap_err(), Error::TimedOut);
    let mut changes = c.changes();
    let c2 = c.clone();
    let adder = tokio::spawn(async move {
        tokio::task::yield_now().await;
        c2.add(2);
    });
    assert_eq!(within("change", changes.next()).await, Some((2, 0)));
    adder.await.unwrap();
    c.add_err(1);
    assert_eq!(within("error change", changes.next()).await, Some((2, 1)));
    c.add(1);
    c.add(1);
    assert_eq!(within("coalesced", changes.next()).await, Some((4, 1)));
    assert_eq!(
        within("reached", c.wait_timeout(4, Duration::from_secs(1)))
            .await
            .unwrap(),
        4
    );
}

provider_tests! {
    eq_open_sizes,
    eq_write_read_self,
    eq_peek_leaves_entry,
    eq_readerr_without_error_is_again,
    eq_size_respected,
    eq_next_timeout_returns_again,
    eq_next_timeout_woken_by_write,
    cq_open_sizes,
    cq_unspec_format_is_chosen,
    cq_signal_wakes_reader,
    cq_formats_mask_fields,
    counter_ops_visible_immediately,
    counter_wait_threshold,
    counter_wait_returns_avail_on_error,
    counter_counts_sends_and_recvs,
    closed_queues_end_their_streams,
    counter_wait_timeout_and_changes,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints.
udp_tests! {
    eq_open_sizes,
    eq_write_read_self,
    eq_peek_leaves_entry,
    eq_readerr_without_error_is_again,
    eq_size_respected,
    eq_next_timeout_returns_again,
    eq_next_timeout_woken_by_write,
    cq_open_sizes,
    cq_unspec_format_is_chosen,
    cq_signal_wakes_reader,
    cq_formats_mask_fields,
    counter_ops_visible_immediately,
    counter_wait_threshold,
    counter_wait_returns_avail_on_error,
    counter_counts_sends_and_recvs,
    closed_queues_end_their_streams,
    counter_wait_timeout_and_changes,
}

// The cases that apply to shm.
shm_tests! {
    eq_open_sizes,
    eq_write_read_self,
    eq_peek_leaves_entry,
    eq_readerr_without_error_is_again,
    eq_size_respected,
    eq_next_timeout_returns_again,
    eq_next_timeout_woken_by_write,
    cq_open_sizes,
    cq_unspec_format_is_chosen,
    cq_signal_wakes_reader,
    cq_formats_mask_fields,
    counter_ops_visible_immediately,
    counter_wait_threshold,
    counter_wait_returns_avail_on_error,
    counter_counts_sends_and_recvs,
    closed_queues_end_their_streams,
    counter_wait_timeout_and_changes,
}
