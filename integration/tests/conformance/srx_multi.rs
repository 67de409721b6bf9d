//! Multi-receive buffers (`FI_MULTI_RECV`) on shared receive contexts:
//! one buffer takes the messages of every bound endpoint's peers, packed
//! from its start, each completing on the CQ of the endpoint it arrived
//! at with its sender; the release below the context's
//! `FI_OPT_MIN_MULTI_RECV`, cancel, and a dropped stream behave as on an
//! endpoint (`multi_recv.rs`). Every provider with shared contexts on its
//! connectionless endpoints has them (tcp, udp, shm, verbs RDM).

use std::collections::HashMap;

use bytes::BytesMut;
use futures::StreamExt;
use weft::{Caps, CqItem, EpOpt, Error, MultiRecvBuf, OpFlags, RecvMsg, RxAttr};
use weft_integration::{assert_cq_quiet, next_cq, within, Provider};

use super::multi_recv::{number_of, numbered};
use super::srx::{ok, rdm_rig, Rig};

/// Message `i` of client `k`: numbered `k * 1000 + i`.
fn tagged_num(k: usize, i: u64) -> u64 {
    k as u64 * 1000 + i
}

/// Sends, from each client in turn, the messages `range` of `len` bytes.
async fn round(r: &Rig, range: std::ops::Range<u64>, len: usize) {
    for i in range {
        for (k, c) in r.clients.iter().enumerate() {
            within("send", c.ep.send(r.to[k], numbered(tagged_num(k, i), len)))
                .await
                .unwrap();
        }
    }
}

