//! A server with 64 peers on one shared receive context (tcp; RDM on
//! shm and, in the VM of `integration/run-rxe`, verbs too): every
//! peer's messages are delivered exactly once and in order per peer, the
//! server's receive buffers are the context's fixed window whatever the
//! number of peers, and what peers make it buffer stays within the
//! context's `total_buffered_recv` (more peers, or more bound endpoints,
//! add none), each connection within its own share of it. Loopback
//! only; bounded counts and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::pin::pin;

use bytes::{Bytes, BytesMut};
use futures::poll;
use weft::{
    CompletionQueue, CqItem, EpType, Error, OpFlags, RecvMsg, RxAttr, SharedRxContext,
    SHARED_CONTEXT,
};
use weft_integration::srx::{accept_onto_srx, srx_rdm_ep};
use weft_integration::{next_cq, within, Harness, Provider, RdmEp};

/// Receives the server keeps posted on the context: its receive memory.
const WINDOW: usize = 16;
/// Largest message, and so each posted buffer's size.
const MAX_LEN: usize = 4096;
/// The context's unexpected budget: far below what the peers send.
const BUDGET: usize = 256 << 10;
/// Messages per peer.
const PER_PEER: u32 = 40;

fn harness(ep_type: EpType) -> Harness {
    harness_of("tcp", ep_type)
}

fn harness_of(name: &'static str, ep_type: EpType) -> Harness {
    let p = Provider::named(name);
    let info = p
        .try_info_with(ep_type, |h| h.ep_attr.rx_ctx_cnt = SHARED_CONTEXT)
        .unwrap_or_else(|| panic!("{name} offers shared receive contexts"));
    Harness::with_info(&p, info)
}

fn context(h: &Harness) -> SharedRxContext {
    h.domain
        .srx_context_attr(&RxAttr {
            size: WINDOW,
            total_buffered_recv: BUDGET,
            ..RxAttr::default()
        })
        .unwrap()
}

/// Peer `peer`'s message `seq`: its numbers, then a length and filler
/// that depend on both.
fn message(peer: u16, seq: u32) -> Bytes {
    let len = 6 + (peer as usize * 131 + seq as usize * 977) % (MAX_LEN - 6);
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&peer.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.resize(len, (peer as u8) ^ (seq as u8));
    Bytes::from(b)
}

/// What the server saw.
struct Seen {
    /// Peers served.
    peers: usize,
    /// Most unexpected bytes the context held at a completion.
    peak_unexpected: usize,
    /// Most receives posted at once.
    peak_posted: usize,
}

/// Keeps `WINDOW` receives posted on `srx` and takes `peers * PER_PEER`
/// completions from `cq`, each the next message of its peer.
async fn serve(srx: &SharedRxContext, cq: &CompletionQueue, peers: usize, tagged: bool) -> Seen {
    let post = |i: u64| {
        let buf = BytesMut::zeroed(MAX_LEN);
        if tagged {
            srx.post_trecv(buf, weft::FI_ADDR_UNSPEC, 0, u64::MAX, i)
        } else {
            srx.post_recv(buf, i)
        }
    };
    for i in 0..WINDOW as u64 {
        post(i).unwrap();
    }
    let mut next = vec![0u32; peers];
    let mut seen = Seen {
        peers,
        peak_unexpected: 0,
        peak_posted: 0,
    };
    for n in 0..peers * PER_PEER as usize {
        let posted = WINDOW - srx.rx_size_left().unwrap();
        seen.peak_posted = seen.peak_posted.max(posted);
        let e = match within("a completion", next_cq(cq)).await {
            CqItem::Ok(e) => e,
            CqItem::Err(e) => panic!("error completion {e:?}"),
        };
        seen.peak_unexpected = seen.peak_unexpected.max(srx.stats().unexpected_bytes);
        let context = e.context;
        let tag = e.tag;
        let b = e.into_bytes();
        let peer = u16::from_le_bytes([b[0], b[1]]);
        let seq = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        if tagged {
            assert_eq!(tag, u64::from(peer), "tag of peer {peer}");
        }
        assert_eq!(
            seq, next[peer as usize],
            "peer {peer}: each message once, in order (completion {n})"
        );
        assert_eq!(b, message(peer, seq), "peer {peer} message {seq}");
        next[peer as usize] += 1;
        post(context).unwrap();
    }
    assert!(next.iter().all(|&n| n == PER_PEER), "{next:?}");
    seen
}

