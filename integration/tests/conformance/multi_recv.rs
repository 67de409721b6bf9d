//! Multi-receive buffers (`FI_MULTI_RECV`, fi_msg(3)): one buffer takes
//! many messages, packed; the buffer is released once less than
//! `FI_OPT_MIN_MULTI_RECV` is free, the last completion carrying
//! `FI_MULTI_RECV`; messages never straddle. tcp has it on RDM and MSG
//! endpoints, verbs on RDM ones (its MSG receives are posted to the
//! device, not matched in software), shm on its RDM endpoints. Endpoints without the cap must
//! refuse it: no getinfo match, `BadFlags` on a post.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use weft::{
    BindFlags, Caps, CqAttr, CqEntry, EpOpt, EpType, Error, MultiMsg, MultiRecv, OpFlags, RecvMsg,
    SendMsg, WaitMode, FI_ADDR_UNSPEC,
};
use weft_integration::{
    assert_cq_quiet, enabled_endpoint, next_cq, within, Harness, Provider, RdmEp,
};

/// Message `i` of `len` bytes (at least 8): its number, then bytes that
/// depend on it.
pub(super) fn numbered(i: u64, len: usize) -> Bytes {
    let mut v = i.to_le_bytes().to_vec();
    v.extend((8..len.max(8)).map(|k| (k as u8).wrapping_mul(13) ^ i as u8));
    v.into()
}

/// The number of a received message, checking every byte of it.
pub(super) fn number_of(b: &[u8]) -> u64 {
    assert!(b.len() >= 8, "a numbered message has 8 bytes at least");
    let i = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert_eq!(b, &numbered(i, b.len())[..], "message {i} corrupted");
    i
}

/// The provider's harness when it offers multi-receive; otherwise checks
/// that it refuses it and returns `None`.
fn multi_harness(p: &Provider) -> Option<Harness> {
    let h = Harness::connless(p);
    if h.info.caps.contains(Caps::MULTI_RECV) {
        return Some(h);
    }
    assert!(
        !h.info
            .rx_attr
            .op_flags_supported
            .contains(OpFlags::MULTI_RECV),
        "{}: the flag without the cap",
        p.name
    );
    let asked = p.try_info_with(p.connless_type(), |h| {
        h.caps = Caps::MSG | Caps::MULTI_RECV;
    });
    assert!(asked.is_none(), "{}: matched FI_MULTI_RECV", p.name);
    None
}

/// Whether the provider's MSG endpoints have multi-receive too (given
/// that its connectionless ones do): tcp's only (verbs posts MSG
/// receives to the device; shm has no MSG endpoints).
fn multi_on_msg(p: &Provider) -> bool {
    p.name == "tcp"
}

async fn send_all(a: &RdmEp, dest: u64, msgs: impl IntoIterator<Item = Bytes>) {
    for m in msgs {
        within("send", a.ep.send(dest, m)).await.unwrap();
    }
}

