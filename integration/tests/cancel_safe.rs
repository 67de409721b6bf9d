//! Nothing silently lost: dropping a receive's future, or cancelling a
//! posted receive, never loses a message, on tcp MSG, RDM and a shared
//! receive context, shm RDM, udp DGRAM and on verbs MSG, RDM, DGRAM and a
//! shared receive context (issue "Nothing silently lost").
//!
//! Each soak sends numbered 64-byte messages, a random 0–100 µs apart,
//! while the receiver awaits each receive under a random timeout of
//! 0–200 µs and drops the receive's future when the time is up (the
//! timeout spins on the clock: Tokio's timers tick in milliseconds).
//! Receive buffers are 64 bytes or 8 KiB at random (on verbs: a bounce
//! slot or the buffer registered in place). Every message must arrive
//! exactly once, in order where the endpoint promises it (MSG and RDM,
//! one sender), and afterwards nothing may be left over.
//!
//! The tcp soaks run on the host, 10,000 messages each. The verbs tests
//! run in the soft-RoCE VM of `integration/run-rxe` (server on rxe1,
//! client on rxe2): outside a verbs build they are reported as ignored,
//! with the reason; in one, a missing device is a failure. TCG emulation makes everything
//! there 20–50x slower, so every soak sends 2,000 messages in the VM
//! (over verbs MSG that is about 10,000 receives awaited, 8,000 of them
//! withdrawn). `WEFT_CANCEL_MSGS` overrides both counts.
//!
//! Each soak runs twice. On a current-thread runtime a completion is
//! always handed over by the thread that drops the future, so what is
//! tested is the provider withdrawing the receive (or finding its future
//! gone at the hand-over). On a multi-thread runtime (two workers) a
//! completion can also reach a future after its last poll, just before
//! another thread drops it: the future then gives the message back to its
//! endpoint, which hands it to the next receive ahead of later messages.
//! Before that hand-back existed, the tcp soaks lost 20–92 of 10,000
//! messages this way.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;
use weft::{
    AvFlags, BindFlags, CompletionQueue, ConnRequest, CqAttr, CqEntry, CqErrEntry, Domain,
    Endpoint, EpType, EqEventKind, Error, EventQueue, Fabric, FiAddr, Info, PassiveEndpoint,
    SharedRxContext, WaitMode,
};
use weft_integration::{
    assert_cq_quiet, next_cq, next_eq, under_timeout, verbs_offer, within, Harness, Node, Provider,
    Rng, SoakWindow, Until, QUIET,
};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";

/// Bytes per message.
const MSG_LEN: usize = 64;
/// Receive buffers are one of these, at random: a bounce slot's size, and
/// one past the slots (registered in place on verbs).
const RECV_LENS: [usize; 2] = [64, 8192];

/// Messages per soak: `host` outside the VM, `vm` in it.
fn messages(host: u64, vm: u64) -> u64 {
    if let Some(n) = std::env::var("WEFT_CANCEL_MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if std::env::var("RXE_VM").is_ok_and(|v| v == "1") {
        vm
    } else {
        host
    }
}

/// Message `i`: its number, then bytes that depend on it.
fn numbered(i: u64) -> Bytes {
    let mut v = i.to_le_bytes().to_vec();
    v.extend((8..MSG_LEN).map(|k| (k as u8).wrapping_mul(7) ^ i as u8));
    v.into()
}

/// The number of a received message, checking every byte of it.
fn number(e: CqEntry) -> u64 {
    let b = e.into_bytes();
    assert_eq!(b.len(), MSG_LEN, "length of a received message");
    let i = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert_eq!(&b[..], &numbered(i)[..], "bytes of message {i}");
    i
}

/// A soak in which no message arrives for this long has hung.
const STALL: Duration = Duration::from_secs(60);

/// What a soak saw.
struct Soak {
    got: Vec<u64>,
    withdrawn: u64,
    took: Duration,
}