/// The context once the run is over: nothing left over, nothing more.
async fn assert_drained(srx: &SharedRxContext, cq: &CompletionQueue) {
    assert_drained_of(srx, cq).await;
    // The window is still posted: cancelled, each comes back whole.
    for i in 0..WINDOW as u64 {
        srx.cancel(i).unwrap();
    }
    for _ in 0..WINDOW {
        let CqItem::Err(e) = within("canceled", next_cq(cq)).await else {
            panic!("a window receive took a message");
        };
        assert_eq!(e.bufs[0].len(), MAX_LEN);
    }
}

/// MSG: `peers` clients, each accepted onto an endpoint bound to the
/// context (all reporting to one CQ), each sending `PER_PEER` messages.
async fn msg_run(peers: usize) -> Seen {
    let h = harness(EpType::Msg);
    let srx = context(&h);
    let cq = h.cq();
    let (kept, _pep) = accept_onto_srx(&h, &srx, peers, Some(&cq)).await;
    let senders: Vec<_> = kept
        .iter()
        .enumerate()
        .map(|(k, conn)| {
            let c = conn.client.clone();
            tokio::spawn(async move {
                for seq in 0..PER_PEER {
                    c.send(0, message(k as u16, seq)).await.unwrap();
                }
            })
        })
        .collect();
    let seen = serve(&srx, &cq, peers, false).await;
    for s in senders {
        within("senders", s).await.unwrap();
    }
    assert_drained(&srx, &cq).await;
    for conn in &kept {
        // Nothing is buffered at the endpoints themselves.
        assert_eq!(conn.ep.stats().unwrap().unexpected_bytes, 0);
    }
    seen
}

/// RDM on provider `name`: `peers` clients over `eps` server endpoints
/// bound to the context (one AV, one CQ), tagged messages tagged with
/// the peer's number.
async fn rdm_run(name: &'static str, peers: usize, eps: usize) -> Seen {
    let h = harness_of(name, EpType::Rdm);
    let srx = context(&h);
    let cq = h.cq();
    let av = h.av();
    let servers: Vec<RdmEp> = (0..eps)
        .map(|_| srx_rdm_ep(&h, &av, &cq, &srx, None))
        .collect();
    let senders: Vec<_> = (0..peers)
        .map(|k| {
            let c = h.rdm_ep();
            let to = c.insert(&servers[k % eps]);
            tokio::spawn(async move {
                for seq in 0..PER_PEER {
                    c.ep.tsend(to, message(k as u16, seq), k as u64)
                        .await
                        .unwrap();
                }
                c
            })
        })
        .collect();
    let seen = serve(&srx, &cq, peers, true).await;
    let mut clients = Vec::new();
    for s in senders {
        clients.push(within("senders", s).await.unwrap());
    }
    assert_drained(&srx, &cq).await;
    drop(clients);
    seen
}

