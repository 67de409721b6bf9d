//! The verbs provider's RDM endpoints on a real RDMA device (soft-RoCE in
//! the VM of `integration/run-rxe`): Weft's protocol over RC connections
//! made on first use. Servers on rxe1 (10.66.0.1), clients on rxe2
//! (10.66.0.2), as on two hosts.
//!
//! Outside the VM every test prints why it is skipped; inside it a missing
//! device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::BytesMut;
use weft::{EpType, Error, FiAddr, OpFlags, RecvMsg, SendMsg, WaitMode, FI_ADDR_UNSPEC};
use weft_integration::{next_cq, payload, verbs_offer, within, Node, TIMEOUT};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// A server on rxe1 and a client on rxe2 that know each other:
/// `(server, client, client's handle of the server, server's handle of
/// the client)`.
fn pair(wait: WaitMode) -> Option<(Node, Node, FiAddr, FiAddr)> {
    let s = Node::open(&verbs_offer(SERVER_DEV, EpType::Rdm)?, wait);
    let c = Node::open(&verbs_offer(CLIENT_DEV, EpType::Rdm)?, wait);
    let to_s = c.handle_of(&s);
    let to_c = s.handle_of(&c);
    Some((s, c, to_s, to_c))
}

/// Every path (inline, slot, registered copy, rendezvous read; empty and
/// multi-megabyte), tagged and not, both ways, with CQ data, verified
/// byte for byte along with the reported source.
async fn exchange(wait: WaitMode) {
    let Some((s, c, to_s, to_c)) = pair(wait) else {
        return;
    };
    let sizes = [
        0usize,
        1,
        64,
        200,
        208,
        1000,
        4096,
        4097,
        65536,
        1 << 20,
        4 << 20,
    ];
    for (i, len) in sizes.into_iter().enumerate() {
        for (from, to, dest, src, dir) in [(&c, &s, to_s, to_c, 0u8), (&s, &c, to_c, to_s, 1u8)] {
            let tagged = i % 2 == 0;
            let data = payload(len, i as u8 ^ dir);
            let tag = 0x7a00 + i as u64;
            let (got, sent) = within("rdm exchange", async {
                tokio::join!(
                    to.ep.recvmsg(
                        RecvMsg {
                            src: FI_ADDR_UNSPEC,
                            bufs: vec![BytesMut::zeroed(len.max(1))],
                            tagged,
                            tag,
                            ..RecvMsg::default()
                        },
                        OpFlags::empty()
                    ),
                    from.ep.sendmsg(
                        SendMsg {
                            dest,
                            iov: vec![data.clone()],
                            tag: tagged.then_some(tag),
                            data: Some(0xC0DE_0000_0000 | len as u64),
                            ..SendMsg::default()
                        },
                        OpFlags::empty()
                    )
                )
            })
            .await;
            sent.unwrap_or_else(|e| panic!("send of {len} bytes: {e:?}"));
            let got = got.unwrap_or_else(|e| panic!("receive of {len} bytes: {e:?}"));
            assert_eq!(got.len, len, "length of a {len}-byte message");
            assert_eq!(got.data, 0xC0DE_0000_0000 | len as u64, "64-bit CQ data");
            assert_eq!(got.src, src, "source of a {len}-byte message");
            if tagged {
                assert_eq!(got.tag, tag);
                assert!(got.flags.contains(OpFlags::TAGGED));
            }
            assert_eq!(&got.into_bytes()[..], &data[..], "payload of {len} bytes");
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_exchange_interrupt() {
    exchange(WaitMode::Interrupt).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_exchange_inline() {
    exchange(WaitMode::Inline).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_exchange_busy_poll() {
    exchange(WaitMode::BusyPoll).await;
}

/// The header's forms for eager messages: sent bare (without the header,
/// `docs/wire.md` section 12) when untagged or with a tag below 2^16 and
/// no CQ data, with the header otherwise; each at the sizes around the
/// inline limit and the 4096-byte MTU, its receive posted before (matched
/// at arrival) or after (buffered, then matched) the message lands. What
/// arrives is the same whichever form carried it.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_bare_and_headed_forms() {
    // Interrupt mode: the receiver's CQ driver takes a message in as it
    // lands, whether or not a receive waits for it.
    let Some((s, c, to_s, to_c)) = pair(WaitMode::Interrupt) else {
        return;
    };
    // (tag, CQ data): bare untagged, bare tagged (smallest and largest
    // tag that fits), headed for a wider tag and for CQ data.
    let forms: [(Option<u64>, Option<u64>); 5] = [
        (None, None),
        (Some(0), None),
        (Some(0xffff), None),
        (Some(0x1_0000), None),
        (Some(0x7a), Some(0xC0DE)),
    ];
    let mut k = 0u8;
    for len in [0usize, 1, 200, 256, 257, 4000, 4048, 4096] {
        for (tag, data) in forms {
            for early in [true, false] {
                k = k.wrapping_add(1);
                let body = payload(len, k);
                // Each builder posts when called: the order of the calls
                // is the order of the posts.
                let send = || {
                    c.ep.sendmsg(
                        SendMsg {
                            dest: to_s,
                            iov: vec![body.clone()],
                            tag,
                            data,
                            ..SendMsg::default()
                        },
                        OpFlags::empty(),
                    )
                };
                let recv = || {
                    s.ep.recvmsg(
                        RecvMsg {
                            src: FI_ADDR_UNSPEC,
                            bufs: vec![BytesMut::zeroed(len.max(1))],
                            tagged: tag.is_some(),
                            tag: tag.unwrap_or(0),
                            ..RecvMsg::default()
                        },
                        OpFlags::empty(),
                    )
                };
                let got = within("rdm header forms", async {
                    if early {
                        let r = recv();
                        let (got, sent) = tokio::join!(r, send());
                        sent.unwrap();
                        got
                    } else {
                        // The send completes once the peer's device has
                        // the message; the pause lets the peer's driver
                        // take it in, unexpected, before the receive.
                        send().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        recv().await
                    }
                })
                .await
                .unwrap_or_else(|e| panic!("{len} bytes, tag {tag:?}, data {data:?}: {e:?}"));
                let what = format!("{len} bytes, tag {tag:?}, data {data:?}, early {early}");
                assert_eq!(got.len, len, "{what}");
                assert_eq!(got.src, to_c, "{what}");
                assert_eq!(got.flags.contains(OpFlags::TAGGED), tag.is_some(), "{what}");
                assert_eq!(got.tag, tag.unwrap_or(0), "{what}");
                assert_eq!(
                    got.flags.contains(OpFlags::REMOTE_CQ_DATA),
                    data.is_some(),
                    "{what}"
                );
                assert_eq!(got.data, data.unwrap_or(0), "{what}");
                assert_eq!(&got.into_bytes()[..], &body[..], "{what}");
            }
        }
    }
}

/// Messages that arrive before their receives (eager ones buffered,
/// rendezvous ones announced) are matched by tag later, in any order;
/// peek and claim see them too.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_unexpected_then_matched() {
    let Some((s, c, to_s, _)) = pair(WaitMode::Interrupt) else {
        return;
    };
    let lens = [10usize, 3000, 100_000, 1 << 20, 0, 77];
    for (i, &len) in lens.iter().enumerate() {
        c.ep.post_tsend(to_s, payload(len, i as u8), 100 + i as u64, i as u64)
            .unwrap();
    }
    // The eager ones complete at the sender before any receive exists.
    let mut eager_done = 0;
    while eager_done < 4 {
        let e = next_cq(&c.cq).await.unwrap();
        assert!(
            [0u64, 1, 4, 5].contains(&e.context),
            "only eager sends complete before a receive: {}",
            e.context
        );
        eager_done += 1;
    }
    // Peek at the 1 MiB one (announced only), claiming it for context 500.
    // The sender's completions say the device acknowledged the messages,
    // not that the receiver has polled them yet: until it has, a peek
    // rightly finds nothing (NoMsg) and is repeated.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let e = loop {
        let peek = RecvMsg {
            tagged: true,
            tag: 103,
            context: 500,
            ..RecvMsg::default()
        };
        s.ep.post_recvmsg(peek, OpFlags::PEEK | OpFlags::CLAIM)
            .unwrap();
        match next_cq(&s.cq).await {
            Err(e) if e.err == Error::NoMsg && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(
        (e.context, e.len),
        (500, 1 << 20),
        "peek reports the announced length"
    );
    // Receive in reverse order; the claimed one by its claim.
    for (i, &len) in lens.iter().enumerate().rev() {
        let (flags, context) = if i == 3 {
            (OpFlags::CLAIM, 500)
        } else {
            (OpFlags::empty(), 200 + i as u64)
        };
        let m = RecvMsg {
            bufs: vec![BytesMut::zeroed(len.max(1))],
            tagged: true,
            tag: 100 + i as u64,
            context,
            ..RecvMsg::default()
        };
        s.ep.post_recvmsg(m, flags).unwrap();
        let got = next_cq(&s.cq)
            .await
            .unwrap_or_else(|e| panic!("receive {i}: {e:?}"));
        assert_eq!((got.context, got.tag), (context, 100 + i as u64));
        assert_eq!(&got.into_bytes()[..], &payload(len, i as u8)[..]);
    }
    // Now the rendezvous sends are finished too.
    for _ in 0..2 {
        let e = next_cq(&c.cq).await.unwrap();
        assert!([2u64, 3].contains(&e.context));
    }
}

/// Truncation on both paths: the receive gets what fits and `Trunc` with
/// the overflow; the sender's operation succeeds.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_truncation() {
    let Some((s, c, to_s, _)) = pair(WaitMode::Interrupt) else {
        return;
    };
    for (len, cap) in [(2000usize, 100usize), (65536, 1000)] {
        let data = payload(len, 9);
        let (got, sent) = within("truncated exchange", async {
            tokio::join!(
                s.ep.recv(BytesMut::zeroed(cap)),
                c.ep.send(to_s, data.clone())
            )
        })
        .await;
        sent.unwrap();
        let e = got.expect_err("a truncated receive is an error completion");
        assert_eq!(e.err, Error::Trunc);
        assert_eq!((e.len, e.olen), (cap, len - cap));
        let b: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(&b[..], &data[..cap]);
    }
}

/// What `s` receives into `bufs` while `c` sends it `data` (the send
/// must succeed).
async fn recv_as_sent(
    s: &Node,
    c: &Node,
    to_s: FiAddr,
    bufs: Vec<BytesMut>,
    data: &bytes::Bytes,
) -> Result<weft::CqEntry, weft::CqErrEntry> {
    let recv = s.ep.recvmsg(
        RecvMsg {
            bufs,
            ..RecvMsg::default()
        },
        OpFlags::empty(),
    );
    let (got, sent) = within("receive while sending", async {
        tokio::join!(recv, c.ep.send(to_s, data.clone()))
    })
    .await;
    sent.unwrap_or_else(|e| panic!("send of {} bytes: {e:?}", data.len()));
    got
}

/// Rendezvous reads up to 128 KiB land in a staging slot and are copied
/// into the receive's buffers; larger ones, and those that find every
/// staging slot taken, read into the buffers registered. Both sides of
/// the limit, receives cut into several buffers (the copy crosses them)
/// or too short (truncated), and more concurrent reads than there are
/// staging slots, all arrive whole and in order; so do delivery-complete
/// messages pulled before any receive takes them.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_staged_and_registered_reads() {
    let Some((s, c, to_s, _)) = pair(WaitMode::Interrupt) else {
        return;
    };
    let cuts: [&[usize]; 3] = [&[], &[1], &[1000, 2000, 1095]];
    for (i, len) in [4097usize, 65536, 131_072, 131_073, 300_000]
        .into_iter()
        .enumerate()
    {
        for (k, cut) in cuts.iter().enumerate() {
            let data = payload(len, (i * 3 + k) as u8);
            let mut bufs: Vec<BytesMut> = cut.iter().map(|&n| BytesMut::zeroed(n)).collect();
            let rest = len - cut.iter().sum::<usize>();
            bufs.push(BytesMut::zeroed(rest));
            let got = recv_as_sent(&s, &c, to_s, bufs, &data).await;
            let got = got.unwrap_or_else(|e| panic!("receive of {len} bytes ({cut:?}): {e:?}"));
            assert_eq!(got.len, len);
            assert!(got.into_bytes()[..] == data[..], "{len} bytes cut {cut:?}");
        }
        // Truncated, into two buffers: the first `cap` bytes only.
        let cap = len / 2 + 3;
        let data = payload(len, 0xA0 ^ i as u8);
        let bufs = vec![BytesMut::zeroed(7), BytesMut::zeroed(cap - 7)];
        let got = recv_as_sent(&s, &c, to_s, bufs, &data).await;
        let e = got.expect_err("a truncated receive is an error completion");
        assert_eq!((e.err, e.len, e.olen), (Error::Trunc, cap, len - cap));
        let b: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        assert!(b[..] == data[..cap], "{len} bytes truncated to {cap}");
    }
    // Delivery-complete and unexpected: pulled into the receiver's own
    // buffer at once (staged up to the limit, registered past it), the
    // sends complete before any receive exists.
    let lens = [8192usize, 131_072, 131_073];
    for (i, &len) in lens.iter().enumerate() {
        let m = SendMsg {
            dest: to_s,
            iov: vec![payload(len, 0x60 + i as u8)],
            context: 900 + i as u64,
            ..SendMsg::default()
        };
        c.ep.post_sendmsg(m, OpFlags::DELIVERY_COMPLETE).unwrap();
    }
    for _ in &lens {
        let e = within("pulled", next_cq(&c.cq)).await.unwrap();
        assert!((900..903).contains(&e.context), "send {}", e.context);
    }
    for (i, &len) in lens.iter().enumerate() {
        let got = within("pulled message", s.ep.recv(BytesMut::zeroed(len))).await;
        let got = got.unwrap_or_else(|e| panic!("pulled {len} bytes: {e:?}"));
        assert!(
            got.into_bytes()[..] == payload(len, 0x60 + i as u8)[..],
            "pulled {len}"
        );
    }
    // Sixteen reads at once, more than a lane's staging slots: those that
    // find none free register their buffers; none is lost or reordered.
    let n = 16usize;
    let msgs: Vec<_> = (0..n).map(|i| payload(65536, 0x40 + i as u8)).collect();
    let recvs = futures::future::join_all((0..n).map(|_| s.ep.recv(BytesMut::zeroed(65536))));
    let sends = futures::future::join_all(msgs.iter().map(|m| c.ep.send(to_s, m.clone())));
    let (got, sent) = within("concurrent staged reads", async {
        tokio::join!(recvs, sends)
    })
    .await;
    for (i, (g, r)) in got.into_iter().zip(sent).enumerate() {
        r.unwrap_or_else(|e| panic!("send {i}: {e:?}"));
        let g = g.unwrap_or_else(|e| panic!("receive {i}: {e:?}"));
        assert!(g.into_bytes()[..] == msgs[i][..], "message {i} of {n}");
    }
}

/// Two endpoints that send to each other at the same moment connect once
/// (the crossing connects are resolved) and lose nothing; then many
/// messages each way stay in order.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_crossing_connects() {
    for round in 0..5u8 {
        let Some((s, c, to_s, to_c)) = pair(WaitMode::Interrupt) else {
            return;
        };
        for n in [&s, &c] {
            for i in 0..100u64 {
                n.ep.post_recv(BytesMut::zeroed(64), i).unwrap();
            }
        }
        let (a, b) = within("crossing first sends", async {
            tokio::join!(
                s.ep.send(to_c, payload(64, round)),
                c.ep.send(to_s, payload(64, round ^ 0xff))
            )
        })
        .await;
        a.unwrap();
        b.unwrap();
        for i in 1..100u64 {
            s.ep.post_send(to_c, payload(64, i as u8), 1000 + i)
                .unwrap();
            c.ep.post_send(to_s, payload(64, i as u8), 1000 + i)
                .unwrap();
        }
        for n in [&s, &c] {
            let mut next_recv = 0u64;
            let mut sends = 0;
            while next_recv < 100 || sends < 99 {
                let e = next_cq(&n.cq).await.unwrap();
                if e.context >= 1000 {
                    sends += 1;
                    continue;
                }
                assert_eq!(e.context, next_recv, "in order (round {round})");
                let want = if next_recv == 0 {
                    None
                } else {
                    Some(payload(64, next_recv as u8))
                };
                if let Some(w) = want {
                    assert_eq!(&e.into_bytes()[..], &w[..]);
                }
                next_recv += 1;
            }
        }
    }
}

/// Eight clients share the server's receive queue; each one's messages
/// arrive in order, from the right source.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_many_clients() {
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let Some(cinfo) = verbs_offer(CLIENT_DEV, EpType::Rdm) else {
        return;
    };
    let s = Node::open(&sinfo, WaitMode::Interrupt);
    let clients: Vec<Node> = (0..8)
        .map(|_| Node::open(&cinfo, WaitMode::Interrupt))
        .collect();
    let srcs: Vec<FiAddr> = clients.iter().map(|c| s.handle_of(c)).collect();
    const N: u64 = 50;
    for i in 0..N * clients.len() as u64 {
        s.ep.post_trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 0, u64::MAX, i)
            .unwrap();
    }
    for (k, c) in clients.iter().enumerate() {
        let to_s = c.handle_of(&s);
        for i in 0..N {
            let mut m = (k as u64).to_le_bytes().to_vec();
            m.extend_from_slice(&i.to_le_bytes());
            c.ep.post_tsend(to_s, m.into(), k as u64, i).unwrap();
        }
    }
    let mut next = vec![0u64; clients.len()];
    for _ in 0..N * clients.len() as u64 {
        let e = next_cq(&s.cq).await.unwrap();
        let k = e.tag as usize;
        assert_eq!(e.src, srcs[k], "source of client {k}");
        let b = e.into_bytes();
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), k as u64);
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            next[k],
            "client {k}'s messages in order"
        );
        next[k] += 1;
    }
}