/// Sends `n` numbered messages from `tx` to `dest` while `recv` receives
/// them, each under a random timeout. A message is sent only while a
/// receive is posted (the sender waits for the receiver's next receive,
/// then a random 0–100 µs), at most `window` ahead of the receiver.
/// Both keep the receive queue from running dry: a verbs RC queue pair
/// made by rdma_cm makes a sender that finds no receive posted wait out
/// a 655 ms RNR timer, and DGRAM has no flow control at all.
async fn soak<F, Fut>(
    tx: Endpoint,
    dest: FiAddr,
    n: u64,
    window: usize,
    mut recv: F,
    rx_ep: Option<&Endpoint>,
) -> Soak
where
    F: FnMut(BytesMut) -> Fut,
    Fut: Future<Output = Result<CqEntry, CqErrEntry>>,
{
    let mut rng = Rng::seeded("WEFT_CANCEL_SEED");
    let mut gaps = Rng(rng.0.rotate_left(17) | 1);
    let mut window = SoakWindow::new(window);
    let posted = Arc::new(Notify::new());
    let sender = tokio::spawn({
        let (permits, posted) = (window.permits.clone(), posted.clone());
        async move {
            for i in 0..n {
                permits.acquire().await.unwrap().forget();
                posted.notified().await;
                Until(Instant::now() + Duration::from_micros(gaps.below(101))).await;
                if let Err(e) = tx.send(dest, numbered(i)).await {
                    panic!("send of message {i}: {e:?}");
                }
            }
        }
    });
    let start = Instant::now();
    let mut got = Vec::with_capacity(n as usize);
    let mut withdrawn = 0;
    let mut sent_at = None;
    let mut progress = Instant::now();
    while (got.len() as u64) < n {
        if progress.elapsed() > STALL {
            panic!(
                "stalled for {STALL:?}: {} of {n} messages after {withdrawn} withdrawn receives; \
                 sender finished: {}, permits {}, receiver {:?}",
                got.len(),
                sender.is_finished(),
                window.permits.available_permits(),
                rx_ep.map(|e| e.stats())
            );
        }
        if sender.is_finished() {
            let at = *sent_at.get_or_insert_with(Instant::now);
            if at.elapsed() > weft_integration::TIMEOUT {
                lost(&got, n, withdrawn);
            }
        }
        let buf = BytesMut::zeroed(RECV_LENS[rng.below(2) as usize]);
        // On a current-thread runtime the sender runs once this task
        // yields, which is after the receive is posted; on a multi-thread
        // one it may send first, and the message waits as unexpected.
        posted.notify_waiters();
        match under_timeout(recv(buf), rng.below(201)).await {
            Some(Ok(e)) => {
                got.push(number(e));
                progress = Instant::now();
                window.delivered();
                if got.len() as u64 % (n / 4).max(1) == 0 {
                    eprintln!("  {} of {n} after {:.2?}", got.len(), start.elapsed());
                }
            }
            Some(Err(e)) => panic!("receive {} failed: {e:?}", got.len()),
            None => {
                withdrawn += 1;
                window.withdrawn();
            }
        }
    }
    within("the sender", sender).await.unwrap();
    Soak {
        got,
        withdrawn,
        took: start.elapsed(),
    }
}

/// Fails with what is missing after the sender has finished.
fn lost(got: &[u64], n: u64, withdrawn: u64) -> ! {
    let mut seen = vec![false; n as usize];
    for &i in got {
        seen[i as usize] = true;
    }
    let missing: Vec<usize> = (0..n as usize).filter(|&i| !seen[i]).collect();
    panic!(
        "{} of {n} messages never arrived ({withdrawn} receives withdrawn); first missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
}

/// Checks a soak: every message once (in order if `ordered`), and enough
/// receives withdrawn that the test meant something.
fn check(what: &str, s: &Soak, n: u64, ordered: bool) {
    let out_of_order = s.got.windows(2).filter(|p| p[1] < p[0]).count();
    eprintln!(
        "{what}: {n} messages, {} receives awaited, {} withdrawn by their timeout, \
         {out_of_order} out of order, {:.2?}",
        n + s.withdrawn,
        s.withdrawn,
        s.took
    );
    let mut sorted = s.got.clone();
    sorted.sort_unstable();
    let dups = sorted.windows(2).filter(|p| p[0] == p[1]).count();
    assert_eq!(dups, 0, "{what}: messages received twice");
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "{what}: every message once"
    );
    if ordered {
        assert_eq!(out_of_order, 0, "{what}: messages out of order");
    }
    assert!(
        s.withdrawn >= n / 50,
        "{what}: only {} of {} receives timed out; the soak withdrew too few to mean anything",
        s.withdrawn,
        n + s.withdrawn
    );
}