fn check(what: &str, few: &Seen, many: &Seen) {
    eprintln!(
        "{what}: peak unexpected bytes {} ({} peers) vs {} ({} peers), budget {BUDGET}; \
         peak posted receives {} vs {}, window {WINDOW}",
        few.peak_unexpected,
        few.peers,
        many.peak_unexpected,
        many.peers,
        few.peak_posted,
        many.peak_posted
    );
    for s in [few, many] {
        assert!(s.peak_unexpected <= BUDGET, "{what}: over the budget");
        assert!(
            s.peak_posted <= WINDOW,
            "{what}: more receives than the window"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_server_with_64_peers_on_one_context() {
    let few = msg_run(8).await;
    let many = msg_run(64).await;
    check("MSG", &few, &many);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_server_with_64_peers_on_one_context() {
    let few = rdm_run("tcp", 8, 4).await;
    let many = rdm_run("tcp", 64, 4).await;
    check("RDM", &few, &many);
}

/// The same on shm: 64 peers over 4 bound endpoints fill each one's 16
/// channels; a channel whose next message finds neither a receive nor
/// budget waits (its sender's ring fills), and posting to the context
/// looks at it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_rdm_server_with_64_peers_on_one_context() {
    let few = rdm_run("shm", 8, 4).await;
    let many = rdm_run("shm", 64, 4).await;
    check("shm RDM", &few, &many);
}

/// The same on verbs RDM, in the VM of `integration/run-rxe`: 64 peers
/// (each an RDM endpoint of its own, with an RC connection to its
/// server) over 4 bound endpoints. The server side's receive memory is
/// the bound endpoints' slot pools, whatever the number of peers.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_rdm_server_with_peers_on_one_context() {
    let few = rdm_run("verbs", 8, 4).await;
    let many = rdm_run("verbs", 64, 4).await;
    check("verbs RDM", &few, &many);
}

/// A verbs RDM context with a budget of `limit` bytes, two endpoints
/// bound to it (one CQ).
fn verbs_budget_rig(limit: usize) -> (Harness, SharedRxContext, CompletionQueue, Vec<RdmEp>) {
    let h = harness_of("verbs", EpType::Rdm);
    let srx = h
        .domain
        .srx_context_attr(&RxAttr {
            total_buffered_recv: limit,
            ..RxAttr::default()
        })
        .unwrap();
    let av = h.av();
    let cq = h.cq();
    let servers: Vec<RdmEp> = (0..2)
        .map(|_| srx_rdm_ep(&h, &av, &cq, &srx, None))
        .collect();
    (h, srx, cq, servers)
}

/// Peer `k`'s message `seq` of `len` bytes: `k`, then `seq`, then filler.
fn flood_msg(k: u8, seq: u32, len: usize) -> Bytes {
    let mut m = vec![k ^ seq as u8; len];
    m[0] = k;
    m[1..5].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(m)
}

/// verbs RDM, past a context's budget: two peers flood two bound
/// endpoints with eager messages at a 16 KiB budget. The first few are
/// copied out of their receive slots (charged); the rest stay in their
/// slots (counted as parked, not charged), and once an endpoint's 256
/// slots are held its peer's sends wait in RNR retries. A message in a
/// slot is claimed (peek|claim, then claim) and another discarded
/// (peek|discard), each on the CQ as for a copied one. Then every other
/// message is taken, once and in its sender's order, and nothing is left
/// held.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_rdm_messages_past_the_budget_wait_in_slots() {
    const LIMIT: usize = 16 << 10;
    const LEN: usize = 1 << 10;
    /// More than an endpoint's 256 slots.
    const PER: u32 = 320;
    let (h, srx, cq, servers) = verbs_budget_rig(LIMIT);
    let msg = |k: u8, seq: u32| flood_msg(k, seq, LEN);
    // Tagged with the sender and the number, for the claim below.
    let tag = |k: u8, seq: u32| u64::from(k) << 32 | u64::from(seq);
    let senders: Vec<_> = (0..2u8)
        .map(|k| {
            let c = h.rdm_ep();
            let to = c.insert(&servers[k as usize]);
            tokio::spawn(async move {
                for seq in 0..PER {
                    c.ep.tsend(to, msg(k, seq), tag(k, seq)).await.unwrap();
                }
                c
            })
        })
        .collect();
    // Both endpoints' slots fill up: 2 x 256, less the few copied.
    within("slots held", async {
        while srx.stats().parked < 2 * 256 - LIMIT / LEN {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let held = srx.stats().unexpected_bytes;
    assert!(held > 0 && held <= LIMIT, "held {held} of {LIMIT}");
    assert!(
        senders.iter().all(|s| !s.is_finished()),
        "the senders wait for slots"
    );
    // Peer 1's messages 200 and 201 are in slots: past the few copied,
    // within the 256 held.
    let peek = |t, context, bufs| RecvMsg {
        src: weft::FI_ADDR_UNSPEC,
        bufs,
        tagged: true,
        tag: t,
        ignore: 0,
        context,
    };
    srx.post_recvmsg(
        peek(tag(1, 200), 31, Vec::new()),
        OpFlags::PEEK | OpFlags::CLAIM,
    )
    .unwrap();
    let CqItem::Ok(e) = within("peek|claim", next_cq(&cq)).await else {
        panic!("peek|claim of a message in a slot failed");
    };
    assert_eq!((e.context, e.tag, e.len), (31, tag(1, 200), LEN));
    srx.post_recvmsg(
        peek(tag(1, 200), 31, vec![BytesMut::zeroed(LEN)]),
        OpFlags::CLAIM,
    )
    .unwrap();
    let CqItem::Ok(e) = within("claim", next_cq(&cq)).await else {
        panic!("claim of a message in a slot failed");
    };
    assert_eq!(e.context, 31);
    assert_eq!(e.into_bytes(), msg(1, 200));
    let e = within(
        "peek|discard",
        srx.recvmsg(
            peek(tag(1, 201), 32, Vec::new()),
            OpFlags::PEEK | OpFlags::DISCARD,
        ),
    )
    .await
    .unwrap();
    assert_eq!(e.tag, tag(1, 201));
    let mut next = [0u32; 2];
    for n in 0..2 * PER - 2 {
        if next[1] == 200 {
            next[1] = 202;
        }
        let e = within(
            "drain",
            srx.trecv(BytesMut::zeroed(LEN), weft::FI_ADDR_UNSPEC, 0, u64::MAX),
        )
        .await
        .unwrap();
        assert!(srx.stats().unexpected_bytes <= LIMIT);
        let e_tag = e.tag;
        let b = e.into_bytes();
        let k = b[0];
        let seq = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        assert_eq!(seq, next[k as usize], "peer {k}: once, in order ({n})");
        assert_eq!(e_tag, tag(k, seq));
        assert_eq!(b, msg(k, seq), "peer {k} message {seq}");
        next[k as usize] += 1;
    }
    assert_eq!(next, [PER; 2]);
    for s in senders {
        within("senders", s).await.unwrap();
    }
    assert_drained_of(&srx, &cq).await;
}

/// Nothing held and nothing more on `cq`.
async fn assert_drained_of(srx: &SharedRxContext, cq: &CompletionQueue) {
    weft_integration::assert_cq_quiet(cq, "no message twice").await;
    assert_eq!(srx.stats().unexpected_bytes, 0);
    assert_eq!(srx.stats().parked, 0);
}

/// Waits until `srx` holds at least `bytes` unexpected and returns what
/// it holds then.
async fn holds_at_least(srx: &SharedRxContext, bytes: usize) -> usize {
    within("buffered", async {
        loop {
            let held = srx.stats().unexpected_bytes;
            if held >= bytes {
                return held;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    })
    .await
}

/// One peer flooding one bound endpoint holds only its connection's
/// share of the context's budget; another peer's messages, to another
/// bound endpoint, are still buffered, and taken first by receives that
/// ask for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_peer_holds_only_its_share() {
    const SHARE: usize = 32 << 10;
    const LEN: usize = 8 << 10;
    // What one buffered message is charged.
    const CHARGE: usize = LEN + weft::UNEXPECTED_OVERHEAD;
    let h = harness(EpType::Rdm);
    let srx = context(&h);
    let av = h.av();
    let cq = h.cq();
    let mut limits = weft::ConnLimits::from_env();
    limits.peer_buffered = SHARE;
    let servers: Vec<RdmEp> = (0..2)
        .map(|_| srx_rdm_ep(&h, &av, &cq, &srx, Some(limits)))
        .collect();
    let (a, b) = (h.rdm_ep(), h.rdm_ep());
    let (a_to, b_to) = (a.insert(&servers[0]), b.insert(&servers[1]));
    let flood = tokio::spawn({
        let a = a.ep.clone();
        async move {
            for seq in 0..40u32 {
                let mut m = vec![1u8; LEN];
                m[..4].copy_from_slice(&seq.to_le_bytes());
                a.tsend(a_to, Bytes::from(m), 1).await.unwrap();
            }
        }
    });
    // The flooder fills its share (3 messages) and parks.
    holds_at_least(&srx, SHARE / CHARGE * CHARGE).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let held = srx.stats().unexpected_bytes;
    assert!(held <= SHARE, "the flooder holds {held}, over its {SHARE}");
    assert_eq!(srx.stats().parked, 1);
    // The other peer is not shut out.
    for seq in 0..3u32 {
        let mut m = vec![2u8; LEN];
        m[..4].copy_from_slice(&seq.to_le_bytes());
        b.ep.tsend(b_to, Bytes::from(m), 2).await.unwrap();
    }
    let both = holds_at_least(&srx, held + 3 * CHARGE).await;
    assert!(both <= 2 * SHARE, "{both}");
    for seq in 0..3u32 {
        let e = within(
            "b's",
            srx.trecv(BytesMut::zeroed(LEN), weft::FI_ADDR_UNSPEC, 2, 0),
        )
        .await
        .unwrap();
        assert_eq!(e.tag, 2);
        assert_eq!(&e.bufs[0][..4], &seq.to_le_bytes());
    }
    for seq in 0..40u32 {
        let e = within(
            "a's",
            srx.trecv(BytesMut::zeroed(LEN), weft::FI_ADDR_UNSPEC, 1, 0),
        )
        .await
        .unwrap();
        assert_eq!(&e.bufs[0][..4], &seq.to_le_bytes(), "a's messages in order");
        assert!(srx.stats().unexpected_bytes <= SHARE);
    }
    within("flood", flood).await.unwrap();
    assert_eq!(srx.stats().unexpected_bytes, 0);
    drop((a, b, servers));
}

/// verbs RDM, rendezvous past a context's budget: two peers post 300
/// messages of 8 KiB each (announced, their bytes read by RDMA when a
/// receive takes them) to two bound endpoints at an 8 KiB budget; peer
/// 0's are delivery-complete (pulled at once while the budget lasts).
/// Announcements and pulls are charged against the budget as copied
/// messages are: what does not fit keeps its receive slot, and the
/// senders wait (RNR retries) once the slots are held, so the context
/// never holds more than its budget. Then every message is taken, once
/// and in its sender's order, and nothing is left held.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_rdm_announcements_past_the_budget_wait() {
    const LIMIT: usize = 8 << 10;
    /// Past the eager size: announced.
    const LEN: usize = 8 << 10;
    /// More than an endpoint's 256 slots.
    const PER: u32 = 300;
    let (h, srx, cq, servers) = verbs_budget_rig(LIMIT);
    let msg = |k: u8, seq: u32| flood_msg(k, seq, LEN);
    let clients: Vec<(RdmEp, weft::FiAddr)> = (0..2)
        .map(|k| {
            let c = h.rdm_ep();
            let to = c.insert(&servers[k]);
            (c, to)
        })
        .collect();
    for seq in 0..PER {
        for (k, (c, to)) in clients.iter().enumerate() {
            let flags = if k == 0 {
                OpFlags::DELIVERY_COMPLETE
            } else {
                OpFlags::empty()
            };
            let m = weft::SendMsg {
                dest: *to,
                iov: vec![msg(k as u8, seq)],
                tag: None,
                data: None,
                context: u64::from(seq),
            };
            c.ep.post_sendmsg(m, flags).unwrap();
        }
    }
    // Held announcements (charged or in their slots) grow until the
    // slots are held, then stop.
    let mut last = 0;
    within("announcements held", async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let now = srx.stats().parked;
            if now == last && now > 0 {
                break;
            }
            last = now;
        }
    })
    .await;
    let held = srx.stats().unexpected_bytes;
    eprintln!("held: {last} announcements, {held} bytes charged, budget {LIMIT}");
    assert!(held > 0 && held <= LIMIT, "held {held} of {LIMIT}");
    assert!(
        last > LIMIT / weft::UNEXPECTED_OVERHEAD,
        "more announcements ({last}) than the budget charges"
    );
    let mut next = [0u32; 2];
    for n in 0..2 * PER {
        let e = within("drain", srx.recv(BytesMut::zeroed(LEN)))
            .await
            .unwrap();
        assert!(srx.stats().unexpected_bytes <= LIMIT);
        let b = e.into_bytes();
        let k = b[0];
        let seq = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        assert_eq!(seq, next[k as usize], "peer {k}: once, in order ({n})");
        assert_eq!(b, msg(k, seq), "peer {k} message {seq}");
        next[k as usize] += 1;
    }
    assert_eq!(next, [PER; 2]);
    for (c, _) in &clients {
        for _ in 0..PER {
            let CqItem::Ok(_) = within("sent", next_cq(&c.cq)).await else {
                panic!("a send failed");
            };
        }
    }
    assert_drained_of(&srx, &cq).await;
}

/// Read requests from this VM's server address to its client address
/// vanish while it lives: the server's neighbour entry for the client
/// points at a MAC address nobody has (the veth pair carries the frames,
/// the other end drops them). Dropping it lets ARP find the client
/// again. Only the rxe VM's own veth pair is touched.
struct ReadsVanish {
    dev: String,
    client: String,
}

impl ReadsVanish {
    fn start(server: &str, client: &str) -> ReadsVanish {
        let route = std::process::Command::new("ip")
            .args(["-o", "route", "get", client, "from", server])
            .output()
            .expect("ip route get");
        let route = String::from_utf8_lossy(&route.stdout).into_owned();
        let dev = route
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .unwrap_or_else(|| panic!("no device in {route:?}"))
            .to_owned();
        let set = std::process::Command::new("ip")
            .args(["neigh", "replace", client, "dev", &dev])
            .args(["lladdr", "02:00:00:00:00:01", "nud", "permanent"])
            .status()
            .expect("ip neigh replace");
        assert!(set.success(), "ip neigh replace {client} dev {dev}");
        ReadsVanish {
            dev,
            client: client.to_owned(),
        }
    }
}

impl Drop for ReadsVanish {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["neigh", "del", &self.client, "dev", &self.dev])
            .status();
    }
}

