//! The verbs provider's connection handling against hostile and failing
//! peers, on real RDMA devices (soft-RoCE in the VM of
//! `integration/run-rxe`): rdma_cm request floods (garbage CM data, and
//! valid-looking requests that never complete their handshake), peers
//! that connect and never send, and senders whose connection dies in the
//! middle of a rendezvous transfer. Servers on rxe1 (10.66.0.1), peers on
//! rxe2 (10.66.0.2), as on two hosts.
//!
//! Each case is bounded in count (tens of requests) and time, asserts its
//! bound through `Endpoint::stats()` and the process's open descriptors,
//! and ends with a well-behaved exchange on the endpoint under attack: a
//! panic in a provider task would be swallowed by Tokio, so "it still
//! works" is the real check.
//!
//! The raw rdma_cm requesters are verbs MSG endpoints: their CM data is
//! whatever the attack needs, framed with the one length byte that the
//! RDM hello uses too, so it reaches the RDM listener exactly as given
//! (this test crate depends on `weft`, not on `weft-verbs` and its `sys`
//! wrappers). A requester that never completes its handshake is one whose
//! runtime stops being driven right after its request left: librdmacm
//! answers the accept (RTU) only when the application reads the event.
//!
//! Outside the VM every test prints why it is skipped; inside it
//! (`RXE_VM=1`) a missing device is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnLimits, ConnRequest, CqAttr, Domain,
    Endpoint, EpStats, EpType, EqEventKind, Error, EventQueue, Fabric, FiAddr, Info, OpFlags,
    RecvMsg, FI_ADDR_UNSPEC,
};
use weft_integration::{accepted_endpoint, payload, verbs_offer};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// How long any one step may take under the VM's emulation (slow: tens
/// of times slower than the host).
const T: Duration = Duration::from_secs(30);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(T, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {T:?}: {what}"),
    }
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn limits(max_conns: usize, handshake: Duration) -> ConnLimits {
    ConnLimits::default()
        .with_max_conns(max_conns)
        .with_handshake_timeout(handshake)
}

/// An RDM endpoint with its own fabric, domain, AV, CQ and EQ (bound to
/// the endpoint: refusals and drops are reported there).
struct Rdm {
    ep: Endpoint,
    av: AddressVector,
    eq: EventQueue,
    cq: CompletionQueue,
    _domain: Domain,
    _fabric: Fabric,
}

impl Rdm {
    fn open(info: &Info, limits: ConnLimits) -> Rdm {
        let fabric = Fabric::open(info).unwrap();
        let domain = fabric.domain(info).unwrap();
        let eq = fabric.eq(64).unwrap();
        let av = domain.av(AvAttr::default()).unwrap();
        let cq = domain.cq(CqAttr::default()).unwrap();
        let ep = domain.endpoint(info).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.set_conn_limits(limits).unwrap();
        ep.enable().unwrap();
        Rdm {
            ep,
            av,
            eq,
            cq,
            _domain: domain,
            _fabric: fabric,
        }
    }

    fn addr(&self) -> Vec<u8> {
        self.ep.local_addr().unwrap()
    }

    fn handle_of(&self, peer: &Rdm) -> FiAddr {
        self.av
            .insert_sync(&[peer.addr()], Default::default())
            .unwrap()
            .fi_addrs[0]
    }

    fn stats(&self) -> EpStats {
        self.ep.stats().unwrap()
    }
}

/// A well-behaved message from `from` (through its handle `dest` of `to`)
/// to `to`, checked byte for byte.
async fn exchange(from: &Rdm, dest: FiAddr, to: &Rdm, len: usize, seed: u8) {
    let data = payload(len, seed);
    let (got, sent) = within("a well-behaved exchange", async {
        tokio::join!(
            to.ep.recv(BytesMut::zeroed(len.max(1))),
            from.ep.send(dest, data.clone())
        )
    })
    .await;
    sent.unwrap_or_else(|e| panic!("well-behaved send of {len} bytes: {e:?}"));
    let got = got.unwrap_or_else(|e| panic!("well-behaved receive of {len} bytes: {e:?}"));
    assert_eq!(&got.into_bytes()[..], &data[..], "payload of {len} bytes");
}