/// After a soak nothing is left over: a last receive gets nothing, and
/// every receive credit is back.
async fn nothing_left<F, Fut>(what: &str, ep: &Endpoint, mut recv: F)
where
    F: FnMut(BytesMut) -> Fut,
    Fut: Future<Output = Result<CqEntry, CqErrEntry>>,
{
    let r = tokio::time::timeout(QUIET, recv(BytesMut::zeroed(MSG_LEN))).await;
    assert!(r.is_err(), "{what}: left over after the soak: {r:?}");
    assert_eq!(
        ep.rx_size_left().unwrap(),
        ep.info().rx_attr.size,
        "{what}: every receive withdrawn gave its credit back"
    );
}

/// A soak on both runtimes: `$ct` on a current-thread one, `$mt` on a
/// multi-thread one with two workers.
macro_rules! on_both_runtimes {
    ($(#[$m:meta])* $ct:ident, $mt:ident, $body:ident) => {
        $(#[$m])*
        #[tokio::test]
        async fn $ct() {
            $body().await
        }

        $(#[$m])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $mt() {
            $body().await
        }
    };
}

/// One side of a connection: its fabric, domain and offer.
struct Side {
    fabric: Fabric,
    domain: Domain,
    info: Info,
}

fn side(info: Info) -> Side {
    let fabric = Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    Side {
        fabric,
        domain,
        info,
    }
}

/// A connected MSG endpoint with its queues.
struct Conn {
    ep: Endpoint,
    cq: CompletionQueue,
    _eq: EventQueue,
}

/// An enabled MSG endpoint of `s` (the accepting one of `req`), bound to
/// `srx` if given.
fn msg_ep(s: &Side, req: Option<&ConnRequest>, srx: Option<&SharedRxContext>) -> Conn {
    let ep = match req {
        Some(r) => s.domain.accept_endpoint(&s.info, r).unwrap(),
        None => s.domain.endpoint(&s.info).unwrap(),
    };
    let eq = s.fabric.eq(64).unwrap();
    let cq = s
        .domain
        .cq(CqAttr {
            wait: WaitMode::Interrupt,
            ..CqAttr::default()
        })
        .unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    if let Some(x) = srx {
        ep.bind_srx(x).unwrap();
    }
    ep.enable().unwrap();
    Conn { ep, cq, _eq: eq }
}

/// A server endpoint of `srv` (on `srx` if given) connected to a client
/// of `cli`: `(server, client, listener)`.
async fn connect(
    srv: &Side,
    cli: &Side,
    srx: Option<&SharedRxContext>,
) -> (Conn, Conn, PassiveEndpoint) {
    let pep = srv.fabric.passive_endpoint(&srv.info, None).unwrap();
    let peq = srv.fabric.eq(16).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let client = msg_ep(cli, None, None);
    let (c, addr) = (client.ep.clone(), pep.local_addr().unwrap());
    let connecting = tokio::spawn(async move { c.connect(addr, Vec::new()).await });
    let ev = within("connection request", next_eq(&peq)).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = ConnRequest::from_event(&ev).unwrap();
    let server = msg_ep(srv, Some(&req), srx);
    within("accept", server.ep.accept(Vec::new()))
        .await
        .unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    for q in [&client._eq, &server._eq] {
        let ev = within("connected", next_eq(q)).await.unwrap();
        assert_eq!(ev.kind, EqEventKind::Connected);
    }
    (server, client, pep)
}

/// The tcp MSG offer, one side for both ends.
fn tcp_msg() -> Side {
    side(Provider::named("tcp").info(EpType::Msg))
}

/// A verbs MSG server on rxe1 and client on rxe2, or `None` outside the VM.
fn verbs_msg() -> Option<(Side, Side)> {
    let s = verbs_offer(SERVER_DEV, EpType::Msg)?;
    let c = verbs_offer(CLIENT_DEV, EpType::Msg)?;
    Some((side(s), side(c)))
}

async fn soak_msg(what: &str, srv: &Side, cli: &Side, n: u64, window: usize) {
    let (s, c, _pep) = connect(srv, cli, None).await;
    let r = soak(c.ep.clone(), 0, n, window, |b| s.ep.recv(b), Some(&s.ep)).await;
    check(what, &r, n, true);
    nothing_left(what, &s.ep, |b| s.ep.recv(b)).await;
}

async fn tcp_msg_soak() {
    let t = tcp_msg();
    soak_msg("tcp MSG", &t, &t, messages(10_000, 2_000), 256).await;
}

on_both_runtimes!(
    tcp_msg_dropped_receives_lose_nothing,
    tcp_msg_dropped_receives_lose_nothing_multi_thread,
    tcp_msg_soak
);

async fn tcp_rdm_soak() {
    let h = Harness::rdm(&Provider::named("tcp"));
    let (a, b, b_in_a, _) = h.rdm_pair();
    let n = messages(10_000, 2_000);
    let r = soak(
        a.ep.clone(),
        b_in_a,
        n,
        256,
        |buf| b.ep.recv(buf),
        Some(&b.ep),
    )
    .await;
    check("tcp RDM", &r, n, true);
    nothing_left("tcp RDM", &b.ep, |buf| b.ep.recv(buf)).await;
}

on_both_runtimes!(
    tcp_rdm_dropped_receives_lose_nothing,
    tcp_rdm_dropped_receives_lose_nothing_multi_thread,
    tcp_rdm_soak
);

async fn verbs_msg_soak() {
    let Some((s, c)) = verbs_msg() else { return };
    // One message in flight: a second could find the receive queue empty
    // (a withdrawn receive's work request is reused by the next receive
    // rather than joined by another) and wait out the RNR timer.
    soak_msg("verbs MSG", &s, &c, messages(10_000, 2_000), 1).await;
}

on_both_runtimes!(
    #[cfg_attr(
        not(feature = "verbs"),
        ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
    )]
    verbs_msg_dropped_receives_lose_nothing,
    verbs_msg_dropped_receives_lose_nothing_multi_thread,
    verbs_msg_soak
);