/// verbs RDM: a receive of a shared context matched to a rendezvous
/// message that a bound endpoint is still reading (its RDMA read to the
/// sender in flight: the server's packets to the client vanish meanwhile)
/// when that endpoint closes ends with `Canceled` within bounded time,
/// its buffer handed back and its credit returned; the context's other
/// receive stays posted and takes the next message, which arrives at the
/// other bound endpoint; the cut-off message is delivered to nobody.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_rdm_close_mid_read_ends_the_context_receive() {
    /// Past the eager size: announced, then read by the receiver.
    const LEN: usize = 8 << 20;
    let (Ok(server_ip), Ok(client_ip)) = (
        std::env::var("WEFT_RXE_SERVER_IP"),
        std::env::var("WEFT_RXE_CLIENT_IP"),
    ) else {
        eprintln!("skipped: needs the rxe VM of integration/run-rxe (it cuts a veth path)");
        return;
    };
    let h = harness_of("verbs", EpType::Rdm);
    let srx = h
        .domain
        .srx_context_attr(&RxAttr {
            size: 8,
            ..RxAttr::default()
        })
        .unwrap();
    let size = srx.rx_size_left().unwrap();
    let av = h.av();
    let cq = h.cq();
    let closing = srx_rdm_ep(&h, &av, &cq, &srx, None);
    let staying = srx_rdm_ep(&h, &av, &cq, &srx, None);
    let client_info = weft_integration::verbs_offer("rxe2", EpType::Rdm).unwrap();
    let ch = Harness::with_info(&Provider::named("verbs"), client_info);
    let c = ch.rdm_ep();
    let (to_closing, to_staying) = (c.insert(&closing), c.insert(&staying));
    // Both connections made (and rdma_cm done with them) first.
    for (to, body) in [(to_closing, &b"one"[..]), (to_staying, b"two")] {
        let (got, sent) = within("a first message", async {
            tokio::join!(
                srx.recv(BytesMut::zeroed(16)),
                c.ep.send(to, Bytes::from_static(body))
            )
        })
        .await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], body);
    }
    // Its sender is not checked: the disconnect that would tell it goes
    // out while the path is cut, and rdma_cm does not repeat it once the
    // closed endpoint's ids are gone.
    c.ep.post_send(to_closing, weft_integration::payload(LEN, 7), 1)
        .unwrap();
    within("the announcement held", async {
        while srx.stats().parked == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    })
    .await;
    let vanish = ReadsVanish::start(&server_ip, &client_ip);
    let mut cut = pin!(srx.recv(BytesMut::zeroed(LEN)));
    assert!(
        poll!(cut.as_mut()).is_pending(),
        "the read finished with the path cut"
    );
    assert_eq!(srx.stats().parked, 0, "matched: being read");
    // The next receive waits posted on the context.
    srx.post_recv(BytesMut::zeroed(16), 77).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(poll!(cut.as_mut()).is_pending(), "still being read");
    closing.ep.close().unwrap();
    let e = within("the cut-off receive ends", cut).await.unwrap_err();
    drop(vanish);
    assert_eq!(e.err, Error::Canceled);
    assert_eq!(e.bufs.len(), 1, "its buffer handed back");
    assert!(e.bufs[0].capacity() >= LEN);
    assert_eq!(srx.rx_size_left().unwrap(), size - 1, "only 77 posted");
    within(
        "the next message",
        c.ep.send(to_staying, Bytes::from_static(b"next")),
    )
    .await
    .unwrap();
    let CqItem::Ok(e) = within("the posted receive", next_cq(&cq)).await else {
        panic!("the posted receive failed");
    };
    assert_eq!(e.context, 77);
    assert_eq!(&e.bufs[0][..e.len], b"next");
    assert_eq!(srx.rx_size_left().unwrap(), size);
    drop(staying);
    assert_drained_of(&srx, &cq).await;
}