/// A raw rdma_cm requester: a verbs MSG endpoint of its own fabric and
/// domain (so that it can live on a runtime of its own).
struct Requester {
    ep: Endpoint,
    _eq: EventQueue,
    _cq: CompletionQueue,
    _domain: Domain,
    _fabric: Fabric,
}

impl Requester {
    /// Must run inside the runtime the requester is to use.
    fn open(info: &Info) -> Requester {
        let fabric = Fabric::open(info).unwrap();
        let domain = fabric.domain(info).unwrap();
        let eq = fabric.eq(8).unwrap();
        let cq = domain.cq(CqAttr::default()).unwrap();
        let ep = domain.endpoint(info).unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        // Its own side waits as long as the server may make it.
        ep.set_conn_limits(limits(16, T)).unwrap();
        ep.enable().unwrap();
        Requester {
            ep,
            _eq: eq,
            _cq: cq,
            _domain: domain,
            _fabric: fabric,
        }
    }
}

/// A valid-looking RDM hello: a listening address (anyone's: the server
/// cannot check it) and an incarnation.
fn hello(claimed: SocketAddr, nonce: u64) -> Vec<u8> {
    let mut v = weft::encode_sockaddr(&claimed);
    v.extend_from_slice(&nonce.to_le_bytes());
    v
}

/// Distinct identities on the client's host, none of which listens.
fn claimed(client: &Info, i: usize) -> SocketAddr {
    let mut a = weft::decode_sockaddr(client.src_addr.as_deref().unwrap()).unwrap();
    a.set_port(50_000 + i as u16);
    a
}

fn client_ip(client: &Info) -> IpAddr {
    weft::decode_sockaddr(client.src_addr.as_deref().unwrap())
        .unwrap()
        .ip()
}

/// What the server's EQ reported so far, by error.
#[derive(Debug, Default)]
struct Reports {
    refused: usize,
    timed_out: usize,
    garbage: usize,
}

impl Reports {
    /// Reads every queued error entry of `eq`: each names a peer on the
    /// client's host.
    fn drain(&mut self, eq: &EventQueue, from: IpAddr) {
        loop {
            match eq.read(false) {
                Err(Error::Avail) => {}
                Err(_) => return,
                Ok(ev) => panic!("only error entries expected, got {ev:?}"),
            }
            let e = eq.read_err().unwrap();
            let peer = e.peer_addr.as_deref().expect("a report names the peer");
            let peer = weft::decode_sockaddr(peer).unwrap();
            assert_eq!(peer.ip(), from, "the requester's address: {e:?}");
            match e.err {
                Error::ConnRefused => self.refused += 1,
                Error::TimedOut => self.timed_out += 1,
                Error::Io => self.garbage += 1,
                other => panic!("unexpected report {other:?}: {e:?}"),
            }
        }
    }
}