async fn verbs_rdm_soak() {
    let (Some(si), Some(ci)) = (
        verbs_offer(SERVER_DEV, EpType::Rdm),
        verbs_offer(CLIENT_DEV, EpType::Rdm),
    ) else {
        return;
    };
    let (s, c) = (
        Node::open(&si, WaitMode::Interrupt),
        Node::open(&ci, WaitMode::Interrupt),
    );
    let to_s = c.handle_of(&s);
    let n = messages(10_000, 2_000);
    let r = soak(c.ep.clone(), to_s, n, 256, |b| s.ep.recv(b), Some(&s.ep)).await;
    check("verbs RDM", &r, n, true);
    nothing_left("verbs RDM", &s.ep, |b| s.ep.recv(b)).await;
}

on_both_runtimes!(
    #[cfg_attr(
        not(feature = "verbs"),
        ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
    )]
    verbs_rdm_dropped_receives_lose_nothing,
    verbs_rdm_dropped_receives_lose_nothing_multi_thread,
    verbs_rdm_soak
);

/// Datagrams may be lost by a network, but not on the VM's soft-RoCE
/// devices with the sender kept within 64 datagrams of the receiver (the
/// endpoint has 256 slots): every one must arrive. DGRAM promises no
/// order, so only reordering is reported.
async fn verbs_dgram_soak() {
    let (Some(si), Some(ci)) = (
        verbs_offer(SERVER_DEV, EpType::Dgram),
        verbs_offer(CLIENT_DEV, EpType::Dgram),
    ) else {
        return;
    };
    let (s, c) = (
        Node::open(&si, WaitMode::Interrupt),
        Node::open(&ci, WaitMode::Interrupt),
    );
    let rep = within(
        "dgram insert",
        c.av.insert(&[s.ep.local_addr().unwrap()], AvFlags::empty(), 0)
            .unwrap(),
    )
    .await;
    assert_eq!(rep.count, 1, "{rep:?}");
    let n = messages(10_000, 2_000);
    let r = soak(
        c.ep.clone(),
        rep.fi_addrs[0],
        n,
        64,
        |b| s.ep.recv(b),
        Some(&s.ep),
    )
    .await;
    check("verbs DGRAM", &r, n, false);
    nothing_left("verbs DGRAM", &s.ep, |b| s.ep.recv(b)).await;
}

