//! Traffic classes on the verbs provider, on real RDMA devices (soft-RoCE
//! in the VM of `integration/run-rxe`): endpoints opened with
//! `tx_attr.tclass` (a DSCP value or an `FI_TC_*` label) carry it as the
//! IP TOS byte (DSCP << 2) in what the device holds for their traffic —
//! the address vector of a MSG or RDM connection's queue pair (read back
//! with `ibv_query_qp`), the address handles of a DGRAM endpoint — and a
//! datagram arrives with it in its IP header. Servers on rxe1, clients
//! on rxe2.
//!
//! Outside the VM every test is ignored; inside it a missing device is a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use weft::{AvFlags, EpType, Error, Fabric, FiAddr, Info, WaitMode, FI_ADDR_UNSPEC};
use weft_integration::{payload, verbs_offer, within, MsgPair, Node};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// Expedited forwarding.
const EF: u8 = 46;

/// The offer of `dev` for `ep_type` with traffic class `tclass`.
fn offer(dev: &str, ep_type: EpType, tclass: u32) -> Option<Info> {
    let mut info = verbs_offer(dev, ep_type)?;
    info.tx_attr.tclass = tclass;
    Some(info)
}

/// Inserts `peer` into `node`'s AV (awaiting its resolution).
async fn insert(node: &Node, peer: &Node) -> FiAddr {
    let addr = peer.ep.local_addr().unwrap();
    let rep = within(
        "dgram insert",
        node.av.insert(&[addr], AvFlags::empty(), 0).unwrap(),
    )
    .await;
    assert_eq!(rep.count, 1, "{rep:?}");
    rep.fi_addrs[0]
}

/// The IP TOS byte a class stands for (`None`: the device's default).
fn tos(tclass: u32) -> Option<u8> {
    weft::tclass::to_dscp(tclass).unwrap().map(|d| d << 2)
}

/// A connected MSG pair, rxe2 -> rxe1, each side opened with its class.
async fn msg_pair(server_tc: u32, client_tc: u32) -> Option<MsgPair> {
    let si = offer(SERVER_DEV, EpType::Msg, server_tc)?;
    let ci = offer(CLIENT_DEV, EpType::Msg, client_tc)?;
    Some(weft_integration::msg_pair(&si, &ci).await)
}

/// A message each way over a MSG pair.
async fn msg_exchange(p: &MsgPair, seed: u8) {
    for (from, to) in [(&p.cep, &p.sep), (&p.sep, &p.cep)] {
        let data = payload(3000, seed);
        let (got, sent) = within("msg exchange", async {
            tokio::join!(
                to.recv(BytesMut::zeroed(4096)),
                from.send(FI_ADDR_UNSPEC, data.clone())
            )
        })
        .await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], &data[..]);
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_connection_queue_pairs_carry_the_class() {
    use weft::tclass::*;
    for (i, tc) in [dscp_set(EF), LOW_LATENCY, SCAVENGER, UNSPEC]
        .into_iter()
        .enumerate()
    {
        let Some(p) = msg_pair(tc, tc).await else {
            return;
        };
        // The device default (rdma_cm's default RoCE TOS) is 0.
        let want = tos(tc).unwrap_or(0);
        for (ep, who) in [(&p.cep, "client"), (&p.sep, "server")] {
            let s = ep.stats().unwrap();
            eprintln!("msg tclass {tc:#x}: {who} QP traffic class {:?}", s.tclass);
            assert_eq!(s.tclass, Some(want), "{who}, class {tc:#x}");
        }
        msg_exchange(&p, i as u8).await;
    }
}