async fn getinfo_offers_multi_recv_where_it_exists(p: Provider) {
    let Some(h) = multi_harness(&p) else {
        // Refused by the endpoint too: flag and option.
        let h = Harness::connless(&p);
        let (_, b, _, _) = h.rdm_pair();
        let e =
            b.ep.post_recv_multi(BytesMut::zeroed(1 << 16), 1)
                .unwrap_err();
        assert_eq!((e.0, e.1.len()), (Error::BadFlags, 1 << 16));
        assert_eq!(b.ep.getopt(EpOpt::MinMultiRecv), Err(Error::NoProtoOpt));
        return;
    };
    for ep_type in [p.connless_type(), EpType::Msg] {
        let asked = p.try_info_with(ep_type, |h| h.caps = Caps::MSG | Caps::MULTI_RECV);
        if ep_type == EpType::Msg && !multi_on_msg(&p) {
            assert!(asked.is_none(), "{}: MSG matched FI_MULTI_RECV", p.name);
            if let Some(msg) = p.try_info(EpType::Msg) {
                assert!(!msg.caps.contains(Caps::MULTI_RECV));
                assert!(!msg.rx_attr.op_flags_supported.contains(OpFlags::MULTI_RECV));
            }
            continue;
        }
        let info = asked.expect("multi-receive offered");
        assert!(info.caps.contains(Caps::MULTI_RECV));
        assert!(info.rx_attr.caps.contains(Caps::MULTI_RECV));
        assert!(!info.tx_attr.caps.contains(Caps::MULTI_RECV));
        assert!(info
            .rx_attr
            .op_flags_supported
            .contains(OpFlags::MULTI_RECV));
    }
    // Hints naming other primary caps get no multi-receive, and such an
    // endpoint refuses it (flag and option).
    let info = p
        .try_info_with(p.connless_type(), |h| h.caps = Caps::MSG)
        .unwrap();
    assert!(!info.caps.contains(Caps::MULTI_RECV));
    assert!(!info
        .rx_attr
        .op_flags_supported
        .contains(OpFlags::MULTI_RECV));
    let (_, b, _, _) = h.rdm_pair_with(&info);
    let e =
        b.ep.post_recv_multi(BytesMut::zeroed(1 << 16), 1)
            .unwrap_err();
    assert_eq!(e.0, Error::BadFlags);
    assert_eq!(b.ep.getopt(EpOpt::MinMultiRecv), Err(Error::NoProtoOpt));
    // The option: 16 KiB unless set, any size up to max_msg_size.
    let (_, b, _, _) = h.rdm_pair();
    assert_eq!(b.ep.getopt(EpOpt::MinMultiRecv), Ok(16 * 1024));
    b.ep.setopt(EpOpt::MinMultiRecv, 100).unwrap();
    assert_eq!(b.ep.getopt(EpOpt::MinMultiRecv), Ok(100));
    let too_big = h.info.ep_attr.max_msg_size + 1;
    assert_eq!(
        b.ep.setopt(EpOpt::MinMultiRecv, too_big),
        Err(Error::MsgSize)
    );
}

/// Posted form: messages packed from the start, each completion's buffer
/// its range of the posted one; released by the completion that leaves
/// less than the minimum free.
async fn messages_pack_and_release_below_min(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 100).unwrap();
    let at = b.ep.post_recv_multi(BytesMut::zeroed(1000), 7).unwrap();
    let left = b.ep.rx_size_left().unwrap();
    let lens = [300usize, 300, 300, 50];
    send_all(
        &a,
        b_in_a,
        lens.iter().enumerate().map(|(i, &l)| numbered(i as u64, l)),
    )
    .await;
    let mut offset = 0;
    for (i, &len) in lens.iter().enumerate() {
        let e: CqEntry = within("completion", next_cq(&b.cq)).await.unwrap();
        assert_eq!((e.context, e.len), (7, len));
        assert_eq!(at.offset_of(&e), Some(offset), "message {i}");
        assert!(e.flags.contains(OpFlags::RECV | OpFlags::MSG));
        // 100 free after the third is not below the minimum; 50 after the
        // fourth is.
        assert_eq!(e.flags.contains(OpFlags::MULTI_RECV), i == 3, "message {i}");
        assert_eq!(number_of(&e.bufs[0]), i as u64);
        offset += len;
    }
    assert_eq!(b.ep.rx_size_left().unwrap(), left + 1, "released");
    assert_cq_quiet(&b.cq, "nothing after the release").await;
}