/// Reads `n` completions from the servers' CQs (whichever has one):
/// each with the server it came on.
async fn collect(r: &Rig, n: usize) -> Vec<(usize, weft::CqEntry)> {
    let mut out = Vec::new();
    within("completions", async {
        while out.len() < n {
            let mut any = false;
            for (k, s) in r.servers.iter().enumerate() {
                let mut items = Vec::new();
                s.cq.try_read_batch(&mut items, 64);
                for it in items {
                    match it {
                        CqItem::Ok(e) => out.push((k, e)),
                        CqItem::Err(e) => panic!("server {k}: error completion {e:?}"),
                    }
                    any = true;
                }
            }
            if !any {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    })
    .await;
    out
}

/// Checks what a buffer took: every message once, each client's in its
/// order and at rising offsets, on the CQ of the server its client sent
/// to, reporting that client as its source where the endpoints report
/// sources; parts never overlap. Returns the numbers per client.
fn check_packed(
    r: &Rig,
    at: &MultiRecvBuf,
    got: &[(usize, weft::CqEntry)],
    context: u64,
) -> HashMap<usize, Vec<u64>> {
    let mut per: HashMap<usize, Vec<u64>> = HashMap::new();
    let mut last_off: HashMap<usize, usize> = HashMap::new();
    let mut ranges = Vec::new();
    for (k, e) in got {
        assert_eq!(e.context, context);
        assert!(e.flags.contains(OpFlags::RECV | OpFlags::MSG));
        let n = number_of(&e.bufs[0]);
        assert_eq!(
            n as usize / 1000,
            *k,
            "on the CQ of the server its client sent to"
        );
        let off = at.offset_of(e).expect("a part of the buffer");
        if let Some(prev) = last_off.insert(*k, off) {
            assert!(off > prev, "client {k}: in order in the buffer");
        }
        ranges.push((off, off + e.len));
        if r.servers[*k].ep.info().caps.contains(Caps::SOURCE) {
            assert_eq!(e.src, r.from[*k], "the sender, in the server's AV");
        }
        per.entry(*k).or_default().push(n % 1000);
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "parts overlap: {w:?}");
    }
    per
}

/// Several peers' messages, arriving at several bound endpoints, pack
/// into one buffer posted to the context; the buffer is released (the
/// flag on the completion that leaves less than the minimum free) and
/// its credit comes back; a message that does not fit releases the next
/// buffer by a completion without a message and goes on.
async fn srx_multi_packs_every_peer(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 3) else {
        return;
    };
    assert!(r.srx.attr().caps.contains(Caps::MULTI_RECV));
    assert_eq!(r.srx.getopt(EpOpt::MinMultiRecv), Ok(16 * 1024));
    r.srx.setopt(EpOpt::MinMultiRecv, 1024).unwrap();
    assert_eq!(r.srx.getopt(EpOpt::MinMultiRecv), Ok(1024));
    let size = h.info.rx_attr.size;
    let at = r.srx.post_recv_multi(BytesMut::zeroed(4096), 7).unwrap();
    assert_eq!(r.srx.rx_size_left().unwrap(), size - 1);
    // 3 clients x 4 messages of 256 bytes: 3072 used, 1024 free, not below
    // the minimum.
    round(&r, 0..4, 256).await;
    let got = collect(&r, 12).await;
    assert!(got
        .iter()
        .all(|(_, e)| !e.flags.contains(OpFlags::MULTI_RECV)));
    let per = check_packed(&r, &at, &got, 7);
    for k in 0..3 {
        assert_eq!(per[&k], [0, 1, 2, 3], "client {k}: each once, in order");
    }
    assert_eq!(r.srx.rx_size_left().unwrap(), size - 1, "still posted");
    // One more leaves 768 free: the last, flagged, on server 1's CQ.
    within(
        "send",
        r.clients[1]
            .ep
            .send(r.to[1], numbered(tagged_num(1, 4), 256)),
    )
    .await
    .unwrap();
    let e = ok(&r.servers[1].cq, "the last").await;
    assert!(e.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!(
        (number_of(&e.bufs[0]), at.offset_of(&e)),
        (1004, Some(3072))
    );
    assert_eq!(r.srx.rx_size_left().unwrap(), size, "released");
    for s in &r.servers {
        assert_cq_quiet(&s.cq, "nothing after the release").await;
    }
    // Never straddling: 600 + 600 in a buffer of 1000 (minimum 10).
    r.srx.setopt(EpOpt::MinMultiRecv, 10).unwrap();
    let first = r.srx.post_recv_multi(BytesMut::zeroed(1000), 8).unwrap();
    r.srx.post_recv(BytesMut::zeroed(1000), 9).unwrap();
    within(
        "send",
        r.clients[2]
            .ep
            .send(r.to[2], numbered(tagged_num(2, 5), 600)),
    )
    .await
    .unwrap();
    let e = ok(&r.servers[2].cq, "first").await;
    assert_eq!((e.context, e.len, first.offset_of(&e)), (8, 600, Some(0)));
    within(
        "send",
        r.clients[2]
            .ep
            .send(r.to[2], numbered(tagged_num(2, 6), 600)),
    )
    .await
    .unwrap();
    // The release without a message reports on the first bound
    // endpoint's CQ; the message goes on to the plain receive.
    let rel = ok(&r.servers[0].cq, "release").await;
    assert_eq!((rel.context, rel.len), (8, 0));
    assert!(rel.flags.contains(OpFlags::MULTI_RECV));
    assert!(!rel.flags.contains(OpFlags::MSG));
    let e = ok(&r.servers[2].cq, "the next receive").await;
    assert_eq!((e.context, number_of(&e.bufs[0])), (9, 2006));
    assert_eq!(r.srx.rx_size_left().unwrap(), size);
}

/// Refused input, with the buffer back: smaller than the context's
/// minimum (`MsgSize`), tagged or not one buffer (`BadFlags`, `Inval`),
/// on a context without `FI_MULTI_RECV` (`BadFlags`, no option), and a
/// minimum above the largest message (`MsgSize`); awaited through a bound
/// endpoint, the stream is the context's; cancel releases the buffer
/// with what it holds and hands it back.
async fn srx_multi_refusals_stream_and_cancel(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 2) else {
        return;
    };
    let size = h.info.rx_attr.size;
    let (e, b) = r
        .srx
        .post_recv_multi(BytesMut::zeroed(1000), 1)
        .unwrap_err();
    assert_eq!((e, b.len()), (Error::MsgSize, 1000));
    let (e, b) = r.servers[1]
        .ep
        .post_recv_multi(BytesMut::zeroed(1000), 1)
        .unwrap_err();
    assert_eq!(
        (e, b.len()),
        (Error::MsgSize, 1000),
        "through a bound endpoint"
    );
    let (e, _) = r
        .srx
        .post_recvmsg(
            RecvMsg::tagged(BytesMut::zeroed(1 << 16), 0, 1, 0, 1),
            OpFlags::MULTI_RECV,
        )
        .unwrap_err();
    assert_eq!(e, Error::BadFlags);
    let two = RecvMsg {
        bufs: vec![BytesMut::zeroed(1 << 15), BytesMut::zeroed(1 << 15)],
        ..RecvMsg::untagged(BytesMut::new(), 1)
    };
    assert_eq!(
        r.srx.post_recvmsg(two, OpFlags::MULTI_RECV).unwrap_err().0,
        Error::Inval
    );
    let too_big = h.info.ep_attr.max_msg_size + 1;
    assert_eq!(
        r.srx.setopt(EpOpt::MinMultiRecv, too_big),
        Err(Error::MsgSize)
    );
    assert_eq!(r.srx.setopt(EpOpt::CmDataSize, 1), Err(Error::NoProtoOpt));
    // The future form is one completion: refused.
    let e = within(
        "recvmsg",
        r.srx.recvmsg(
            RecvMsg::untagged(BytesMut::zeroed(1 << 16), 0),
            OpFlags::MULTI_RECV,
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::BadFlags);
    let plain = h
        .domain
        .srx_context_attr(&RxAttr {
            caps: Caps::MSG | Caps::RECV,
            ..RxAttr::default()
        })
        .unwrap();
    assert_eq!(plain.getopt(EpOpt::MinMultiRecv), Err(Error::NoProtoOpt));
    let (e, b) = plain
        .post_recv_multi(BytesMut::zeroed(1 << 16), 1)
        .unwrap_err();
    assert_eq!((e, b.len()), (Error::BadFlags, 1 << 16));
    assert_eq!(r.srx.rx_size_left().unwrap(), size, "nothing posted");

    // A stream awaited through server 1 takes server 0's messages too.
    r.srx.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    let buf = BytesMut::zeroed(8192);
    let base = buf.as_ptr() as usize;
    let mut s = within("post", r.servers[1].ep.recv_multi(buf))
        .await
        .unwrap();
    assert_eq!(r.srx.rx_size_left().unwrap(), size - 1);
    round(&r, 0..2, 200).await;
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    for _ in 0..4 {
        let m = within("stream", s.next()).await.unwrap().unwrap();
        let n = number_of(s.bytes(&m));
        let k = n / 1000;
        if r.servers[0].ep.info().caps.contains(Caps::SOURCE) {
            assert_eq!(m.src, r.from[k as usize]);
        }
        seen.entry(k).or_default().push(n % 1000);
    }
    assert_eq!(
        (seen[&0].as_slice(), seen[&1].as_slice()),
        (&[0, 1][..], &[0, 1][..])
    );
    s.cancel().unwrap();
    assert!(within("end", s.next()).await.is_none());
    assert!(s.is_canceled());
    let whole = s.into_buffer().expect("ended");
    assert_eq!((whole.len(), whole.as_ptr() as usize), (8192, base));
    assert!(whole[800..].iter().all(|&x| x == 0));
    assert_eq!(r.srx.rx_size_left().unwrap(), size, "released");
    // Posted and cancelled: the error, flagged, on the first bound
    // endpoint's CQ, with the space left.
    let at = r.srx.post_recv_multi(BytesMut::zeroed(4096), 3).unwrap();
    r.srx.cancel(3).unwrap();
    let CqItem::Err(c) = within("cancel", next_cq(&r.servers[0].cq)).await else {
        panic!("a cancel completed");
    };
    assert_eq!((c.context, c.err), (3, Error::Canceled));
    assert!(c.flags.contains(OpFlags::MULTI_RECV));
    assert_eq!((at.offset(&c.bufs[0]), c.bufs[0].len()), (Some(0), 4096));
    assert_eq!(r.srx.cancel(3), Err(Error::NoEnt));
}

/// A stream dropped part-way loses nothing: what it took and had not
/// yielded, from every peer, goes to the context's next receives, each
/// once and in its sender's order, ahead of later messages.
async fn srx_multi_dropped_stream_loses_nothing(p: Provider) {
    let Some((h, r)) = rdm_rig(&p, 2) else {
        return;
    };
    let size = h.info.rx_attr.size;
    r.srx.setopt(EpOpt::MinMultiRecv, 64).unwrap();
    for (pass, len) in [(0u64, 100usize), (1, 9_000)] {
        let mut s = within("post", r.srx.recv_multi(BytesMut::zeroed(1 << 17)))
            .await
            .unwrap();
        let base = pass * 100;
        round(&r, base..base + 5, len).await;
        let m = within("stream", s.next()).await.unwrap().unwrap();
        let first = number_of(s.bytes(&m));
        // Let the rest land in the buffer before the drop.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(s);
        assert_eq!(r.srx.rx_size_left().unwrap(), size, "withdrawn");
        // Posted, not awaited: a rendezvous send (verbs) completes only
        // once a receive has read it.
        for (k, c) in r.clients.iter().enumerate() {
            let m = numbered(tagged_num(k, base + 5), len);
            c.ep.post_send(r.to[k], m, base + 5).unwrap();
        }
        let mut next = [base; 2];
        next[(first / 1000) as usize] += 1;
        for _ in 0..11 {
            let e = within("recv", r.srx.recv(BytesMut::zeroed(len)))
                .await
                .unwrap();
            let n = number_of(&e.bufs[0]);
            let k = (n / 1000) as usize;
            assert_eq!(
                n % 1000,
                next[k],
                "client {k}: once, in order (pass {pass})"
            );
            next[k] += 1;
        }
        assert_eq!(next, [base + 6; 2]);
        for c in &r.clients {
            within("sent", next_cq(&c.cq)).await.unwrap();
        }
    }
    let left = r.srx.recv(BytesMut::zeroed(64));
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), left)
            .await
            .is_err(),
        "nothing twice"
    );
}

