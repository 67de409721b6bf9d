//! The hostile-peer campaign against the tcp provider: each attack class
//! runs against a fresh victim (an RDM request/reply service with tight,
//! documented limits), asserts its bound — memory, descriptors, what the
//! endpoint buffers, and that a legitimate client is still served and how
//! fast — and reports what it measured.
//!
//! `tests/campaign.rs` runs the short form in the README test command;
//! `cargo run --release -p weft-integration --bin hostile-campaign --
//! --long` runs the long form. All traffic stays on loopback, every loop
//! is bounded in count, and every wait in time.

mod attacks;
pub mod raw;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, ConnLimits, CqAttr, Domain, EpStats, EpType,
    EventQueue, Fabric, FiAddr, Info, WaitMode, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};

pub use attacks::{peer, run, CLASSES};

/// How hard each attack class pushes.
#[derive(Debug, Clone)]
pub struct Scale {
    /// The name printed with the results.
    pub name: &'static str,
    /// Connect/close cycles of the churn class.
    pub churn: usize,
    /// Connections of each slowloris and garbage class.
    pub swarm: usize,
    /// Idle handshaken connections, and the victim's connection limit.
    pub idle: usize,
    /// The limit the idle flood runs into.
    pub idle_limit: usize,
    /// Parked connections of the wake-up storm.
    pub parked: usize,
    /// Zero-length (and, separately, one-byte) unexpected messages.
    pub tiny: usize,
    /// Legitimate requests timed per latency sample.
    pub rounds: usize,
    /// Whether latency ratios are bounds (the long form, a release build
    /// run as a benchmark) or only reported (the test command's debug
    /// build, where they say more about the machine than the code).
    pub timing_bounds: bool,
    /// The campaign binary, for the peer that is killed with SIGKILL.
    pub peer_exe: Option<PathBuf>,
}

impl Scale {
    /// The form CI runs on every change (well under a minute).
    pub fn short() -> Scale {
        Scale {
            name: "short",
            churn: 2_000,
            swarm: 64,
            idle: 400,
            idle_limit: 200,
            parked: 1_000,
            tiny: 20_000,
            rounds: 200,
            timing_bounds: false,
            peer_exe: None,
        }
    }

    /// The form of the measurements (minutes).
    pub fn long() -> Scale {
        Scale {
            name: "long",
            churn: 20_000,
            swarm: 1_000,
            idle: 6_000,
            idle_limit: 3_000,
            parked: 5_000,
            tiny: 2_000_000,
            rounds: 1_000,
            timing_bounds: true,
            peer_exe: None,
        }
    }
}

/// The victim's limits in the campaign: the defaults' shape at a scale
/// that lets every timeout fire within a test.
pub fn victim_limits(max_conns: usize) -> ConnLimits {
    ConnLimits::default()
        .with_max_conns(max_conns)
        .with_peer_buffered(PEER_SHARE)
        .with_idle_timeout(Some(Duration::from_millis(800)))
        .with_stall_timeout(Duration::from_millis(300))
        .with_handshake_timeout(Duration::from_millis(300))
}

/// The victim's unexpected-message budget (`rx_attr.total_buffered_recv`).
pub const BUDGET: usize = 4 << 20;
/// One peer's share of it.
pub const PEER_SHARE: usize = 512 << 10;
/// The tag the service answers.
pub const REQ_TAG: u64 = 0x5e4;
/// The tag of its replies.
pub const REPLY_TAG: u64 = 0x4e9;
/// A tag nobody receives.
pub const STRAY_TAG: u64 = 0xbad;

/// Live heap bytes, from the binary's counting allocator.
pub type HeapProbe = fn() -> usize;

/// The process's descriptors, resident memory and live heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Open file descriptors.
    pub fds: usize,
    /// Resident set size, bytes.
    pub rss: usize,
    /// Live heap bytes (what the process holds, whatever the allocator
    /// keeps cached).
    pub heap: usize,
}

impl Usage {
    /// Now.
    pub fn now(heap: HeapProbe) -> Usage {
        let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let rss = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
            .map_or(0, |pages| pages * 4096);
        Usage {
            fds,
            rss,
            heap: heap(),
        }
    }
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} fds, RSS {:.1} MB, heap {:.2} MB",
            self.fds,
            self.rss as f64 / 1e6,
            self.heap as f64 / 1e6
        )
    }
}

