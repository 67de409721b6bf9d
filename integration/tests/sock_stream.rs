//! `FI_EP_SOCK_STREAM` on tcp and on verbs (over an RC connection; those
//! instances run in the rxe VM, `integration/run-rxe`): connection
//! management as on MSG endpoints, then the connection as Tokio I/O
//! (`weft::SockStream`). An unmodified HTTP/2 client and server (the `h2`
//! crate) run over it; end of stream, writes after shutdown and the
//! stream's life cycle behave as a socket's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft::{Caps, EpType, EqEventKind, Error, Info, SockStream, WaitMode};
use weft_integration::child::Reap;
use weft_integration::rxe_net::Partition;
use weft_integration::{next_eq, within};

/// One instance of each test per provider; the verbs ones need an RDMA
/// device and are reported as ignored in builds without verbs.
macro_rules! per_provider {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name("tcp").await;
                }
            )*
        }
        mod verbs {
            $(
                #[cfg_attr(
                    not(feature = "verbs"),
                    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
                )]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name("verbs").await;
                }
            )*
        }
    };
}

per_provider! {
    http2_over_a_sock_stream,
    end_of_stream_and_writes_after_shutdown,
    a_dropped_peer_ends_the_stream,
    a_killed_peer_ends_the_stream,
    a_killed_reader_fails_the_writer,
    only_stream_endpoints_have_streams,
    every_wait_mode_carries_the_stream,
    keyed_streams_prove_their_key,
}

fn stream_info(prov: &'static str) -> Info {
    if prov == "verbs" {
        return weft_integration::verbs_offer(
            &weft_integration::verbs_domain(),
            EpType::SockStream,
        )
        .expect("verbs offers FI_EP_SOCK_STREAM");
    }
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::SockStream;
    hints.fabric_attr.prov_name = Some(prov.into());
    weft::getinfo(Some(&hints))
        .expect("tcp offers FI_EP_SOCK_STREAM")
        .remove(0)
}

/// Both ends of one connection: (client, server).
async fn connected(prov: &'static str) -> (SockStream, SockStream) {
    connected_with(prov, WaitMode::Interrupt).await
}

/// A fabric, domain, and a passive endpoint of them for `info`,
/// listening, with its EQ.
fn listening(
    info: &Info,
) -> (
    weft::Fabric,
    weft::Domain,
    weft::PassiveEndpoint,
    weft::EventQueue,
) {
    let fabric = weft::Fabric::open(info).unwrap();
    let domain = fabric.domain(info).unwrap();
    let pep = fabric.passive_endpoint(info, None).unwrap();
    let peq = fabric.eq(8).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    (fabric, domain, pep, peq)
}

/// The endpoint that takes the connection request `ev` reports, bound
/// to an EQ of its own.
fn accepting(
    fabric: &weft::Fabric,
    domain: &weft::Domain,
    info: &Info,
    ev: &weft::EqEvent,
) -> (weft::Endpoint, weft::EventQueue) {
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = weft::ConnRequest::from_event(ev).unwrap();
    let ep = domain.accept_endpoint(info, &req).unwrap();
    let eq = fabric.eq(8).unwrap();
    ep.bind_eq(&eq).unwrap();
    (ep, eq)
}

/// Both ends of one connection whose endpoints make progress in `wait`.
async fn connected_with(prov: &'static str, wait: WaitMode) -> (SockStream, SockStream) {
    let info = stream_info(prov);
    let (fabric, domain, pep, peq) = listening(&info);
    let open = |req: Option<&weft::ConnRequest>| {
        let ep = match req {
            Some(r) => domain.accept_endpoint(&info, r).unwrap(),
            None => domain.endpoint(&info).unwrap(),
        };
        let eq = fabric.eq(8).unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.set_wait_mode(wait).unwrap();
        ep.enable().unwrap();
        (ep, eq)
    };
    let (cep, ceq) = open(None);
    assert_eq!(cep.stream().unwrap_err(), Error::NotConn);
    let to = pep.local_addr().unwrap();
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(to, b"hello".to_vec()).await });
    let ev = within("connreq", next_eq(&peq)).await.unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    assert_eq!(ev.cm_data, b"hello");
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let (sep, seq) = open(Some(&req));
    within("accept", sep.accept(b"welcome".to_vec()))
        .await
        .unwrap();
    let cm = within("connect", conn).await.unwrap().unwrap();
    assert_eq!(cm, b"welcome");
    for q in [&ceq, &seq] {
        let ev = within("connected", next_eq(q)).await.unwrap();
        assert_eq!(ev.kind, EqEventKind::Connected);
    }
    let (c, s) = (cep.stream().unwrap(), sep.stream().unwrap());
    assert_eq!(cep.stream().unwrap_err(), Error::OpBadState, "taken once");
    // The streams outlive their endpoints.
    drop((cep, sep, pep, domain, fabric));
    (c, s)
}