/// Polls `cond` until it holds, failing after `limit` with `what` and the
/// last value seen.
async fn wait_until<V: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> V,
    cond: impl Fn(&V) -> bool,
) -> V {
    let deadline = Instant::now() + limit;
    loop {
        let v = probe();
        if cond(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {v:?} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rt_multi() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn rt_single() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// (a) An rdma_cm request flood against an RDM endpoint: requests with
/// garbage CM data are rejected and reported; valid-looking requests get
/// a QP each only up to `max_conns` (the rest are rejected and reported
/// as refused), and those that never complete their handshake are dropped
/// after the handshake timeout, QP and id destroyed, and reported. Then
/// connections, peers and descriptors are back where they were, the
/// endpoint's existing peer still exchanges, and a new peer connects.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[test]
fn verbs_hostile_request_flood() {
    const MAX: usize = 5;
    const GARBAGE: usize = 12;
    const STUCK: usize = MAX + 4;
    const HANDSHAKE: Duration = Duration::from_secs(6);
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let Some(cinfo) = verbs_offer(CLIENT_DEV, EpType::Rdm) else {
        return;
    };
    let Some(minfo) = verbs_offer(CLIENT_DEV, EpType::Msg) else {
        return;
    };
    let from = client_ip(&cinfo);
    let main = rt_multi();
    let t0 = Instant::now();
    let (server, good, to_s) = main.block_on(async {
        let server = Rdm::open(&sinfo, limits(MAX, HANDSHAKE));
        let good = Rdm::open(&cinfo, limits(16, T));
        let to_s = good.handle_of(&server);
        exchange(&good, to_s, &server, 64, 1).await;
        (server, good, to_s)
    });
    let base = server.stats();
    assert_eq!((base.conns, base.peers), (1, 1), "the good peer only");
    let fds0 = fds();
    let saddr = server.addr();
    let mut rep = Reports::default();

    // Garbage: no hello at all, too short for one, and all ones.
    main.block_on(async {
        let reqs: Vec<Requester> = (0..GARBAGE).map(|_| Requester::open(&minfo)).collect();
        let data: [&[u8]; 3] = [b"", &[0xa5; 20], &[0xff; 55]];
        let tries = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| r.ep.connect(saddr.clone(), data[i % 3].to_vec()));
        let results = within("garbage requests", futures::future::join_all(tries)).await;
        for r in results {
            assert_eq!(r.unwrap_err(), Error::ConnRefused, "a garbage request");
        }
        for r in &reqs {
            r.ep.close().unwrap();
        }
        wait_until(
            "garbage requests reported",
            T,
            || {
                rep.drain(&server.eq, from);
                rep.garbage
            },
            |n| *n == GARBAGE,
        )
        .await;
        let s = server.stats();
        assert_eq!((s.conns, s.peers), (base.conns, base.peers));
    });

    // Valid-looking requests that never complete: each requester has a
    // runtime of its own, driven until its request has left and never
    // again, so the server's accept is never answered.
    let stuck: Vec<(tokio::runtime::Runtime, Requester)> = (0..STUCK)
        .map(|_| {
            let rt = rt_single();
            let r = rt.block_on(async { Requester::open(&minfo) });
            (rt, r)
        })
        .collect();
    let mut pending = Vec::new();
    for (i, (rt, r)) in stuck.iter().enumerate() {
        let before = server.stats();
        rep.drain(&server.eq, from);
        let refused_before = rep.refused;
        let ep = r.ep.clone();
        let cm = hello(claimed(&cinfo, i), i as u64);
        let dest = saddr.clone();
        pending.push(rt.spawn(async move { ep.connect(dest, cm).await }));
        rt.block_on(async {
            // The request is sent in the same poll that makes the
            // endpoint's link (and so its peer address) exist; this
            // future is polled again before the runtime reads another
            // event.
            let deadline = Instant::now() + T;
            while r.ep.peer_addr().is_err() {
                assert!(Instant::now() < deadline, "request {i} never left");
                tokio::task::yield_now().await;
            }
        });
        // The server has taken it (a QP, or a refusal) once the count
        // adds up: handshaking connections beside the good one, and
        // everything reported.
        main.block_on(wait_until(
            "the server answers a request",
            T,
            || {
                rep.drain(&server.eq, from);
                (server.stats().conns - 1, rep.refused, rep.timed_out)
            },
            |(c, r, t)| c + r + t == i + 1,
        ));
        let after = server.stats();
        assert!(
            after.conns <= MAX,
            "connections beyond the limit: {after:?}"
        );
        if rep.refused > refused_before {
            assert_eq!(
                before.conns, MAX,
                "request {i} refused below the limit ({before:?})"
            );
        }
    }
    assert!(rep.refused > 0, "the flood went beyond the limit: {rep:?}");
    // Every accepted one is dropped after the handshake timeout, with its
    // QP (the count falls only when the QP and id are destroyed).
    let s = main.block_on(wait_until(
        "stuck handshakes dropped",
        HANDSHAKE + T,
        || {
            rep.drain(&server.eq, from);
            (server.stats(), rep.refused + rep.timed_out)
        },
        |(s, n)| s.conns == base.conns && s.peers == base.peers && *n == STUCK,
    ));
    assert_eq!(
        rep.timed_out + rep.refused,
        STUCK,
        "each request refused or timed out: {rep:?} {s:?}"
    );
    assert!(rep.timed_out > 0, "handshakes timed out: {rep:?}");
    for h in pending {
        h.abort();
    }
    for (rt, r) in stuck {
        rt.block_on(async { r.ep.close().unwrap() });
        drop(rt);
    }

    // The endpoint still works, for its old peer and for a new one.
    main.block_on(async {
        exchange(&good, to_s, &server, 4096, 2).await;
        let fresh = Rdm::open(&cinfo, limits(16, T));
        let to = fresh.handle_of(&server);
        exchange(&fresh, to, &server, 100_000, 3).await;
        let s = server.stats();
        assert_eq!((s.conns, s.peers), (2, 2), "old and new peer");
        drop(fresh);
        wait_until(
            "everything back to the baseline",
            T,
            || (server.stats(), fds()),
            |(s, f)| (s.conns, s.peers) == (base.conns, base.peers) && *f == fds0,
        )
        .await;
        rep.drain(&server.eq, from);
        assert_eq!(rep.refused + rep.timed_out, STUCK, "nothing else reported");
    });
    eprintln!(
        "request flood: {rep:?} with max_conns {MAX}, {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    drop((server, good));
}

/// (b) Peers that connect (complete the handshake) and never send: they
/// are bounded by `max_conns` (beyond it requests are refused and
/// reported, and a new well-behaved peer is refused too), they are not
/// retired by the idle timeout (the verbs RDM design counts them instead:
/// see the provider's `rdm` module docs), and once they go away
/// everything is reclaimed and the refused peer gets in.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_hostile_idle_peers() {
    const MAX: usize = 4;
    const EXTRA: usize = 3;
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let Some(cinfo) = verbs_offer(CLIENT_DEV, EpType::Rdm) else {
        return;
    };
    let Some(minfo) = verbs_offer(CLIENT_DEV, EpType::Msg) else {
        return;
    };
    let from = client_ip(&cinfo);
    let t0 = Instant::now();
    let idle = Duration::from_secs(1);
    let server = Rdm::open(
        &sinfo,
        limits(MAX, Duration::from_secs(10)).with_idle_timeout(Some(idle)),
    );
    let good = Rdm::open(&cinfo, limits(16, T));
    let to_s = good.handle_of(&server);
    exchange(&good, to_s, &server, 64, 1).await;
    let base = server.stats();
    assert_eq!((base.conns, base.peers), (1, 1));
    let fds0 = fds();
    let saddr = server.addr();
    let mut rep = Reports::default();

    let idlers: Vec<Requester> = (0..MAX - 1 + EXTRA)
        .map(|_| Requester::open(&minfo))
        .collect();
    for (i, r) in idlers.iter().enumerate() {
        let got = within(
            "an idle peer's connect",
            r.ep.connect(saddr.clone(), hello(claimed(&cinfo, 100 + i), i as u64)),
        )
        .await;
        if i < MAX - 1 {
            got.unwrap_or_else(|e| panic!("idle peer {i} within the limit: {e:?}"));
        } else {
            assert_eq!(got.unwrap_err(), Error::ConnRefused, "idle peer {i}");
        }
    }
    let s = server.stats();
    assert_eq!((s.conns, s.peers), (MAX, MAX), "at the limit");
    wait_until(
        "refusals reported",
        T,
        || {
            rep.drain(&server.eq, from);
            rep.refused
        },
        |n| *n == EXTRA,
    )
    .await;

    // A new well-behaved peer is refused while the idle ones hold every
    // place.
    let fresh = Rdm::open(&cinfo, limits(16, T));
    let to = fresh.handle_of(&server);
    let r = within("a send beyond the limit", fresh.ep.send(to, payload(64, 9))).await;
    assert_eq!(
        r.unwrap_err().err,
        Error::ConnRefused,
        "refused at the limit"
    );
    assert_eq!(fresh.stats().peers, 0, "the refused attempt left nothing");

    // Idle is not retired: still all there after several idle timeouts,
    // and the good peer still exchanges.
    tokio::time::sleep(idle * 3).await;
    let s = server.stats();
    assert_eq!((s.conns, s.peers), (MAX, MAX), "idle connections counted");
    exchange(&good, to_s, &server, 4096, 2).await;

    // They go away: everything they held comes back.
    for r in &idlers {
        r.ep.close().unwrap();
    }
    drop(idlers);
    wait_until(
        "idle peers reclaimed",
        T,
        || server.stats(),
        |s| (s.conns, s.peers) == (base.conns, base.peers),
    )
    .await;
    exchange(&fresh, to, &server, 100_000, 3).await;
    let s = server.stats();
    assert_eq!((s.conns, s.peers), (2, 2), "the refused peer got in");
    drop(fresh);
    wait_until(
        "back to the baseline",
        T,
        || (server.stats(), fds()),
        |(s, f)| (s.conns, s.peers) == (base.conns, base.peers) && *f == fds0,
    )
    .await;
    rep.drain(&server.eq, from);
    // The fresh peer's refused attempt is the only other report.
    assert_eq!((rep.refused, rep.timed_out, rep.garbage), (EXTRA + 1, 0, 0));
    eprintln!(
        "idle peers: {rep:?} with max_conns {MAX}, {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

/// (c) Senders whose connection dies in the middle of rendezvous
/// transfers (the sending endpoint is closed while its messages are being
/// read): the receives they had matched are not lost or failed, they go
/// back to the posted receives in their order and complete with a good
/// peer's later messages; an announcement nobody had matched disappears
/// with its sender; nothing hangs; connections, peers, receive credits
/// and descriptors come back.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_hostile_sender_dies_mid_transfer() {
    const LEN: usize = 8 << 20;
    const K: u64 = 4;
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Rdm) else {
        return;
    };
    let Some(cinfo) = verbs_offer(CLIENT_DEV, EpType::Rdm) else {
        return;
    };
    let t0 = Instant::now();
    // Made once and told apart by their first bytes: filling 8 MiB byte
    // by byte takes seconds in a debug build under the VM's emulation.
    let base = payload(LEN, 0);
    let msg = |id: u8| -> bytes::Bytes {
        let mut b = BytesMut::from(&base[..]);
        b[..64].fill(id);
        b.freeze()
    };
    let server = Rdm::open(&sinfo, limits(16, Duration::from_secs(10)));
    let good = Rdm::open(&cinfo, limits(16, T));
    let to_s = good.handle_of(&server);
    exchange(&good, to_s, &server, 64, 1).await;
    let base = server.stats();
    assert_eq!((base.conns, base.peers), (1, 1));
    let rx0 = server.ep.rx_size_left().unwrap();
    let fds0 = fds();

    // Matched, then cut off.
    let hostile = Rdm::open(&cinfo, limits(16, T));
    let h_to_s = hostile.handle_of(&server);
    for ctx in 0..K {
        server.ep.post_recv(BytesMut::zeroed(LEN), ctx).unwrap();
    }
    for i in 0..K {
        hostile
            .ep
            .post_send(h_to_s, msg(0xe0 + i as u8), i)
            .unwrap();
    }
    let first = within("the first hostile message", server.cq.next_timeout(T))
        .await
        .expect("a completion")
        .unwrap_or_else(|e| panic!("the first receive: {e:?}"));
    hostile.ep.close().unwrap();
    drop(hostile);
    assert_eq!(first.context, 0);
    assert_eq!(&first.into_bytes()[..], &msg(0xe0)[..]);
    // Reads that finished before the connection went complete whole; the
    // others complete nothing, not even an error.
    let mut next = 1u64;
    while let Some(it) = server.cq.next_timeout(Duration::from_secs(2)).await {
        let e = it.unwrap_or_else(|e| panic!("a receive of a dead sender failed: {e:?}"));
        assert_eq!(e.context, next, "in order");
        assert_eq!(&e.into_bytes()[..], &msg(0xe0 + next as u8)[..]);
        next += 1;
    }
    assert!(
        next < K,
        "the sender was closed after every transfer was over: nothing was cut off"
    );
    let orphans = K - next;
    eprintln!("sender closed mid-transfer: {next} of {K} receives completed, {orphans} given back");
    // The receives are back, first in line, in their order.
    for i in 0..orphans {
        good.ep
            .post_send(to_s, msg(0x10 + i as u8), 100 + i)
            .unwrap();
    }
    for i in 0..orphans {
        let e = within("a receive given back", server.cq.next_timeout(T))
            .await
            .expect("a completion")
            .unwrap_or_else(|e| panic!("a receive given back: {e:?}"));
        assert_eq!(e.context, next + i, "given back in the order posted");
        assert_eq!(&e.into_bytes()[..], &msg(0x10 + i as u8)[..]);
    }
    let mut done = 0;
    while done < orphans {
        let e = within("the good sends", good.cq.next_timeout(T))
            .await
            .expect("a completion")
            .unwrap_or_else(|e| panic!("a good send: {e:?}"));
        assert!(e.context >= 100);
        done += 1;
    }

    // Announced, never matched, sender gone: the announcement goes too.
    let hostile = Rdm::open(&cinfo, limits(16, T));
    let h_to_s = hostile.handle_of(&server);
    hostile.ep.post_tsend(h_to_s, msg(0xee), 0x77, 1).unwrap();
    let peek = || RecvMsg {
        src: FI_ADDR_UNSPEC,
        tagged: true,
        tag: 0x77,
        context: 500,
        ..RecvMsg::default()
    };
    let deadline = Instant::now() + T;
    loop {
        server.ep.post_recvmsg(peek(), OpFlags::PEEK).unwrap();
        match within("a peek", server.cq.next_timeout(T)).await.unwrap() {
            Ok(e) => {
                assert_eq!(e.len, LEN, "the announced length");
                break;
            }
            Err(e) if e.err == Error::NoMsg && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("peek for the announcement: {e:?}"),
        }
    }
    hostile.ep.close().unwrap();
    drop(hostile);
    wait_until(
        "the dead sender's connection reclaimed",
        T,
        || server.stats(),
        |s| (s.conns, s.peers) == (base.conns, base.peers),
    )
    .await;
    server.ep.post_recvmsg(peek(), OpFlags::PEEK).unwrap();
    let e = within("a peek", server.cq.next_timeout(T)).await.unwrap();
    assert_eq!(
        e.map(|e| e.len).map_err(|e| e.err),
        Err(Error::NoMsg),
        "the dead announcement is gone"
    );
    let (got, sent) = within("a tagged exchange after it", async {
        tokio::join!(
            server
                .ep
                .trecv(BytesMut::zeroed(LEN), FI_ADDR_UNSPEC, 0x77, 0),
            good.ep.tsend(to_s, msg(0x44), 0x77)
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &msg(0x44)[..]);

    wait_until(
        "back to the baseline",
        T,
        || (server.stats(), server.ep.rx_size_left().unwrap(), fds()),
        |(s, rx, f)| (s.conns, s.peers) == (base.conns, base.peers) && *rx == rx0 && *f == fds0,
    )
    .await;
    assert!(server.cq.is_empty(), "no stray completion");
    assert!(
        server.eq.is_empty(),
        "nothing to report: the sender only left"
    );
    eprintln!(
        "sender dies mid-transfer: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

/// (a) against a passive MSG endpoint: pending requests are bounded by
/// `max_conns` (`PassiveEndpoint::set_conn_limits`); beyond it requests are rejected at once and reported on the
/// EQ with the requester's address. Requests answered or dropped give
/// their places back, and a well-behaved connection then gets through.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_hostile_passive_request_flood() {
    const MAX: usize = 3;
    const FLOOD: usize = MAX + 4;
    let Some(sinfo) = verbs_offer(SERVER_DEV, EpType::Msg) else {
        return;
    };
    let Some(minfo) = verbs_offer(CLIENT_DEV, EpType::Msg) else {
        return;
    };
    let from = client_ip(&minfo);
    let t0 = Instant::now();
    let fabric = Fabric::open(&sinfo).unwrap();
    let domain = fabric.domain(&sinfo).unwrap();
    let peq = fabric.eq(64).unwrap();
    let pep = fabric.passive_endpoint(&sinfo, None).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.set_conn_limits(weft::ConnLimits::default().with_max_conns(MAX))
        .unwrap();
    pep.listen().unwrap();
    let paddr = pep.local_addr().unwrap();
    let fds0 = fds();

    let reqs: Vec<Requester> = (0..FLOOD).map(|_| Requester::open(&minfo)).collect();
    let mut tries = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let ep = r.ep.clone();
        let dest = paddr.clone();
        tries.push(tokio::spawn(async move {
            ep.connect(dest, format!("flood {i}").into_bytes()).await
        }));
    }
    let mut held = Vec::new();
    let mut refused = 0;
    while held.len() < MAX || refused < FLOOD - MAX {
        match within("the flood's events", peq.next_timeout(T))
            .await
            .unwrap()
        {
            Ok(ev) => {
                assert_eq!(ev.kind, EqEventKind::ConnReq);
                held.push(ConnRequest::from_event(&ev).unwrap());
                assert!(held.len() <= MAX, "pending requests beyond the limit");
            }
            Err(e) => {
                assert_eq!(e.err, Error::ConnRefused, "{e:?}");
                let peer = weft::decode_sockaddr(e.peer_addr.as_deref().unwrap()).unwrap();
                assert_eq!(peer.ip(), from);
                refused += 1;
            }
        }
    }
    // One answered, the others dropped unanswered: every requester ends.
    pep.reject(&held[0], b"no".to_vec()).unwrap();
    drop(held);
    for t in tries {
        let r = within("a flood request's end", t).await.unwrap();
        assert_eq!(r.unwrap_err(), Error::ConnRefused);
    }
    for r in &reqs {
        r.ep.close().unwrap();
    }
    drop(reqs);
    assert!(peq.is_empty(), "nothing more reported");

    // The places are back: a well-behaved connection gets through.
    let client = Requester::open(&minfo);
    let c = client.ep.clone();
    let dest = paddr.clone();
    let connecting = tokio::spawn(async move { c.connect(dest, b"hello".to_vec()).await });
    let ev = within("a request after the flood", peq.next_timeout(T))
        .await
        .unwrap()
        .unwrap();
    let req = ConnRequest::from_event(&ev).unwrap();
    assert_eq!(req.cm_data, b"hello");
    let (server, _seq, _scq) = accepted_endpoint(&fabric, &domain, &sinfo, &req, limits(16, T));
    within("accept", server.accept(Vec::new())).await.unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    let data = payload(3000, 7);
    let (got, sent) = within("an exchange after the flood", async {
        tokio::join!(
            server.recv(BytesMut::zeroed(3000)),
            client.ep.send(0, data.clone())
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &data[..]);
    assert_eq!(server.stats().unwrap().conns, 1);
    server.close().unwrap();
    client.ep.close().unwrap();
    drop((server, client, req, ev));
    wait_until("descriptors back", T, fds, |f| *f == fds0).await;
    eprintln!(
        "passive request flood: {refused} refused with max_conns {MAX}, {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}