/// What one class measured, one line each.
#[derive(Debug, Default)]
pub struct Report {
    /// Lines of `what: value`.
    pub lines: Vec<String>,
}

impl Report {
    /// Adds a line.
    pub fn line(&mut self, s: impl Into<String>) {
        self.lines.push(s.into());
    }
}

/// A failed bound, with what was seen.
pub type Outcome = Result<Report, String>;

/// Fails with `msg` unless `ok`.
pub fn check(ok: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(msg())
    }
}

/// A legitimate client of the victim's service.
#[derive(Debug)]
pub struct Client {
    /// Its endpoint.
    pub ep: weft::Endpoint,
    /// Its AV (holding the victim).
    pub av: AddressVector,
    /// Its queue.
    pub cq: CompletionQueue,
    /// The victim's handle.
    pub server: FiAddr,
    seq: AtomicU64,
    _domain: Domain,
}

/// The attacked endpoint: an RDM service that answers `REQ_TAG` requests
/// from the peers in its AV (replies go out on their own tasks with a
/// deadline, so no peer can hold the service), and a client it knows.
#[derive(Debug)]
pub struct Victim {
    /// The service's endpoint.
    pub ep: weft::Endpoint,
    /// Its AV.
    pub av: AddressVector,
    /// Its EQ, where refusals are reported.
    pub eq: EventQueue,
    /// Its listening address.
    pub addr: SocketAddr,
    /// Requests answered.
    pub served: Arc<AtomicU64>,
    /// Receives that ended in an error (the service logs and goes on).
    pub failed: Arc<AtomicU64>,
    /// A legitimate client, connected before any attack.
    pub client: Client,
    heap: HeapProbe,
    service: tokio::task::JoinHandle<()>,
    _domain: Domain,
    _fabric: Fabric,
}

fn rdm_info() -> Info {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED | weft::Caps::SOURCE;
    let mut info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    info.rx_attr.total_buffered_recv = BUDGET;
    info
}

fn endpoint(
    domain: &Domain,
    info: &Info,
    limits: ConnLimits,
    eq: Option<&EventQueue>,
) -> (weft::Endpoint, AddressVector, CompletionQueue) {
    let av = domain.av(AvAttr::default()).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    let ep = domain.endpoint(info).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    if let Some(eq) = eq {
        ep.bind_eq(eq).unwrap();
    }
    ep.set_wait_mode(WaitMode::Interrupt).unwrap();
    ep.set_conn_limits(limits).unwrap();
    ep.enable().unwrap();
    (ep, av, cq)
}

impl Victim {
    /// Opens the service with `limits` and connects its client (one
    /// request answered), so the baseline includes that connection.
    pub async fn open(limits: ConnLimits, heap: HeapProbe) -> Victim {
        let info = rdm_info();
        let fabric = Fabric::open(&info).unwrap();
        let domain = fabric.domain(&info).unwrap();
        let eq = fabric.eq(1024).unwrap();
        let (ep, av, _cq) = endpoint(&domain, &info, limits, Some(&eq));
        let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
        let client = Client::open(&ep).await;
        av.insert_sync(&[client.ep.local_addr().unwrap()], Default::default())
            .unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let service = tokio::spawn(serve(ep.clone(), served.clone(), failed.clone()));
        let v = Victim {
            ep,
            av,
            eq,
            addr,
            served,
            failed,
            client,
            heap,
            service,
            _domain: domain,
            _fabric: fabric,
        };
        v.client.request().await.unwrap();
        v
    }

    /// The service endpoint's stats.
    pub fn stats(&self) -> EpStats {
        self.ep.stats().unwrap()
    }

    /// The process's usage now.
    pub fn usage(&self) -> Usage {
        Usage::now(self.heap)
    }