/// A message that does not fit the space left never straddles: the
/// buffer is released by a completion without a message and the message
/// goes to the next buffer (or waits for one).
async fn messages_never_straddle(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 10).unwrap();
    let first = b.ep.post_recv_multi(BytesMut::zeroed(1000), 1).unwrap();
    send_all(&a, b_in_a, [numbered(0, 600), numbered(1, 600)]).await;
    let e = within("first", next_cq(&b.cq)).await.unwrap();
    assert_eq!((e.context, e.len, first.offset_of(&e)), (1, 600, Some(0)));
    let r = within("release", next_cq(&b.cq)).await.unwrap();
    assert_eq!((r.context, r.len), (1, 0));
    assert!(r.flags.contains(OpFlags::RECV | OpFlags::MULTI_RECV));
    assert!(!r.flags.contains(OpFlags::MSG), "no message in it");
    assert_eq!(first.offset_of(&r), Some(600), "where the free space began");
    // No buffer posted: the message waits for one.
    assert_cq_quiet(&b.cq, "the second message waits").await;
    let second = b.ep.post_recv_multi(BytesMut::zeroed(1000), 2).unwrap();
    let e = within("second", next_cq(&b.cq)).await.unwrap();
    assert_eq!((e.context, e.len, second.offset_of(&e)), (2, 600, Some(0)));
    assert_eq!(number_of(&e.bufs[0]), 1);
    // A message larger than a whole buffer is truncated into it.
    b.ep.cancel(2).unwrap();
    let c = within("cancel", next_cq(&b.cq)).await.unwrap_err();
    assert_eq!(c.err, Error::Canceled);
    b.ep.post_recv_multi(BytesMut::zeroed(100), 3).unwrap();
    send_all(&a, b_in_a, [numbered(2, 150)]).await;
    let t = within("truncated", next_cq(&b.cq)).await.unwrap_err();
    assert_eq!((t.err, t.len, t.olen), (Error::Trunc, 100, 50));
    assert!(t.flags.contains(OpFlags::MULTI_RECV));
}

/// Reads a stream to its end: the messages' numbers, each checked.
async fn drain(s: &mut MultiRecv) -> Vec<u64> {
    let mut got = Vec::new();
    while let Some(m) = within("stream", s.next()).await {
        let m: MultiMsg = m.unwrap();
        got.push(number_of(s.bytes(&m)));
    }
    got
}

/// The stream form: many messages across several buffers, in order, and
/// each buffer handed back whole with the messages where they were.
async fn many_messages_across_buffers_in_order(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 512).unwrap();
    const N: u64 = 300;
    let sizes: Vec<usize> = (0..N).map(|i| 8 + (i as usize * 37) % 500).collect();
    let msgs: Vec<Bytes> = (0..N).map(|i| numbered(i, sizes[i as usize])).collect();
    let sender = {
        let ep = a.ep.clone();
        tokio::spawn(async move {
            for m in msgs {
                ep.send(b_in_a, m).await.unwrap();
            }
        })
    };
    let mut got = Vec::new();
    let mut buffers = 0;
    let mut next = within("post", b.ep.recv_multi(BytesMut::zeroed(4096)))
        .await
        .unwrap();
    while (got.len() as u64) < N {
        // The next buffer is posted before this one is read: messages
        // that do not fit go on to it.
        let mut s = next;
        next = within("post", b.ep.recv_multi(BytesMut::zeroed(4096)))
            .await
            .unwrap();
        let mut offset = 0;
        let first = got.len();
        // The last buffer is not full when the last message is in it.
        while (got.len() as u64) < N {
            let Some(m) = within("stream", s.next()).await else {
                break;
            };
            let m = m.unwrap();
            assert_eq!(m.offset, offset, "packed");
            offset += m.len;
            got.push(number_of(s.bytes(&m)));
        }
        if (got.len() as u64) < N {
            let whole = s.into_buffer().expect("ended");
            assert_eq!(whole.len(), 4096);
            // The messages are where the stream said they were.
            if first < got.len() {
                let n = got[first];
                assert_eq!(number_of(&whole[..sizes[n as usize]]), n);
            }
        }
        buffers += 1;
    }
    drop(next);
    sender.await.unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    assert!(buffers > 10, "{buffers} buffers");
}

/// Dropping a stream part-way loses nothing: what it had not yielded goes
/// to the next receive, in order.
async fn dropped_stream_loses_nothing(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    let left = b.ep.rx_size_left().unwrap();
    let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(8192)))
        .await
        .unwrap();
    send_all(&a, b_in_a, (0..6).map(|i| numbered(i, 100))).await;
    for i in 0..2 {
        let m = within("stream", s.next()).await.unwrap().unwrap();
        assert_eq!(number_of(s.bytes(&m)), i);
    }
    // Let the other four land in the buffer before the drop.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    drop(s);
    assert_eq!(b.ep.rx_size_left().unwrap(), left, "withdrawn");
    send_all(&a, b_in_a, [numbered(6, 100)]).await;
    for i in 2..7 {
        let e = within("recv", b.ep.recv(BytesMut::zeroed(256)))
            .await
            .unwrap();
        assert_eq!(number_of(&e.bufs[0]), i);
    }
    // And a stream dropped before any message: the next one takes them.
    let s = within("post", b.ep.recv_multi(BytesMut::zeroed(8192)))
        .await
        .unwrap();
    drop(s);
    let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(8192)))
        .await
        .unwrap();
    send_all(&a, b_in_a, (7..9).map(|i| numbered(i, 100))).await;
    for i in 7..9 {
        let m = within("stream", s.next()).await.unwrap().unwrap();
        assert_eq!(number_of(s.bytes(&m)), i);
    }
}