/// A peer that closes with transfers outstanding: the sender's pending
/// rendezvous sends end with errors (no hang), and later sends to it fail.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_peer_closes_mid_transfer() {
    let Some((s, c, to_s, _)) = pair(WaitMode::Interrupt) else {
        return;
    };
    // Connect first, so the close finds an established connection.
    let (got, sent) = tokio::join!(
        s.ep.recv(BytesMut::zeroed(8)),
        c.ep.send(to_s, payload(8, 1))
    );
    got.unwrap();
    sent.unwrap();
    for i in 0..4u64 {
        c.ep.post_send(to_s, payload(1 << 20, i as u8), i).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.ep.close().unwrap();
    drop(s);
    for _ in 0..4 {
        let e = next_cq(&c.cq).await;
        let e = e.expect_err("an announced send to a closed peer fails");
        assert!(
            matches!(e.err, Error::ConnReset | Error::Canceled | Error::Io),
            "error of a send to a closed peer: {:?}",
            e.err
        );
    }
    let r = tokio::time::timeout(TIMEOUT * 3, c.ep.send(to_s, payload(16, 0))).await;
    let r = r.expect("a send to a closed peer ends");
    assert!(r.is_err(), "a send to a closed peer fails: {r:?}");
}

/// Receives waiting in the matcher can be cancelled.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_cancel() {
    let Some((s, _c, _, _)) = pair(WaitMode::Interrupt) else {
        return;
    };
    s.ep.post_trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 5, 0, 77)
        .unwrap();
    s.ep.cancel(77).unwrap();
    let e = next_cq(&s.cq).await.expect_err("a cancelled receive");
    assert_eq!((e.err, e.context), (Error::Canceled, 77));
    assert_eq!(s.ep.cancel(77), Err(Error::NoEnt));
}