/// What the accepting side's queue pair carries when the two endpoints
/// ask for different classes: on RoCE the connect request carries the
/// connecting side's traffic class and the accepting side's path, and so
/// its QP's address vector, is built from it; the TOS the accepting
/// endpoint sets on its id before `rdma_accept` does not change it
/// (measured on rxe, Linux 6.1: server unspecified or DSCP 10, client
/// EF, both QPs 184).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_classes_that_differ_per_side() {
    use weft::tclass::*;
    for (stc, ctc) in [(UNSPEC, dscp_set(EF)), (dscp_set(10), dscp_set(EF))] {
        let Some(p) = msg_pair(stc, ctc).await else {
            return;
        };
        let (c, s) = (p.cep.stats().unwrap(), p.sep.stats().unwrap());
        eprintln!(
            "msg server {stc:#x} client {ctc:#x}: server QP {:?}, client QP {:?}",
            s.tclass, c.tclass
        );
        assert_eq!(c.tclass, tos(ctc), "the connecting side's own class");
        assert_eq!(s.tclass, tos(ctc), "the connecting side's class");
        msg_exchange(&p, 9).await;
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_connection_queue_pairs_carry_the_class() {
    use weft::tclass::*;
    for tc in [dscp_set(EF), BULK_DATA] {
        let (Some(si), Some(ci)) = (
            offer(SERVER_DEV, EpType::Rdm, tc),
            offer(CLIENT_DEV, EpType::Rdm, tc),
        ) else {
            return;
        };
        let s = Node::open(&si, WaitMode::Interrupt);
        let c = Node::open(&ci, WaitMode::Interrupt);
        assert_eq!(s.ep.stats().unwrap().tclass, None, "no connection yet");
        let to_s = c.handle_of(&s);
        let to_c = s.handle_of(&c);
        for (from, to, dest) in [(&c, &s, to_s), (&s, &c, to_c)] {
            let data = payload(20_000, 3);
            let (got, sent) = within("rdm exchange", async {
                tokio::join!(
                    to.ep.trecv(BytesMut::zeroed(20_000), FI_ADDR_UNSPEC, 7, 0),
                    from.ep.tsend(dest, data.clone(), 7)
                )
            })
            .await;
            sent.unwrap();
            assert_eq!(&got.unwrap().into_bytes()[..], &data[..]);
        }
        for (n, who) in [(&c, "client"), (&s, "server")] {
            let st = n.ep.stats().unwrap();
            eprintln!(
                "rdm tclass {tc:#x}: {who} {} conns, QP traffic class {:?}",
                st.conns, st.tclass
            );
            assert!(st.conns >= 1, "{who}");
            assert_eq!(st.tclass, tos(tc), "{who}, class {tc:#x}");
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgram_address_handles_and_datagrams_carry_the_class() {
    use weft::tclass::*;
    // Both with a class, then a client with one to a server without:
    // each endpoint's own handles carry its class.
    for (stc, ctc) in [
        (dscp_set(EF), dscp_set(EF)),
        (NETWORK_CTRL, NETWORK_CTRL),
        (UNSPEC, dscp_set(EF)),
    ] {
        let (Some(si), Some(ci)) = (
            offer(SERVER_DEV, EpType::Dgram, stc),
            offer(CLIENT_DEV, EpType::Dgram, ctc),
        ) else {
            return;
        };
        let s = Node::open(&si, WaitMode::Interrupt);
        let c = Node::open(&ci, WaitMode::Interrupt);
        let to_s = insert(&c, &s).await;
        let to_c = insert(&s, &c).await;
        for (from, to, dest, tc) in [(&c, &s, to_s, ctc), (&s, &c, to_c, stc)] {
            let (got, sent) = within("datagram", async {
                tokio::join!(
                    to.ep.recv(BytesMut::zeroed(64)),
                    from.ep.send(dest, Bytes::from_static(b"classy datagram"))
                )
            })
            .await;
            sent.unwrap();
            assert_eq!(&got.unwrap().into_bytes()[..], b"classy datagram");
            let want = tos(tc).unwrap_or(0);
            let (fs, ts) = (from.ep.stats().unwrap(), to.ep.stats().unwrap());
            eprintln!(
                "dgram class {tc:#x}: sender's AH {:?}, receiver saw {:?}",
                fs.tclass, ts.rx_tclass
            );
            assert_eq!(fs.tclass, Some(want), "sender's address handle");
            assert_eq!(ts.rx_tclass, Some(want), "IP TOS of the datagram");
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_that_is_neither_dscp_nor_label_is_inval() {
    for ep_type in [EpType::Msg, EpType::Rdm, EpType::Dgram] {
        let Some(info) = verbs_offer(SERVER_DEV, ep_type) else {
            return;
        };
        let fabric = Fabric::open(&info).unwrap();
        let domain = fabric.domain(&info).unwrap();
        for bad in [weft::tclass::dscp_set(64), weft::tclass::LABEL + 99, 7] {
            let mut b = info.clone();
            b.tx_attr.tclass = bad;
            assert_eq!(
                domain.endpoint(&b).unwrap_err(),
                Error::Inval,
                "{ep_type:?} {bad:#x}"
            );
            if ep_type == EpType::Msg {
                let eq = fabric.eq(4).unwrap();
                let r = fabric.passive_endpoint(&b, None).and_then(|p| {
                    p.bind_eq(&eq)?;
                    p.listen().map(|()| p)
                });
                assert_eq!(r.err(), Some(Error::Inval), "passive {bad:#x}");
            }
        }
    }
}