/// Cancel releases the buffer with what it has: posted, a `Canceled`
/// error with `FI_MULTI_RECV` after its messages; awaited, the stream
/// yields them and ends.
async fn cancel_releases_the_buffer(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    let at = b.ep.post_recv_multi(BytesMut::zeroed(4096), 5).unwrap();
    send_all(&a, b_in_a, (0..2).map(|i| numbered(i, 200))).await;
    for i in 0..2 {
        let e = within("completion", next_cq(&b.cq)).await.unwrap();
        assert_eq!(number_of(&e.bufs[0]), i);
    }
    b.ep.cancel(5).unwrap();
    let c = within("cancel", next_cq(&b.cq)).await.unwrap_err();
    assert_eq!((c.context, c.err), (5, Error::Canceled));
    assert!(c.flags.contains(OpFlags::MULTI_RECV | OpFlags::RECV));
    assert_eq!(c.bufs.len(), 1, "the space left comes back");
    assert_eq!((at.offset(&c.bufs[0]), c.bufs[0].len()), (Some(400), 3696));
    assert_eq!(b.ep.cancel(5), Err(Error::NoEnt));

    let buf = BytesMut::zeroed(4096);
    let base = buf.as_ptr() as usize;
    let mut s = within("post", b.ep.recv_multi(buf)).await.unwrap();
    send_all(&a, b_in_a, (2..4).map(|i| numbered(i, 200))).await;
    let m = within("stream", s.next()).await.unwrap().unwrap();
    assert_eq!(number_of(s.bytes(&m)), 2);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    s.cancel().unwrap();
    assert_eq!(drain(&mut s).await, [3]);
    assert!(s.is_canceled());
    let whole = s.into_buffer().expect("ended");
    assert_eq!(whole.len(), 4096);
    assert_eq!(whole.as_ptr() as usize, base, "the same buffer, not a copy");
    assert_eq!(number_of(&whole[200..400]), 3);
    assert!(whole[400..].iter().all(|&x| x == 0));
}

/// Misuse is refused with its error and loses nothing.
async fn bad_multi_recv_input_is_refused(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    let left = b.ep.rx_size_left().unwrap();
    // Smaller than the minimum (16 KiB by default), or empty.
    for len in [0, 16 * 1024 - 1] {
        let (e, back) = b.ep.post_recv_multi(BytesMut::zeroed(len), 1).unwrap_err();
        assert_eq!((e, back.len()), (Error::MsgSize, len));
        let (e, back) = b.ep.recv_multi(BytesMut::zeroed(len)).await.unwrap_err();
        assert_eq!((e, back.len()), (Error::MsgSize, len));
    }
    b.ep.setopt(EpOpt::MinMultiRecv, 0).unwrap();
    let (e, _) = b.ep.post_recv_multi(BytesMut::new(), 1).unwrap_err();
    assert_eq!(e, Error::MsgSize);
    // Tagged: libfabric defines no tagged multi-receive.
    let mut m = RecvMsg::untagged(BytesMut::zeroed(1 << 16), 1);
    m.tagged = true;
    let (e, bufs) = b.ep.post_recvmsg(m, OpFlags::MULTI_RECV).unwrap_err();
    assert_eq!((e, bufs[0].len()), (Error::BadFlags, 1 << 16));
    // One buffer only.
    let m = RecvMsg {
        bufs: vec![BytesMut::zeroed(1 << 15), BytesMut::zeroed(1 << 15)],
        ..RecvMsg::untagged(BytesMut::new(), 1)
    };
    let (e, bufs) = b.ep.post_recvmsg(m, OpFlags::MULTI_RECV).unwrap_err();
    assert_eq!((e, bufs.len()), (Error::Inval, 2));
    // The awaited single receive: one future, one completion.
    let r =
        b.ep.recvmsg(
            RecvMsg::untagged(BytesMut::zeroed(1 << 16), 0),
            OpFlags::MULTI_RECV,
        )
        .await
        .unwrap_err();
    assert_eq!((r.err, r.bufs[0].len()), (Error::BadFlags, 1 << 16));
    // A transmit flag it is not.
    let msg = SendMsg {
        dest: b_in_a,
        iov: vec![numbered(0, 64)],
        tag: None,
        data: None,
        context: 0,
    };
    let r = a.ep.sendmsg(msg, OpFlags::MULTI_RECV).await.unwrap_err();
    assert_eq!(r.err, Error::BadFlags);
    // Nothing was posted or sent: the pair still works.
    assert_eq!(b.ep.rx_size_left().unwrap(), left);
    assert_cq_quiet(&b.cq, "refusals deliver nothing").await;
    send_all(&a, b_in_a, [numbered(1, 64)]).await;
    let e = within("recv", b.ep.recv(BytesMut::zeroed(64)))
        .await
        .unwrap();
    assert_eq!(number_of(&e.bufs[0]), 1);
    let _ = FI_ADDR_UNSPEC;
}