    /// Waits until the service holds no more connections than `conns`
    /// (attackers reaped); how long that took, or an error after `within`.
    pub async fn settled(&self, conns: usize, within: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            let s = self.stats();
            if s.conns <= conns && s.parked == 0 {
                // Closed sockets finish closing on the runtime's threads.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > within {
                return Err(format!(
                    "connections not reaped within {within:?}: {s:?} (want at most {conns})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The errors reported on the EQ so far: (error, peer address).
    pub fn refusals(&self) -> Vec<(weft::Error, Option<SocketAddr>)> {
        let mut out = Vec::new();
        while let Ok(e) = self.eq.read_err() {
            let peer = e
                .peer_addr
                .as_ref()
                .and_then(|a| weft::decode_sockaddr(a).ok());
            out.push((e.err, peer));
        }
        while self.eq.read(false).is_ok() {}
        out
    }

    /// Drops what peers left buffered (`PEEK|DISCARD` on every tag) and
    /// returns how many messages that was.
    pub async fn discard_leftovers(&self) -> usize {
        let mut n = 0;
        while self.stats().unexpected_bytes > 0 && n < 10_000_000 {
            let mut m = weft::RecvMsg::untagged(BytesMut::new(), 0);
            m.tagged = true;
            m.ignore = u64::MAX;
            let flags = weft::OpFlags::PEEK | weft::OpFlags::DISCARD;
            if self.ep.recvmsg(m, flags).await.is_err() {
                break;
            }
            n += 1;
        }
        n
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.service.abort();
    }
}

/// The service: answers every request from a known peer, logs and goes
/// on after any failed receive.
async fn serve(ep: weft::Endpoint, served: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    loop {
        match ep
            .trecv(BytesMut::zeroed(4096), FI_ADDR_UNSPEC, REQ_TAG, 0)
            .await
        {
            // The reply goes where the AV says the request came from
            // (FI_SOURCE), never to an address the request names.
            Ok(c) if c.src != FI_ADDR_NOTAVAIL => {
                let ep = ep.clone();
                let served = served.clone();
                let src = c.src;
                let body = c.into_bytes().freeze();
                tokio::spawn(async move {
                    let r = tokio::time::timeout(
                        Duration::from_secs(2),
                        ep.tsend(src, body.clone(), REPLY_TAG),
                    )
                    .await;
                    if matches!(r, Ok(Ok(_))) {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            Ok(_) => {}
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Client {
    async fn open(server: &weft::Endpoint) -> Client {
        let info = rdm_info();
        let fabric = Fabric::open(&info).unwrap();
        let domain = fabric.domain(&info).unwrap();
        let (ep, av, cq) = endpoint(&domain, &info, ConnLimits::default(), None);
        let server = av
            .insert_sync(&[server.local_addr().unwrap()], Default::default())
            .unwrap()
            .fi_addrs[0];
        Client {
            ep,
            av,
            cq,
            server,
            seq: AtomicU64::new(1),
            _domain: domain,
        }
    }

    /// One verified request/reply round trip, bounded in time.
    pub async fn request(&self) -> Result<Duration, String> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut body = seq.to_le_bytes().to_vec();
        body.resize(64, (seq % 251) as u8);
        let body = Bytes::from(body);
        let t0 = Instant::now();
        let reply = self
            .ep
            .trecv(BytesMut::zeroed(4096), self.server, REPLY_TAG, 0);
        let send = self.ep.tsend(self.server, body.clone(), REQ_TAG);
        let (got, sent) =
            tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(reply, send) })
                .await
                .map_err(|_| format!("request {seq}: no reply within 5 s"))?;
        sent.map_err(|e| format!("request {seq}: send failed: {e:?}"))?;
        let got = got.map_err(|e| format!("request {seq}: receive failed: {e:?}"))?;
        let b = got.into_bytes();
        check(b[..] == body[..], || format!("request {seq}: wrong reply"))?;
        Ok(t0.elapsed())
    }

    /// The median of `n` sequential requests.
    pub async fn median_latency(&self, n: usize) -> Result<Duration, String> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            v.push(self.request().await?);
        }
        v.sort();
        Ok(v[v.len() / 2])
    }
}

/// A fresh client (not in the service's AV: its requests are ignored, but
/// it shows the victim still accepts connections).
pub async fn new_client_connects(v: &Victim) -> Result<(), String> {
    let c = Client::open(&v.ep).await;
    // The service ignores strangers; a stray send completing shows the
    // connection and the handshake went through.
    tokio::time::timeout(
        Duration::from_secs(5),
        c.ep.tsend(c.server, Bytes::from_static(b"hello"), STRAY_TAG),
    )
    .await
    .map_err(|_| "a new client could not connect within 5 s".to_string())?
    .map_err(|e| format!("a new client's send failed: {e:?}"))?;
    Ok(())
}