on_both_runtimes!(
    #[cfg_attr(
        not(feature = "verbs"),
        ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
    )]
    verbs_dgram_dropped_receives_lose_nothing,
    verbs_dgram_dropped_receives_lose_nothing_multi_thread,
    verbs_dgram_soak
);

/// udp DGRAM on loopback, in each wait mode: loopback loses nothing
/// while the sender stays within 64 datagrams of the receiver, so every
/// one must arrive; a datagram that reached a receive whose future was
/// then dropped goes back to the head of the held datagrams. DGRAM
/// promises no order, so only reordering is reported.
async fn udp_dgram_soak_in(mode: WaitMode, n: u64) {
    let info = Provider::named("udp").info(EpType::Dgram);
    let (s, c) = (Node::open(&info, mode), Node::open(&info, mode));
    let to_s = c.handle_of(&s);
    let what = format!("udp DGRAM {mode:?}");
    let r = soak(c.ep.clone(), to_s, n, 64, |b| s.ep.recv(b), Some(&s.ep)).await;
    check(&what, &r, n, false);
    nothing_left(&what, &s.ep, |b| s.ep.recv(b)).await;
    assert_eq!(
        s.ep.stats().unwrap().unexpected_bytes,
        0,
        "{what}: nothing held"
    );
}

async fn udp_dgram_soak() {
    udp_dgram_soak_in(WaitMode::Interrupt, messages(10_000, 2_000)).await;
}

on_both_runtimes!(
    udp_dgram_dropped_receives_lose_nothing,
    udp_dgram_dropped_receives_lose_nothing_multi_thread,
    udp_dgram_soak
);

/// The spinning modes: fewer messages (each soak spins a core).
async fn udp_dgram_soak_spinning() {
    for mode in [WaitMode::Inline, WaitMode::BusyPoll] {
        udp_dgram_soak_in(mode, messages(2_000, 1_000)).await;
    }
}

on_both_runtimes!(
    udp_dgram_spinning_dropped_receives_lose_nothing,
    udp_dgram_spinning_dropped_receives_lose_nothing_multi_thread,
    udp_dgram_soak_spinning
);

/// shm RDM, in each wait mode: every message arrives, in order (one
/// sender's messages travel one ring); a message that reached a receive
/// whose future was then dropped goes back to the head of the held ones.
async fn shm_rdm_soak_in(mode: WaitMode, n: u64) {
    let info = Provider::named("shm").info(EpType::Rdm);
    let (s, c) = (Node::open(&info, mode), Node::open(&info, mode));
    let to_s = c.handle_of(&s);
    let what = format!("shm RDM {mode:?}");
    // A short window: shm delivers in a microsecond or two, so a sender
    // far ahead would leave every receive a message already there and
    // few receives would time out (too few to mean anything).
    let r = soak(c.ep.clone(), to_s, n, 4, |b| s.ep.recv(b), Some(&s.ep)).await;
    check(&what, &r, n, true);
    nothing_left(&what, &s.ep, |b| s.ep.recv(b)).await;
    assert_eq!(
        s.ep.stats().unwrap().unexpected_bytes,
        0,
        "{what}: nothing held"
    );
}