/// What the echo server answers for a body: its bytes reversed.
fn answer(body: &[u8]) -> Vec<u8> {
    body.iter().rev().copied().collect()
}

fn body(i: usize) -> Bytes {
    let len = (i * 7919) % 20_000;
    Bytes::from((0..len).map(|k| (k * 31 + i) as u8).collect::<Vec<u8>>())
}

async fn serve(s: SockStream) {
    let mut conn = h2::server::handshake(s).await.unwrap();
    while let Some(r) = conn.accept().await {
        let (req, mut respond) = r.unwrap();
        tokio::spawn(async move {
            let mut rx = req.into_body();
            let mut got = Vec::new();
            while let Some(chunk) = rx.data().await {
                let chunk = chunk.unwrap();
                rx.flow_control().release_capacity(chunk.len()).unwrap();
                got.extend_from_slice(&chunk);
            }
            let resp = http::Response::builder().status(200).body(()).unwrap();
            let mut tx = respond.send_response(resp, false).unwrap();
            tx.send_data(Bytes::from(answer(&got)), true).unwrap();
        });
    }
}

/// 1,000 HTTP/2 requests with bodies up to 20 KB, each answered and
/// checked byte for byte, 8 in flight at a time.
async fn http2_over_a_sock_stream(prov: &'static str) {
    let (c, s) = connected(prov).await;
    let server = tokio::spawn(serve(s));
    let (client, conn) = h2::client::handshake(c).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client.ready().await.unwrap();
    let mut next = 0usize;
    while next < 1000 {
        let mut inflight = Vec::new();
        for i in next..(next + 8).min(1000) {
            let req = http::Request::builder()
                .method("POST")
                .uri("http://weft.invalid/echo")
                .body(())
                .unwrap();
            let (resp, mut tx) = client.send_request(req, false).unwrap();
            tx.send_data(body(i), true).unwrap();
            inflight.push((i, resp));
            client = client.ready().await.unwrap();
        }
        // The bodies are read side by side: HTTP/2 flow control shares one
        // connection window among the streams, and a reader that waits on
        // one stream while the others' unread data holds the window would
        // wait for ever.
        let reads = inflight.into_iter().map(|(i, resp)| async move {
            let resp = resp.await.unwrap();
            assert_eq!(resp.status(), 200);
            let mut rx = resp.into_body();
            let mut got = Vec::new();
            while let Some(chunk) = rx.data().await {
                let chunk = chunk.unwrap();
                rx.flow_control().release_capacity(chunk.len()).unwrap();
                got.extend_from_slice(&chunk);
            }
            assert_eq!(got, answer(&body(i)), "request {i}");
        });
        within("responses", futures::future::join_all(reads)).await;
        next += 8;
    }
    drop(client);
    driver.abort();
    server.abort();
}

/// The end of the peer's writing reads as 0 bytes (not an error), after
/// everything it wrote; writing after one's own shutdown fails.
async fn end_of_stream_and_writes_after_shutdown(prov: &'static str) {
    let (mut c, mut s) = connected(prov).await;
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let writer = tokio::spawn(async move {
        c.write_all(&big).await.unwrap();
        c.shutdown().await.unwrap();
        let e = c.write_all(b"late").await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e:?}");
        c
    });
    let mut got = Vec::new();
    within("read to the end", s.read_to_end(&mut got))
        .await
        .unwrap();
    assert_eq!(got.len(), 3_000_000);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    let mut more = [0u8; 8];
    assert_eq!(s.read(&mut more).await.unwrap(), 0, "EOF stays EOF");
    // The other direction is still open.
    s.write_all(b"still here").await.unwrap();
    s.shutdown().await.unwrap();
    let mut c = within("writer", writer).await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"still here");
}