/// Two endpoints on the same device reach each other too.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_same_device() {
    let Some(info) = verbs_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let a = Node::open(&info, WaitMode::Interrupt);
    let b = Node::open(&info, WaitMode::Interrupt);
    let to_b = a.handle_of(&b);
    for len in [16usize, 100_000] {
        let (got, sent) = within("same-device exchange", async {
            tokio::join!(
                b.ep.recv(BytesMut::zeroed(len)),
                a.ep.send(to_b, payload(len, 3))
            )
        })
        .await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], &payload(len, 3)[..]);
    }
}

/// A peer that goes silent (no disconnect reaches this side: here the
/// receiver on rxe2 is cut off, its packets to rxe1 lost) after
/// acknowledging a rendezvous send's announcement: the send, owed the
/// peer's "finished" and with nothing of its own on the device, is ended
/// by its connection's liveness probe, within a bounded time (the
/// probe's wait, two ticks of 5 s at most, and the transport retries,
/// about 24 s under the VM's emulation), never waits for ever.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_silent_peer_fails_owed_sends() {
    let Some((s, c, _, to_c)) = pair(WaitMode::Interrupt) else {
        return;
    };
    // Connected; then an announcement the client buffers (no receive is
    // posted), acknowledged by its device.
    let (got, sent) = tokio::join!(
        c.ep.recv(BytesMut::zeroed(8)),
        s.ep.send(to_c, payload(8, 1))
    );
    got.unwrap();
    sent.unwrap();
    s.ep.post_send(to_c, payload(64 << 10, 2), 7).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    weft_integration::assert_cq_quiet(&s.cq, "a rendezvous send waits for its receiver").await;
    let cut = weft_integration::rxe_net::Partition::rxe2_to_rxe1();
    let t = std::time::Instant::now();
    let e = s.cq.next_timeout(Duration::from_secs(90)).await;
    eprintln!("silent peer found after {:?}", t.elapsed());
    drop(cut);
    let e = e
        .expect("a send owed by a silent peer ends")
        .expect_err("a send owed by a silent peer fails");
    assert_eq!((e.context, e.err), (7, Error::ConnReset), "{e:?}");
}