async fn shm_rdm_soak() {
    shm_rdm_soak_in(WaitMode::Interrupt, messages(10_000, 2_000)).await;
}

on_both_runtimes!(
    shm_rdm_dropped_receives_lose_nothing,
    shm_rdm_dropped_receives_lose_nothing_multi_thread,
    shm_rdm_soak
);

/// The spinning modes: fewer messages (each soak spins a core).
async fn shm_rdm_soak_spinning() {
    for mode in [WaitMode::Inline, WaitMode::BusyPoll] {
        shm_rdm_soak_in(mode, messages(2_000, 1_000)).await;
    }
}

on_both_runtimes!(
    shm_rdm_spinning_dropped_receives_lose_nothing,
    shm_rdm_spinning_dropped_receives_lose_nothing_multi_thread,
    shm_rdm_soak_spinning
);

/// Receives awaited on a shared receive context: a dropped future
/// withdraws its receive from the context, or gives back the message that
/// reached it, reported on the CQ of the endpoint it arrived at.
async fn verbs_srx_soak() {
    let Some((s, c)) = verbs_msg() else { return };
    srx_soak("verbs shared receive context", &s, &c, 1).await;
}

/// The soak through a shared receive context on `srv`'s side of a MSG
/// connection, `window` sends ahead.
async fn srx_soak(what: &str, srv: &Side, cli: &Side, window: usize) {
    let srx = srv.domain.srx_context(0).unwrap();
    let (server, client, _pep) = connect(srv, cli, Some(&srx)).await;
    let n = messages(10_000, 2_000);
    let r = soak(
        client.ep.clone(),
        0,
        n,
        window,
        |b| srx.recv(b),
        Some(&server.ep),
    )
    .await;
    check(what, &r, n, true);
    let left = tokio::time::timeout(QUIET, srx.recv(BytesMut::zeroed(MSG_LEN))).await;
    assert!(left.is_err(), "left over after the soak: {left:?}");
    assert_cq_quiet(&server.cq, "the endpoint's CQ after the soak").await;
    // Zero where the provider does not count (verbs).
    assert_eq!(srx.stats().unexpected_bytes, 0, "nothing held");
}

on_both_runtimes!(
    #[cfg_attr(
        not(feature = "verbs"),
        ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
    )]
    verbs_srx_dropped_receives_lose_nothing,
    verbs_srx_dropped_receives_lose_nothing_multi_thread,
    verbs_srx_soak
);

/// The same over tcp: a MSG connection whose server endpoint takes its
/// receives from a shared context (the context's matcher and unexpected
/// queue take the message back).
async fn tcp_srx_soak() {
    let t = tcp_msg();
    srx_soak("tcp shared receive context", &t, &t, 256).await;
}

on_both_runtimes!(
    tcp_srx_dropped_receives_lose_nothing,
    tcp_srx_dropped_receives_lose_nothing_multi_thread,
    tcp_srx_soak
);

/// Sends messages `from..to` from `c`, each awaited.
async fn send_range(c: &Endpoint, dest: FiAddr, from: u64, to: u64) {
    for i in from..to {
        within("send", c.send(dest, numbered(i)))
            .await
            .unwrap_or_else(|e| panic!("send {i}: {e:?}"));
    }
}

/// The next completion of `cq`: a successful receive of message `want`
/// with `context`.
async fn expect_msg(cq: &CompletionQueue, context: u64, want: u64) {
    let e = within("receive", next_cq(cq)).await.unwrap();
    assert_eq!(e.context, context, "{e:?}");
    assert_eq!(number(e), want);
}