/// Multi-receive on a MSG endpoint: the stream form over a connection
/// (or, where MSG endpoints do not have it, its refusal there).
async fn multi_recv_on_msg_endpoints(p: Provider) {
    if multi_harness(&p).is_none() {
        return;
    }
    let info = p.info(EpType::Msg);
    let pair = weft_integration::msg_pair(&info, &info).await;
    if !multi_on_msg(&p) {
        let (e, back) = pair
            .sep
            .post_recv_multi(BytesMut::zeroed(1 << 16), 1)
            .unwrap_err();
        assert_eq!((e, back.len()), (Error::BadFlags, 1 << 16));
        let (e, _) = pair
            .sep
            .recv_multi(BytesMut::zeroed(1 << 16))
            .await
            .unwrap_err();
        assert_eq!(e, Error::BadFlags);
        assert_eq!(pair.sep.getopt(EpOpt::MinMultiRecv), Err(Error::NoProtoOpt));
        return;
    }
    pair.sep.setopt(EpOpt::MinMultiRecv, 128).unwrap();
    let mut s = within("post", pair.sep.recv_multi(BytesMut::zeroed(2048)))
        .await
        .unwrap();
    for i in 0..10 {
        within("send", pair.cep.send(FI_ADDR_UNSPEC, numbered(i, 200)))
            .await
            .unwrap();
    }
    // 9 x 200 = 1800: 248 free; the tenth (200) leaves 48 < 128.
    assert_eq!(drain(&mut s).await, (0..10).collect::<Vec<_>>());
    assert!(!s.is_canceled());
}

/// A zero-length message takes no room: the next one starts where it
/// stood, and each is told apart by its length.
async fn zero_length_messages_take_no_room(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(4096)))
        .await
        .unwrap();
    send_all(&a, b_in_a, [Bytes::new(), numbered(1, 100), Bytes::new()]).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = within("stream", s.next()).await.unwrap().unwrap();
        got.push((m.offset, m.len, s.bytes(&m).len()));
    }
    assert_eq!(got, [(0, 0, 0), (0, 100, 100), (100, 0, 0)]);
    s.cancel().unwrap();
    assert!(drain(&mut s).await.is_empty());
    let whole = s.into_buffer().unwrap();
    assert_eq!(number_of(&whole[..100]), 1);
}

/// Under selective completion the messages of a buffer posted without
/// `FI_COMPLETION` report nothing, but its release does (fi_msg(3): the
/// application must learn that its buffer is back).
async fn the_release_is_reported_under_selective_completion(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let a = h.rdm_ep();
    let b = h.rdm_ep_with(&h.info, h.av(), BindFlags::SELECTIVE_COMPLETION);
    let b_in_a = a.insert(&b);
    b.insert(&a);
    b.ep.setopt(EpOpt::MinMultiRecv, 100).unwrap();
    // 50 bytes free after the third: released.
    let at = b.ep.post_recv_multi(BytesMut::zeroed(350), 3).unwrap();
    send_all(&a, b_in_a, (0..3).map(|i| numbered(i, 100))).await;
    let e = within("release", next_cq(&b.cq)).await.unwrap();
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!((e.context, at.offset_of(&e), e.len), (3, Some(200), 100));
    assert_eq!(number_of(&e.bufs[0]), 2);
    assert_cq_quiet(&b.cq, "only the release").await;
}