/// Rendezvous payloads up to 128 KiB that the registration cache does
/// not hold are copied into a source slot and read through a memory
/// window; each window is revoked by the receiver's answer, so its slot
/// comes back for the next send (sequential sends all take one), even
/// when the receive took only part of the message. Larger payloads are
/// registered; so are sends that find every slot lent, after which a
/// buffer the cache registered that way goes from the cache. Nothing is
/// lost or reordered either way.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_sources_through_windows() {
    let Some((s, c, to_s, to_c)) = pair(WaitMode::Interrupt) else {
        return;
    };
    let windowed = |n: &Node| n.ep.stats().unwrap().tx_windowed;
    // Sizes that shrink and grow again: a slot's stale tail is cleared,
    // the bytes read are this message's.
    let sizes = [4097usize, 131_072, 10_000, 70_000, 65_536];
    for i in 0..20usize {
        let len = sizes[i % sizes.len()];
        let data = payload(len, i as u8);
        let g = recv_as_sent(&s, &c, to_s, vec![BytesMut::zeroed(len)], &data).await;
        let g = g.unwrap_or_else(|e| panic!("receive {i} of {len} bytes: {e:?}"));
        assert_eq!(g.len, len);
        assert!(
            g.into_bytes()[..] == payload(len, i as u8)[..],
            "message {i}"
        );
    }
    assert_eq!(windowed(&c), 20, "every sequential send took a window");
    assert_eq!(windowed(&s), 0);

    // Truncated receives read part of the slot and still revoke it.
    for i in 0..8u8 {
        let data = payload(65_536, 0x30 + i);
        let e = recv_as_sent(&s, &c, to_s, vec![BytesMut::zeroed(1000)], &data).await;
        let e = e.expect_err("truncated");
        assert_eq!((e.err, e.len, e.olen), (Error::Trunc, 1000, 64_536));
        let b: Vec<u8> = e.bufs.iter().flat_map(|b| b.iter().copied()).collect();
        assert!(b[..] == payload(65_536, 0x30 + i)[..1000]);
    }
    assert_eq!(windowed(&c), 28, "truncated receives gave their slots back");

    // A buffer the caller keeps and sends again is copied each time; a
    // payload past a slot is registered.
    let kept = payload(65_536, 0x51);
    for _ in 0..3 {
        let g = recv_as_sent(&s, &c, to_s, vec![BytesMut::zeroed(65_536)], &kept).await;
        assert!(g.unwrap().into_bytes()[..] == kept[..]);
    }
    assert_eq!(
        windowed(&c),
        31,
        "a kept buffer the cache does not hold is copied"
    );
    let big = payload(131_073, 0x52);
    let g = recv_as_sent(&s, &c, to_s, vec![BytesMut::zeroed(big.len())], &big).await;
    assert!(g.unwrap().into_bytes()[..] == big[..]);
    assert_eq!(windowed(&c), 31, "past a slot: registered");

    // Twelve at once each way, more than a lane's slots; the client sends
    // one buffer twelve times, so those that find no slot register it.
    let n = 12usize;
    let same = payload(65_536, 0x80);
    let recvs_s = futures::future::join_all((0..n).map(|_| s.ep.recv(BytesMut::zeroed(65_536))));
    let recvs_c = futures::future::join_all((0..n).map(|_| c.ep.recv(BytesMut::zeroed(65_536))));
    let sends_c = futures::future::join_all((0..n).map(|_| c.ep.send(to_s, same.clone())));
    let sends_s =
        futures::future::join_all((0..n).map(|i| s.ep.send(to_c, payload(65_536, 0xA0 + i as u8))));
    let (at_s, at_c, from_c, from_s) = within("concurrent windowed sends", async {
        tokio::join!(recvs_s, recvs_c, sends_c, sends_s)
    })
    .await;
    for (i, r) in from_c.into_iter().chain(from_s).enumerate() {
        r.unwrap_or_else(|e| panic!("send {i}: {e:?}"));
    }
    for (i, g) in at_s.into_iter().enumerate() {
        let g = g.unwrap_or_else(|e| panic!("receive {i} at the server: {e:?}"));
        assert!(g.into_bytes()[..] == same[..], "to s {i}");
    }
    for (i, g) in at_c.into_iter().enumerate() {
        let g = g.unwrap_or_else(|e| panic!("receive {i} at the client: {e:?}"));
        assert!(
            g.into_bytes()[..] == payload(65_536, 0xA0 + i as u8)[..],
            "to c {i}"
        );
    }
    let (wc, ws) = (windowed(&c) - 31, windowed(&s));
    assert!((4..=12).contains(&wc), "client windowed {wc} of {n}");
    assert!((4..=12).contains(&ws), "server windowed {ws} of {n}");
    // Registered by a send that found no slot, the buffer now goes from
    // the cache.
    let g = recv_as_sent(&s, &c, to_s, vec![BytesMut::zeroed(65_536)], &same).await;
    assert!(g.unwrap().into_bytes()[..] == same[..]);
    let after = windowed(&c) - 31;
    if wc < 12 {
        assert_eq!(after, wc, "a cached buffer is not copied");
    } else {
        assert_eq!(
            after,
            wc + 1,
            "no send found the slots lent: nothing cached"
        );
    }
}