/// Many messages of mixed sizes (large ones read by RDMA on verbs) from
/// several peers at once, across buffers posted back to back: each
/// buffer packed, every message once and in its sender's order.
async fn srx_multi_many_across_buffers(p: Provider) {
    let Some((_h, r)) = rdm_rig(&p, 3) else {
        return;
    };
    r.srx.setopt(EpOpt::MinMultiRecv, 512).unwrap();
    const N: u64 = 60;
    let len = |i: u64| {
        if i % 5 == 4 {
            9_000
        } else {
            8 + (i as usize * 37) % 500
        }
    };
    let senders: Vec<_> = (0..r.clients.len())
        .map(|k| {
            let ep = r.clients[k].ep.clone();
            let to = r.to[k];
            tokio::spawn(async move {
                for i in 0..N {
                    ep.send(to, numbered(tagged_num(k, i), len(i)))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let total = N as usize * r.clients.len();
    let mut next = vec![0u64; r.clients.len()];
    let mut got = 0;
    let mut buffers = 0;
    let mut s = within("post", r.srx.recv_multi(BytesMut::zeroed(32 * 1024)))
        .await
        .unwrap();
    while got < total {
        let mut cur = s;
        s = within("post", r.srx.recv_multi(BytesMut::zeroed(32 * 1024)))
            .await
            .unwrap();
        let mut ranges = Vec::new();
        while got < total {
            let Some(m) = within("stream", cur.next()).await else {
                break;
            };
            let m = m.unwrap();
            let n = number_of(cur.bytes(&m));
            let k = (n / 1000) as usize;
            assert_eq!(n % 1000, next[k], "client {k}: once, in order");
            next[k] += 1;
            ranges.push((m.offset, m.offset + m.len));
            got += 1;
        }
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "packed, apart");
        buffers += 1;
    }
    drop(s);
    for t in senders {
        within("senders", t).await.unwrap();
    }
    assert!(next.iter().all(|&n| n == N));
    assert!(buffers > 3, "{buffers} buffers");
    // No message was left behind by the dropped last stream.
    let left = r.srx.recv(BytesMut::zeroed(16 * 1024));
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), left)
            .await
            .is_err()
    );
}

provider_tests! {
    srx_multi_packs_every_peer,
    srx_multi_refusals_stream_and_cancel,
    srx_multi_dropped_stream_loses_nothing,
    srx_multi_many_across_buffers,
}

shm_tests! {
    srx_multi_packs_every_peer,
    srx_multi_refusals_stream_and_cancel,
    srx_multi_dropped_stream_loses_nothing,
    srx_multi_many_across_buffers,
}

// udp loses what overruns its socket buffer or budget: the cases that
// send a bounded, paced amount are its.
udp_tests! {
    srx_multi_packs_every_peer,
    srx_multi_refusals_stream_and_cancel,
}