/// The stream in every wait mode (inline and busy-poll streams drive
/// the endpoint themselves while they wait), with a counter bound: it
/// counts each message's completion, and the release.
async fn streams_in_every_wait_mode(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    for wait in [WaitMode::Interrupt, WaitMode::Inline, WaitMode::BusyPoll] {
        let (av_a, av_b) = (h.av(), h.av());
        let (a, _acq) = enabled_endpoint(&h.domain, &h.info, &av_a, wait);
        let cq = h
            .domain
            .cq(CqAttr {
                wait,
                ..CqAttr::default()
            })
            .unwrap();
        let cntr = h.domain.counter().unwrap();
        let b = h.domain.endpoint(&h.info).unwrap();
        b.bind_av(&av_b).unwrap();
        b.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        b.bind_counter(&cntr, BindFlags::RECV).unwrap();
        b.set_wait_mode(wait).unwrap();
        b.setopt(EpOpt::MinMultiRecv, 100).unwrap();
        b.enable().unwrap();
        let dest = av_a
            .insert_sync(&[b.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        let mut s = within("post", b.recv_multi(BytesMut::zeroed(1000)))
            .await
            .unwrap();
        let sends = async {
            for i in 0..5 {
                a.send(dest, numbered(i, 200)).await.unwrap();
            }
        };
        // 5 x 200 fill it: released by the fifth.
        let (got, ()) = within("exchange", async { tokio::join!(drain(&mut s), sends) }).await;
        assert_eq!(got, [0, 1, 2, 3, 4], "{wait:?}");
        assert_eq!(cntr.read(), 5, "{wait:?}");
        assert!(
            cq.try_read_batch(&mut Vec::new(), 8) == 0,
            "the CQ sees none of it"
        );
    }
}

/// Messages larger than a provider's eager limit (verbs RDM reads those
/// by RDMA, straight into their part of the buffer) pack like small
/// ones, mixed with small ones, and come out in order; one larger than
/// the whole unused buffer is truncated into it.
async fn large_messages_pack_too(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    // 65 100 bytes of 65 536: 436 left after the last, below the minimum.
    let lens = [10_000usize, 100, 20_000, 5_000, 30_000];
    let buf = BytesMut::zeroed(1 << 16);
    let base = buf.as_ptr() as usize;
    let mut s = within("post", b.ep.recv_multi(buf)).await.unwrap();
    let sender = {
        let ep = a.ep.clone();
        tokio::spawn(async move {
            for (i, &len) in lens.iter().enumerate() {
                ep.send(b_in_a, numbered(i as u64, len)).await.unwrap();
            }
        })
    };
    let mut offset = 0;
    for (i, &len) in lens.iter().enumerate() {
        let m = within("stream", s.next()).await.unwrap().unwrap();
        assert_eq!((m.offset, m.len), (offset, len), "message {i}");
        assert_eq!(m.flags.contains(OpFlags::MULTI_RECV), i == 4, "message {i}");
        assert_eq!(number_of(s.bytes(&m)), i as u64);
        offset += len;
    }
    assert!(within("end", s.next()).await.is_none());
    within("sends", sender).await.unwrap();
    let whole = s.into_buffer().expect("ended");
    assert_eq!((whole.as_ptr() as usize, whole.len()), (base, 1 << 16));
    assert_eq!(number_of(&whole[10_100..30_100]), 2);

    // Larger than the whole buffer: truncated into it, and released.
    let at = b.ep.post_recv_multi(BytesMut::zeroed(8192), 9).unwrap();
    let big = numbered(5, 12_000);
    let sender = {
        let ep = a.ep.clone();
        tokio::spawn(async move { ep.send(b_in_a, big).await })
    };
    let t = within("truncated", next_cq(&b.cq)).await.unwrap_err();
    assert_eq!((t.err, t.len, t.olen), (Error::Trunc, 8192, 12_000 - 8192));
    assert!(t.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(at.offset(&t.bufs[0]), Some(0));
    assert_eq!(&t.bufs[0][..], &numbered(5, 12_000)[..8192]);
    within("send", sender).await.unwrap().unwrap();
}

/// A stream dropped while large messages are still being read into it
/// loses nothing either: the ones it took come back in order, those
/// still arriving once they are whole, ahead of later messages.
async fn dropped_stream_with_large_messages_loses_nothing(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    let left = b.ep.rx_size_left().unwrap();
    let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(1 << 17)))
        .await
        .unwrap();
    const N: u64 = 8;
    let sender = {
        let ep = a.ep.clone();
        tokio::spawn(async move {
            for i in 0..N {
                ep.send(b_in_a, numbered(i, 9_000)).await.unwrap();
            }
        })
    };
    let m = within("stream", s.next()).await.unwrap().unwrap();
    assert_eq!(number_of(s.bytes(&m)), 0);
    // Dropped at once: later messages may be anywhere on their way.
    drop(s);
    for i in 1..N {
        let e = within("recv", b.ep.recv(BytesMut::zeroed(10_000)))
            .await
            .unwrap();
        assert_eq!((e.len, number_of(&e.bufs[0])), (9_000, i));
    }
    // Checked once every message is in: a part still being read at the
    // drop holds the buffer (and its credit) until it is whole.
    assert_eq!(b.ep.rx_size_left().unwrap(), left, "withdrawn");
    within("sends", sender).await.unwrap();
}

/// A stream dropped while one sender's large and small messages are in
/// it, pipelined (a large one may still be arriving while the small one
/// after it is in): the next receives get them in the sender's order.
async fn dropped_stream_keeps_a_senders_order(p: Provider) {
    let Some(h) = multi_harness(&p) else { return };
    let (a, b, b_in_a, _) = h.rdm_pair();
    b.ep.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    const N: u64 = 40;
    let len = |i: u64| if i % 2 == 0 { 9_000 } else { 100 };
    for round in 0..4u64 {
        let first = round * N;
        let mut s = within("post", b.ep.recv_multi(BytesMut::zeroed(1 << 20)))
            .await
            .unwrap();
        for i in first..first + N {
            a.ep.post_send(b_in_a, numbered(i, len(i)), i).unwrap();
        }
        let m = within("stream", s.next()).await.unwrap().unwrap();
        assert_eq!(number_of(s.bytes(&m)), first);
        // Dropped after a pause that grows by round, so that it finds
        // the later messages at different points of their way.
        tokio::time::sleep(std::time::Duration::from_millis(round * 3)).await;
        drop(s);
        for i in first + 1..first + N {
            let e = within("recv", b.ep.recv(BytesMut::zeroed(10_000)))
                .await
                .unwrap();
            assert_eq!((number_of(&e.bufs[0]), e.len), (i, len(i)), "round {round}");
        }
        for _ in 0..N {
            within("send", next_cq(&a.cq)).await.unwrap();
        }
    }
}

/// Every case but the MSG one, given to `$inst` (`provider_tests`,
/// `udp_tests` or `shm_tests`) with the `$extra` cases.
macro_rules! multi_cases {
    ($inst:ident $(, $extra:ident)*) => {
        $inst! {
            getinfo_offers_multi_recv_where_it_exists,
            messages_pack_and_release_below_min,
            messages_never_straddle,
            many_messages_across_buffers_in_order,
            dropped_stream_loses_nothing,
            cancel_releases_the_buffer,
            bad_multi_recv_input_is_refused,
            streams_in_every_wait_mode,
            the_release_is_reported_under_selective_completion,
            zero_length_messages_take_no_room,
            large_messages_pack_too,
            dropped_stream_with_large_messages_loses_nothing,
            dropped_stream_keeps_a_senders_order,
            $($extra,)*
        }
    };
}

multi_cases!(provider_tests, multi_recv_on_msg_endpoints);
// udp (DGRAM) and shm (RDM) have no MSG endpoints.
multi_cases!(udp_tests);
multi_cases!(shm_tests);