/// A peer whose hello does not offer windows (here its endpoint opened
/// with `WEFT_VERBS_WINDOWS=0`, as a build or device without them would)
/// is sent registered buffers, and sends registered buffers itself; every
/// size arrives whole both ways.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_peer_without_windows() {
    let (Some(si), Some(ci)) = (
        verbs_offer(SERVER_DEV, EpType::Rdm),
        verbs_offer(CLIENT_DEV, EpType::Rdm),
    ) else {
        return;
    };
    let s = Node::open(&si, WaitMode::Interrupt);
    // Read when the endpoint opens; the tests of this file run one at a
    // time in the VM.
    std::env::set_var("WEFT_VERBS_WINDOWS", "0");
    let c = Node::open(&ci, WaitMode::Interrupt);
    std::env::remove_var("WEFT_VERBS_WINDOWS");
    let (to_s, to_c) = (c.handle_of(&s), s.handle_of(&c));
    for (i, len) in [4097usize, 65_536, 131_072].into_iter().enumerate() {
        for (from, to, dest) in [(&c, &s, to_s), (&s, &c, to_c)] {
            let data = payload(len, i as u8 ^ 0x5c);
            let got = recv_as_sent(to, from, dest, vec![BytesMut::zeroed(len)], &data).await;
            assert!(got.unwrap().into_bytes()[..] == data[..], "{len} bytes");
        }
    }
    assert_eq!(
        s.ep.stats().unwrap().tx_windowed,
        0,
        "the peer takes no windows"
    );
    assert_eq!(c.ep.stats().unwrap().tx_windowed, 0, "windows are off here");
}