/// `cancel` on receives already posted (on verbs: on the queue pair, one
/// in a bounce slot and one registered in place) ends each with
/// `Canceled` (and its buffers, if `hands_back`: tcp keeps them); the
/// messages that follow go, in order, to the receives still posted and
/// then to the next one posted; `NoEnt` only for a receive that already
/// ended or was never posted.
async fn cancel_posted(s: &Conn, c: &Endpoint, hands_back: bool) {
    let full = s.ep.info().rx_attr.size;
    for (ctx, len) in [(1, 64), (2, 8192), (3, 64), (4, 8192)] {
        s.ep.post_recv(BytesMut::zeroed(len), ctx).unwrap();
    }
    s.ep.cancel(1).unwrap();
    s.ep.cancel(2).unwrap();
    for (ctx, len) in [(1, 64), (2, 8192)] {
        let e = within("cancelled receive", next_cq(&s.cq))
            .await
            .unwrap_err();
        assert_eq!((e.context, e.err), (ctx, Error::Canceled));
        if hands_back {
            let back: usize = e.bufs.iter().map(|b| b.capacity()).sum();
            assert!(back >= len, "receive {ctx}: {back} bytes of buffer back");
        }
    }
    assert_eq!(s.ep.rx_size_left().unwrap(), full - 2);
    send_range(c, 0, 0, 3).await;
    expect_msg(&s.cq, 3, 0).await;
    expect_msg(&s.cq, 4, 1).await;
    // The third message waits for the next receive.
    s.ep.post_recv(BytesMut::zeroed(64), 5).unwrap();
    expect_msg(&s.cq, 5, 2).await;
    for ctx in [1, 3, 5, 77] {
        assert_eq!(s.ep.cancel(ctx).unwrap_err(), Error::NoEnt, "context {ctx}");
    }
    // The cancelled receives' work requests were used up, nothing else.
    s.ep.post_recv(BytesMut::zeroed(8192), 6).unwrap();
    send_range(c, 0, 3, 4).await;
    expect_msg(&s.cq, 6, 3).await;
    assert_cq_quiet(&s.cq, "after the cancels").await;
    assert_eq!(s.ep.rx_size_left().unwrap(), full);
}

#[tokio::test]
async fn tcp_msg_cancel_posted_receives() {
    let t = tcp_msg();
    let (s, c, _pep) = connect(&t, &t, None).await;
    cancel_posted(&s, &c.ep, false).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test]
async fn verbs_msg_cancel_posted_receives() {
    let Some((srv, cli)) = verbs_msg() else {
        return;
    };
    let (s, c, _pep) = connect(&srv, &cli, None).await;
    cancel_posted(&s, &c.ep, true).await;
}

/// `cancel` on a shared context's receives, already on its shared queue:
/// withdrawn (the context has no CQ of its own for the `Canceled` entry),
/// and the messages go to the receives still posted, in order.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test]
async fn verbs_srx_cancel_posted_receives() {
    let Some((srv, cli)) = verbs_msg() else {
        return;
    };
    let srx = srv.domain.srx_context(16).unwrap();
    let (s, c, _pep) = connect(&srv, &cli, Some(&srx)).await;
    for (ctx, len) in [(1, 64), (2, 8192), (3, 64), (4, 8192)] {
        srx.post_recv(BytesMut::zeroed(len), ctx).unwrap();
    }
    srx.cancel(1).unwrap();
    srx.cancel(2).unwrap();
    assert_eq!(srx.rx_size_left().unwrap(), 14);
    send_range(&c.ep, 0, 0, 3).await;
    expect_msg(&s.cq, 3, 0).await;
    expect_msg(&s.cq, 4, 1).await;
    srx.post_recv(BytesMut::zeroed(64), 5).unwrap();
    expect_msg(&s.cq, 5, 2).await;
    for ctx in [1, 3, 77] {
        assert_eq!(srx.cancel(ctx).unwrap_err(), Error::NoEnt, "context {ctx}");
    }
    assert_cq_quiet(&s.cq, "after the cancels").await;
    assert_eq!(srx.rx_size_left().unwrap(), 16);
}