/// The peer closing without a word: reads end, nothing hangs.
async fn a_dropped_peer_ends_the_stream(prov: &'static str) {
    let (c, mut s) = connected(prov).await;
    drop(c);
    let mut buf = BytesMut::zeroed(64);
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("a read after the peer closed returns")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

/// Makes the ignored test `killed_peer_child` the peer process of
/// `a_killed_peer_*`: "<provider> <role> <listener's address in hex>",
/// the role `write` (writes until killed), `read` (reads a little, then
/// holds still) or `drain` (reads everything), each optionally
/// `@<verbs device>` to connect from.
const PEER_ENV: &str = "WEFT_STREAM_KILLED_PEER";

/// Byte `i` of what the killed writer writes.
fn nth(i: u64) -> u8 {
    (i % 251) as u8
}

/// The server's end of a connection from a peer process in `role`
/// (`killed_peer_child`), and the process.
async fn from_peer_process(prov: &'static str, role: &str) -> (SockStream, Reap) {
    let info = stream_info(prov);
    let (fabric, domain, pep, peq) = listening(&info);
    let to: String = pep
        .local_addr()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let child = Reap(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "killed_peer_child",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env(PEER_ENV, format!("{prov} {role} {to}"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // A process start is slow in the emulated VM.
    let ev = tokio::time::timeout(Duration::from_secs(60), next_eq(&peq))
        .await
        .expect("the peer process connects")
        .unwrap();
    let (sep, _seq) = accepting(&fabric, &domain, &info, &ev);
    sep.enable().unwrap();
    within("accept", sep.accept(Vec::new())).await.unwrap();
    (sep.stream().unwrap(), child)
}

/// SIGKILL, the zombie reaped; when.
fn kill9(child: &mut Reap) -> Instant {
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    Instant::now()
}

/// How long a killed peer may take to be noticed (the emulated VM is
/// slow; on the host it takes microseconds).
const NOTICED: Duration = Duration::from_secs(10);

/// A peer process killed with SIGKILL while it writes (no `FIN`, no
/// disconnect of its own; the kernel closes what it had): the reader gets
/// every byte that arrived, unchanged (also those that arrived before
/// the kill but are read after it), then the end of the stream
/// (`Ok(0)`, as a socket's peer killed with nothing unread gives),
/// within a bounded time; writes then fail (on verbs the first,
/// `BrokenPipe`). On verbs the kernel's connection manager sends the
/// disconnect request of the destroyed connection, which the stream
/// reads as the end after what arrived (`docs/design.md`).
async fn a_killed_peer_ends_the_stream(prov: &'static str) {
    let (mut s, mut child) = from_peer_process(prov, "write").await;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    let check = |part: &[u8], got: &mut u64| {
        for &b in part {
            assert_eq!(b, nth(*got), "byte {got}");
            *got += 1;
        }
    };
    while got < 1 << 20 {
        let n = within("the peer's bytes", s.read(&mut buf)).await.unwrap();
        assert!(n > 0, "the peer ended before it was killed");
        check(&buf[..n], &mut got);
    }
    // Not reading for a while lets the peer's bytes pile up here (its
    // writes wait for room), so some arrived before the kill but are
    // read after it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at_kill = got;
    let killed = kill9(&mut child);
    let end = tokio::time::timeout(NOTICED, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => check(&buf[..n], &mut got),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("a read after the peer was killed returns");
    eprintln!(
        "{prov}: {at_kill} bytes read before the kill, {got} in all, then {end:?} {:?} after it",
        killed.elapsed()
    );
    end.unwrap();
    assert!(
        got > at_kill,
        "what arrived before the kill is read after it"
    );
    // verbs refuses the first write; a TCP socket takes writes until the
    // peer's kernel answers one with a reset.
    let e = within("a write to the killed peer fails", async {
        loop {
            if let Err(e) = s.write_all(b"to nobody").await {
                return e;
            }
            assert_eq!(prov, "tcp", "verbs takes a write after the peer's end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
        "{e:?}"
    );
}

/// A peer process killed with SIGKILL while it reads what this side
/// writes (and stops reading, so writes wait for room): a waiting write
/// fails within a bounded time (`BrokenPipe` on verbs: the kernel
/// disconnects for the dead process; `ConnectionReset` or `BrokenPipe`
/// on TCP), never hangs, and so do later writes; reads then end.
async fn a_killed_reader_fails_the_writer(prov: &'static str) {
    let (mut s, mut child) = from_peer_process(prov, "read").await;
    let chunk = vec![7u8; 64 * 1024];
    // Enough to fill the peer's window, so the last write waits.
    for _ in 0..64 {
        if tokio::time::timeout(Duration::from_millis(200), s.write_all(&chunk))
            .await
            .is_err()
        {
            break;
        }
    }
    let killed = kill9(&mut child);
    let e = tokio::time::timeout(NOTICED, async {
        loop {
            if let Err(e) = s.write_all(&chunk).await {
                return e;
            }
        }
    })
    .await
    .expect("a write to the killed peer returns");
    eprintln!("{prov}: {e:?} {:?} after the kill", killed.elapsed());
    assert!(
        matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
        "{e:?}"
    );
    if prov == "verbs" {
        assert_eq!(e.kind(), ErrorKind::BrokenPipe, "{e:?}");
    }
    let e = s.write_all(b"again").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
        "{e:?}"
    );
    let mut buf = [0u8; 16];
    let r = within("a read after the peer was killed", s.read(&mut buf)).await;
    assert!(matches!(r, Ok(0)) || r.is_err(), "{r:?}");
}

/// A peer that dies without a disconnect reaching this side (a crashed
/// host, a cut link: here a peer process on rxe2 killed with SIGKILL
/// while rxe2's packets to rxe1 are lost, so the kernel's disconnect
/// request for it never arrives) while this side only reads: the stream's
/// liveness probe (a zero-length RDMA write once a waited-on stream has
/// heard nothing for 5 s) goes unacknowledged, and the read fails with
/// `ConnectionReset` within a bounded time (60 s for the emulated VM:
/// the probe's wait, then the RC retries), never hangs; so do writes
/// after it. Before that, a live peer that sends nothing for longer than
/// the probe's wait keeps the stream up (probes are acknowledged).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbs_a_silently_dead_peer_resets_the_stream() {
    assert_eq!(
        std::env::var("RXE_VM").as_deref(),
        Ok("1"),
        "reroutes the rxe VM's veth pair: run it with integration/run-rxe"
    );
    let (mut s, mut child) = from_peer_process("verbs", "drain@rxe2").await;
    let chunk = vec![3u8; 64 * 1024];
    let mut buf = [0u8; 64];
    // The peer reads and never writes: a read here waits, and the
    // probes it causes are answered.
    let idle = tokio::time::timeout(Duration::from_secs(12), s.read(&mut buf)).await;
    assert!(idle.is_err(), "a live, silent peer: {idle:?}");
    for _ in 0..16 {
        within("a write to the live peer", s.write_all(&chunk))
            .await
            .unwrap();
    }
    let cut = Partition::rxe2_to_rxe1();
    let killed = kill9(&mut child);
    let r = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf))
        .await
        .expect("a read from a silently dead peer returns");
    eprintln!("read: {r:?}, {:?} after the kill", killed.elapsed());
    drop(cut);
    assert_eq!(r.unwrap_err().kind(), ErrorKind::ConnectionReset);
    let w = s.write_all(b"to nobody").await.unwrap_err();
    assert_eq!(w.kind(), ErrorKind::ConnectionReset, "{w:?}");
}

/// The peer process of `a_killed_peer_*` and
/// `verbs_a_silently_dead_peer_resets_the_stream`, which start it (with
/// `PEER_ENV`) and kill it: connects, then writes or reads until killed.
#[ignore = "the peer process of the a_killed_peer tests, which start and kill it"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_peer_child() {
    let env = std::env::var(PEER_ENV).expect("started by an a_killed_peer test");
    let mut words = env.split(' ');
    let (Some(prov), Some(role), Some(to)) = (words.next(), words.next(), words.next()) else {
        panic!("{PEER_ENV}={env}: <provider> <role> <address>");
    };
    let prov = if prov == "verbs" { "verbs" } else { "tcp" };
    // "<role>@<device>": a verbs peer on that device.
    let (role, dev) = role
        .split_once('@')
        .map_or((role, None), |(r, d)| (r, Some(d)));
    let to: Vec<u8> = (0..to.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&to[i..i + 2], 16).unwrap())
        .collect();
    let info = match dev {
        Some(d) => weft_integration::verbs_offer(d, EpType::SockStream).unwrap(),
        None => stream_info(prov),
    };
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    let eq = fabric.eq(8).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.enable().unwrap();
    within("connect", ep.connect(to, Vec::new())).await.unwrap();
    let mut c = ep.stream().unwrap();
    if role == "drain" {
        // Reads everything, for ever.
        let mut buf = vec![0u8; 64 * 1024];
        while c.read(&mut buf).await.unwrap() > 0 {}
        return;
    }
    if role == "read" {
        // Reads a little, then holds still (its window fills).
        let mut buf = vec![0u8; 64 * 1024];
        let _ = c.read(&mut buf).await.unwrap();
        std::future::pending::<()>().await;
    }
    let mut sent = 0u64;
    loop {
        let chunk: Vec<u8> = (sent..sent + 48 * 1024).map(nth).collect();
        c.write_all(&chunk).await.unwrap();
        sent += chunk.len() as u64;
    }
}

/// What a SOCK_STREAM endpoint is not: it has no data capabilities
/// (sends and receives are `NoSys`), and other endpoint types have no
/// stream.
async fn only_stream_endpoints_have_streams(prov: &'static str) {
    let info = stream_info(prov);
    assert!(!info.caps.intersects(Caps::MSG | Caps::TAGGED | Caps::RMA));
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    let eq = fabric.eq(4).unwrap();
    ep.bind_eq(&eq).unwrap();
    ep.enable().unwrap();
    let e = ep.send(0, Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(e.err, Error::NoSys);

    let rdm = weft_integration::Provider::named(prov).info(EpType::Rdm);
    let rf = weft::Fabric::open(&rdm).unwrap();
    let rd = rf.domain(&rdm).unwrap();
    let av = rd.av(weft::AvAttr::default()).unwrap();
    let (rep, _cq) = weft_integration::enabled_endpoint(&rd, &rdm, &av, weft::WaitMode::Interrupt);
    assert_eq!(rep.stream().unwrap_err(), Error::NoSys);
}

/// Each wait mode moves the stream (interrupt, inline polling by the
/// waiting task, busy-poll): 512 KB each way, read to the end.
async fn every_wait_mode_carries_the_stream(prov: &'static str) {
    for wait in [WaitMode::Interrupt, WaitMode::Inline, WaitMode::BusyPoll] {
        let (mut c, mut s) = connected_with(prov, wait).await;
        let data: Vec<u8> = (0..512 * 1024u32).map(|i| (i % 241) as u8).collect();
        let (got_s, got_c) = weft_integration::trade_both_ways(&mut c, &mut s, &data).await;
        assert_eq!(got_s, data, "{wait:?}");
        assert_eq!(got_c, data, "{wait:?}");
    }
}

/// Authorization keys as on MSG endpoints: a client proving the
/// listener's key gets a stream that carries bytes; one with another key
/// is refused (`KeyRejected` on both sides) and has no stream.
async fn keyed_streams_prove_their_key(prov: &'static str) {
    let mut info = stream_info(prov);
    info.ep_attr.auth_key = Some(b"job-a".to_vec());
    let (fabric, domain, pep, peq) = listening(&info);
    let to = pep.local_addr().unwrap();
    let client = |key: &[u8]| {
        let mut i = info.clone();
        i.ep_attr.auth_key = Some(key.to_vec());
        let ep = domain.endpoint(&i).unwrap();
        let eq = fabric.eq(8).unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.enable().unwrap();
        (ep, eq)
    };

    let (bad, _beq) = client(b"job-b");
    let refused = within("refused connect", bad.connect(to.clone(), Vec::new())).await;
    assert_eq!(refused.unwrap_err(), Error::KeyRejected);
    assert_eq!(bad.stream().unwrap_err(), Error::NotConn);

    let (cep, _ceq) = client(b"job-a");
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(to, Vec::new()).await });
    // The listener reports the refusal (no request for the application),
    // then the good client's request.
    let e = within("refusal", next_eq(&peq)).await.unwrap_err();
    assert_eq!(e.err, Error::KeyRejected);
    let ev = within("connreq", next_eq(&peq)).await.unwrap();
    let (sep, _seq) = accepting(&fabric, &domain, &info, &ev);
    within("accept", sep.accept(Vec::new())).await.unwrap();
    within("connect", conn).await.unwrap().unwrap();
    let (mut c, mut s) = (cep.stream().unwrap(), sep.stream().unwrap());
    c.write_all(b"keyed bytes").await.unwrap();
    c.shutdown().await.unwrap();
    let mut got = Vec::new();
    within("read", s.read_to_end(&mut got)).await.unwrap();
    assert_eq!(got, b"keyed bytes");
}
