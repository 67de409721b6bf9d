//! A request/reply service in two processes over one RDM endpoint each,
//! with tagged messages. It uses only the public `weft` API and no
//! provider-specific code: the same binary runs over tcp and (built with
//! `--features verbs`) over an RDMA device.
//!
//! ```text
//! tagged_service server [-p PROV] [-d DOMAIN] [--addr IP:PORT] [-n REQUESTS]
//! tagged_service client --server IP:PORT [-p PROV] [-d DOMAIN] [--addr IP[:PORT]]
//!                       [-n COUNT] [-s SIZE] [--timeout SECS] [--wait SECS]
//! ```
//!
//! The server binds its endpoint to a fixed address and prints it. The
//! client inserts that address into its AV and sends COUNT requests tagged
//! [`REQUEST_TAG`]; the first one carries the client's own endpoint address
//! so that the server can insert it and answer with [`REPLY_TAG`]. Every
//! reply must echo the request's sequence number and a transformation of its
//! payload; the client exits 0 only when every reply was checked.
//!
//! The server answers whoever reaches it, so it is built to survive
//! peers that fail or lie: a failed receive is reported and the loop goes
//! on (backing off while failures persist); an address a request names
//! must be a socket address of the server's own family; each reply is
//! sent by a task of its own with a deadline ([`REPLY_DEADLINE`]), at most
//! [`MAX_REPLIES_IN_FLIGHT`] at once and [`MAX_REPLIES_PER_CLIENT`] to one
//! client, so a client whose address never answers stalls nobody else; and
//! it remembers at most [`MAX_CLIENTS`] clients, forgetting (and removing
//! from its AV) the one heard from least recently.
//!
//! Over loopback:
//!
//! ```text
//! cargo run --example tagged_service -- server --addr 127.0.0.1:47610 &
//! cargo run --example tagged_service -- client --server 127.0.0.1:47610 -n 100
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::task::{Id, JoinError, JoinSet};
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, CqAttr, CqEntry, CqErrEntry, Domain,
    Endpoint, EpType, Fabric, FiAddr, Info, FI_ADDR_UNSPEC,
};

/// Tag of requests (client to server).
pub const REQUEST_TAG: u64 = 0x5754_5351_0000_0001;
/// Tag of replies (server to client).
pub const REPLY_TAG: u64 = 0x5754_5352_0000_0002;
/// The server's port when `--addr` does not name one.
pub const DEFAULT_PORT: u16 = 47610;
/// Largest request payload (`-s`).
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Room for the header and an endpoint address in front of the payload.
const HEADER_ROOM: usize = 512;

const REQUEST_MAGIC: &[u8; 4] = b"WTSQ";
const REPLY_MAGIC: &[u8; 4] = b"WTSR";
/// Replies carry the request's payload with every byte XORed with this,
/// so a reply proves the server read the request.
const REPLY_XOR: u8 = 0x5a;
/// Clients the server remembers. Any peer can claim to be a new client,
/// so past this the one heard from least recently is forgotten and its
/// AV entry removed; it is taken back if it introduces itself again.
pub const MAX_CLIENTS: usize = 1024;
/// How long a reply may take to be delivered before it is dropped.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(5);
/// Replies on their way at once; a request past this is dropped unanswered.
pub const MAX_REPLIES_IN_FLIGHT: usize = 256;
/// Replies on their way to one client: one whose address never answers
/// holds no more than these of [`MAX_REPLIES_IN_FLIGHT`].
pub const MAX_REPLIES_PER_CLIENT: usize = 8;
/// Failed receives in a row that took no message in (a sign the endpoint
/// itself is failing) retried at full speed; past them the server pauses
/// between receives, doubling up to [`MAX_RECV_BACKOFF`], so an error that
/// persists does not spin.
const RECV_FAILURES_BEFORE_BACKOFF: u32 = 3;
const FIRST_RECV_BACKOFF: Duration = Duration::from_millis(10);
const MAX_RECV_BACKOFF: Duration = Duration::from_millis(500);
/// Occurrences of one kind of trouble reported one by one; past these
/// only at powers of two, so a peer that provokes it on every message
/// cannot flood the log.
const REPORT_EACH: u64 = 16;

const USAGE: &str = "\
Usage:
  tagged_service server [-p PROV] [-d DOMAIN] [--addr IP:PORT] [-n REQUESTS]
  tagged_service client --server IP:PORT [-p PROV] [-d DOMAIN] [--addr IP[:PORT]]
                        [-n COUNT] [-s SIZE] [--timeout SECS] [--wait SECS]

  -p PROV          provider: tcp (default) or verbs
  -d DOMAIN        domain (RDMA device, e.g. rxe1); default: the provider's first
  -e rdm           endpoint type; only rdm (accepted for symmetry with `weft`)
  --addr           server: the address to bind (default: the domain's IP, or
                   127.0.0.1, port 47610); client: its own bind address
                   (default: the domain's IP, or the one routed to the server)
  -n N             server: exit after serving N requests (default: run until
                   killed); client: requests to send (default 10)
  -s SIZE          client: payload bytes per request, 0..=65536 (default 64)
  --server IP:PORT client: the server's address (required)
  --timeout SECS   client: wait this long for each reply (default 10)
  --wait SECS      client: keep retrying the first request this long while
                   the server is not reachable yet (default 10)
";

type Res<T> = Result<T, Box<dyn Error>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Server,
    Client,
}

#[derive(Debug)]
struct Opts {
    role: Role,
    prov: String,
    domain: Option<String>,
    addr: Option<String>,
    server: Option<SocketAddr>,
    count: Option<u64>,
    size: usize,
    timeout: Duration,
    wait: Duration,
}

#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for UsageError {}

fn usage_err<T>(msg: impl Into<String>) -> Res<T> {
    Err(Box::new(UsageError(msg.into())))
}

fn parse_args(argv: &[String]) -> Res<Option<Opts>> {
    let Some((role, rest)) = argv.split_first() else {
        return usage_err("missing role: server or client");
    };
    let role = match role.as_str() {
        "server" => Role::Server,
        "client" => Role::Client,
        "-h" | "--help" | "help" => return Ok(None),
        other => return usage_err(format!("unknown role '{other}': use server or client")),
    };
    let mut o = Opts {
        role,
        prov: "tcp".into(),
        domain: None,
        addr: None,
        server: None,
        count: None,
        size: 64,
        timeout: Duration::from_secs(10),
        wait: Duration::from_secs(10),
    };
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut value = || match it.next() {
            Some(v) => Ok(v.clone()),
            None => usage_err(format!("option {arg} needs a value")),
        };
        match arg.as_str() {
            "-p" => o.prov = value()?,
            "-d" => o.domain = Some(value()?),
            "-e" => {
                let v = value()?;
                if !v.eq_ignore_ascii_case("rdm") {
                    return usage_err(format!("-e {v}: this service uses rdm endpoints only"));
                }
            }
            "--addr" => o.addr = Some(value()?),
            "--server" if role == Role::Client => {
                let v = value()?;
                o.server = Some(parse_sock(&v, "--server")?);
            }
            "-n" => {
                let v = value()?;
                match v.parse::<u64>() {
                    Ok(n) if n > 0 => o.count = Some(n),
                    _ => return usage_err(format!("-n {v}: expected a positive integer")),
                }
            }
            "-s" if role == Role::Client => {
                let v = value()?;
                match v.parse::<usize>() {
                    Ok(n) if n <= MAX_PAYLOAD => o.size = n,
                    _ => return usage_err(format!("-s {v}: expected 0 to {MAX_PAYLOAD}")),
                }
            }
            "--timeout" | "--wait" if role == Role::Client => {
                let v = value()?;
                let secs = match v.parse::<u64>() {
                    Ok(s) if s > 0 => Duration::from_secs(s),
                    _ => return usage_err(format!("{arg} {v}: expected a positive integer")),
                };
                if arg == "--timeout" {
                    o.timeout = secs;
                } else {
                    o.wait = secs;
                }
            }
            "-h" | "--help" => return Ok(None),
            other => {
                let who = match role {
                    Role::Server => "server",
                    Role::Client => "client",
                };
                return usage_err(format!("{who}: unexpected argument '{other}'"));
            }
        }
    }
    if role == Role::Client && o.server.is_none() {
        return usage_err("client: --server IP:PORT is required");
    }
    Ok(Some(o))
}

fn parse_sock(s: &str, what: &str) -> Res<SocketAddr> {
    match s.parse::<SocketAddr>() {
        Ok(a) => Ok(a),
        Err(_) => usage_err(format!("{what} {s}: expected IP:PORT")),
    }
}

/// `IP:PORT`, or a bare `IP` with `port`.
fn parse_bind(s: &str, port: u16) -> Res<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    match s.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, port)),
        Err(_) => usage_err(format!("--addr {s}: expected IP or IP:PORT")),
    }
}

/// The fabric objects of one side. The fabric, domain and AV are kept so
/// that they live as long as the endpoint.
#[derive(Debug)]
struct Side {
    info: Info,
    _fabric: Fabric,
    domain: Domain,
    av: AddressVector,
    _cq: CompletionQueue,
    ep: Endpoint,
}

/// The provider's first RDM offer with tagged messages (on `-d`'s domain).
fn find_info(o: &Opts) -> Res<Info> {
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some(o.prov.clone());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    hints.domain_attr.name.clone_from(&o.domain);
    match weft::getinfo(Some(&hints)) {
        Ok(mut infos) if !infos.is_empty() => Ok(infos.remove(0)),
        Ok(_) | Err(_) => {
            let mut m = format!(
                "no RDM endpoint with tagged messages from provider '{}'{} (providers in this \
                 build: {})",
                o.prov,
                o.domain
                    .as_deref()
                    .map(|d| format!(" on domain {d}"))
                    .unwrap_or_default(),
                weft::providers().join(", ")
            );
            if let Some(why) = weft::provider_unavailable(&o.prov) {
                m.push_str(&format!("; {}: {why}", o.prov));
            }
            Err(m.into())
        }
    }
}

/// The IP of the offer's source address, if it has one (RDMA devices do).
fn info_ip(info: &Info) -> Option<IpAddr> {
    let raw = info.src_addr.as_deref()?;
    let a = weft::decode_sockaddr(raw).ok()?;
    (!a.ip().is_unspecified()).then_some(a.ip())
}

/// The local IP the kernel would use to reach `peer` (no packet is sent).
fn routed_ip(peer: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(peer).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

fn open_side(info: Info, src: SocketAddr) -> Res<Side> {
    let ctx = |what: &'static str| move |e: weft::Error| format!("{what}: {e}");
    let fabric = Fabric::open(&info).map_err(ctx("open fabric"))?;
    let domain = fabric.domain(&info).map_err(ctx("open domain"))?;
    let av = domain
        .av(AvAttr::default())
        .map_err(ctx("open address vector"))?;
    let cq = domain
        .cq(CqAttr::default())
        .map_err(ctx("open completion queue"))?;
    let ep = domain.endpoint(&info).map_err(ctx("create endpoint"))?;
    ep.bind_av(&av).map_err(ctx("bind address vector"))?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .map_err(ctx("bind completion queue"))?;
    ep.set_src_addr(weft::encode_sockaddr(&src))
        .map_err(ctx("set source address"))?;
    ep.enable()
        .map_err(|e| format!("enable endpoint at {src}: {e}"))?;
    Ok(Side {
        info,
        _fabric: fabric,
        domain,
        av,
        _cq: cq,
        ep,
    })
}

impl Side {
    fn describe(&self) -> String {
        format!(
            "provider {}, domain {}",
            self.domain.fabric().provider(),
            self.info.domain_attr.name.as_deref().unwrap_or("?")
        )
    }

    /// Our own address in printable form (`IP:PORT` when it is a socket
    /// address, the provider's string otherwise).
    fn local_str(&self) -> Res<String> {
        let raw = self.ep.local_addr()?;
        Ok(match weft::decode_sockaddr(&raw) {
            Ok(a) => a.to_string(),
            Err(_) => self.av.straddr(&raw),
        })
    }

    fn insert(&self, raw: &[u8]) -> Res<FiAddr> {
        let rep = self.av.insert_sync(&[raw.to_vec()], Default::default())?;
        match rep.results.into_iter().next() {
            Some(Ok(fi)) => Ok(fi),
            Some(Err(e)) => Err(format!("insert {}: {e}", self.av.straddr(raw)).into()),
            None => Err("insert: nothing inserted".into()),
        }
    }
}

// ------------------------------------------------------------ messages

/// A request: magic, sequence number, client id, the client's endpoint
/// address (first request only; empty otherwise), payload.
#[derive(Debug)]
struct Request {
    seq: u64,
    client: u64,
    addr: Vec<u8>,
    payload: Bytes,
}

fn encode_request(seq: u64, client: u64, addr: &[u8], payload: &[u8]) -> Res<Bytes> {
    let alen = u16::try_from(addr.len()).map_err(|_| "endpoint address too long")?;
    let mut b = BytesMut::with_capacity(4 + 8 + 8 + 2 + addr.len() + payload.len());
    b.put_slice(REQUEST_MAGIC);
    b.put_u64(seq);
    b.put_u64(client);
    b.put_u16(alen);
    b.put_slice(addr);
    b.put_slice(payload);
    Ok(b.freeze())
}

/// Splits `n` bytes off the front of `b`, or says what is missing.
fn take(b: &mut Bytes, n: usize, what: &str) -> Result<Bytes, String> {
    if b.len() < n {
        return Err(format!("message too short for its {what}"));
    }
    Ok(b.split_to(n))
}

fn be_u64(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| (v << 8) | u64::from(x))
}

fn decode_request(mut b: Bytes) -> Result<Request, String> {
    if take(&mut b, 4, "magic")?[..] != REQUEST_MAGIC[..] {
        return Err("not a request (bad magic)".into());
    }
    let seq = be_u64(&take(&mut b, 8, "sequence number")?);
    let client = be_u64(&take(&mut b, 8, "client id")?);
    let alen = usize::from(
        take(&mut b, 2, "address length")?
            .iter()
            .fold(0u16, |v, &x| (v << 8) | u16::from(x)),
    );
    let addr = take(&mut b, alen, "address")?.to_vec();
    Ok(Request {
        seq,
        client,
        addr,
        payload: b,
    })
}

fn encode_reply(seq: u64, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + 8 + payload.len());
    b.put_slice(REPLY_MAGIC);
    b.put_u64(seq);
    b.extend(payload.iter().map(|x| x ^ REPLY_XOR));
    b.freeze()
}

/// The payload of request `seq` from `client`: differs per request and
/// per byte, so a reply to the wrong request or a shifted buffer is caught.
fn pattern(client: u64, seq: u64, size: usize) -> Vec<u8> {
    let salt = client.to_le_bytes();
    (0..size)
        .map(|j| {
            (seq as u8).wrapping_mul(31) ^ (j as u8).wrapping_mul(7) ^ salt[j % 8] ^ (j >> 8) as u8
        })
        .collect()
}

/// The received bytes of a completion, truncated to what arrived.
fn received(e: CqEntry) -> Bytes {
    let len = e.len;
    let mut b = e.into_bytes();
    b.truncate(len);
    b.freeze()
}

// -------------------------------------------------------------- server

/// The side the server listens on: `--addr`, or the domain's IP (or
/// loopback) on [`DEFAULT_PORT`].
fn server_side(o: &Opts) -> Res<Side> {
    let info = find_info(o)?;
    let src = match &o.addr {
        Some(a) => parse_bind(a, DEFAULT_PORT)?,
        None => SocketAddr::new(
            info_ip(&info).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            DEFAULT_PORT,
        ),
    };
    open_side(info, src)
}

async fn server(o: &Opts) -> Res<()> {
    let side = server_side(o)?;
    println!(
        "server: listening on {} ({})",
        side.local_str()?,
        side.describe()
    );
    serve(&side, o.count).await
}

/// Answers requests until `count` replies are delivered (or forever).
/// Nothing a peer sends or fails to do ends it.
async fn serve(side: &Side, count: Option<u64>) -> Res<()> {
    let mut svc = Service::new(side, MAX_CLIENTS)?;
    let cap = HEADER_ROOM + MAX_PAYLOAD;
    let post = || {
        side.ep
            .trecv(BytesMut::zeroed(cap), FI_ADDR_UNSPEC, REQUEST_TAG, 0)
    };
    // One receive stays posted across the loop: dropping it to see to a
    // finished reply could lose a request that had just matched.
    let recv = post();
    tokio::pin!(recv);
    while count.is_none_or(|n| svc.served < n) {
        tokio::select! {
            got = &mut recv => {
                recv.set(post());
                if let Some(pause) = svc.received(got) {
                    tokio::time::sleep(pause).await;
                }
            }
            Some(done) = svc.replies.next(), if !svc.replies.is_empty() => svc.replied(done),
        }
    }
    // Replies already on their way still count; each has its deadline.
    while let Some(done) = svc.replies.next().await {
        svc.replied(done);
    }
    println!(
        "server: served {} requests from {} client(s)",
        svc.served,
        svc.clients.len()
    );
    Ok(())
}

/// The server's state between requests.
#[derive(Debug)]
struct Service<'a> {
    side: &'a Side,
    /// Our own endpoint address: what a client's must look like.
    ours: Vec<u8>,
    clients: Lru<FiAddr>,
    replies: Replies,
    served: u64,
    /// Failed receives in a row that took no message in.
    failures: u32,
    trouble: Trouble,
}

/// Counts of each kind of trouble peers caused, for rate-limited reports.
#[derive(Debug, Default)]
struct Trouble {
    recv: Tally,
    malformed: Tally,
    unknown: Tally,
    bad_addr: Tally,
    evicted: Tally,
    busy: Tally,
    undelivered: Tally,
}

impl<'a> Service<'a> {
    /// Remembering at most `max_clients` clients.
    fn new(side: &'a Side, max_clients: usize) -> Res<Service<'a>> {
        Ok(Service {
            side,
            ours: side.ep.local_addr()?,
            clients: Lru::new(max_clients),
            replies: Replies::default(),
            served: 0,
            failures: 0,
            trouble: Trouble::default(),
        })
    }

    /// Takes what a receive gave; returns how long to pause before the
    /// next one.
    fn received(&mut self, got: Result<CqEntry, CqErrEntry>) -> Option<Duration> {
        let e = match got {
            Ok(e) => {
                self.failures = 0;
                self.request(received(e));
                return None;
            }
            Err(e) => e,
        };
        if let Some(n) = self.trouble.recv.note() {
            eprintln!("server: receive failed: {} ({n} so far)", e.err);
        }
        // One that took a message in (too large, say) is its sender's
        // doing, not the endpoint failing, and pausing for it would let any
        // peer slow the server down.
        if e.len > 0 || e.olen > 0 {
            self.failures = 0;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        recv_backoff(self.failures)
    }

    /// Takes one request: decodes it, finds (or admits) its client, and
    /// sends the reply off on its own.
    fn request(&mut self, msg: Bytes) {
        let req = match decode_request(msg) {
            Ok(r) => r,
            Err(why) => {
                if let Some(n) = self.trouble.malformed.note() {
                    eprintln!("server: dropped a message: {why} ({n} so far)");
                }
                return;
            }
        };
        let Some(dest) = self.admit(&req) else {
            return;
        };
        if let Err(why) = self.replies.room(req.client) {
            if let Some(n) = self.trouble.busy.note() {
                eprintln!(
                    "server: request {} from client {:016x} dropped: {why} ({n} so far)",
                    req.seq, req.client
                );
            }
            return;
        }
        let reply = encode_reply(req.seq, &req.payload);
        let ep = self.side.ep.clone();
        self.replies
            .spawn(req.client, req.seq, deliver(ep, dest, reply));
    }

    /// The AV handle of `req`'s client; a new client must name a valid
    /// address, and may push the least recent one out.
    fn admit(&mut self, req: &Request) -> Option<FiAddr> {
        if let Some(fi) = self.clients.get(req.client) {
            return Some(fi);
        }
        let checked = if req.addr.is_empty() {
            Err("no address".to_string())
        } else {
            check_reply_addr(&req.addr, &self.ours)
        };
        let inserted =
            checked.and_then(|()| self.side.insert(&req.addr).map_err(|e| e.to_string()));
        let fi = match inserted {
            Ok(fi) => fi,
            Err(why) => {
                let t = if req.addr.is_empty() {
                    &mut self.trouble.unknown
                } else {
                    &mut self.trouble.bad_addr
                };
                if let Some(n) = t.note() {
                    eprintln!(
                        "server: request {} from unknown client {:016x} dropped: {why} ({n} so far)",
                        req.seq, req.client
                    );
                }
                return None;
            }
        };
        println!(
            "server: client {:016x} at {}",
            req.client,
            self.side.av.straddr(&req.addr)
        );
        if let Some((old, old_fi)) = self.clients.insert(req.client, fi) {
            self.forget(old, old_fi);
        }
        Some(fi)
    }

    /// Removes a client pushed out of the table from the AV too.
    fn forget(&mut self, client: u64, fi: FiAddr) {
        let removed = self.side.av.remove(&[fi]);
        if let Some(n) = self.trouble.evicted.note() {
            let how = match removed {
                Ok(()) => String::new(),
                Err(e) => format!("; removing its address failed: {e}"),
            };
            eprintln!(
                "server: forgot client {client:016x}, heard from least recently{how} ({n} so far)"
            );
        }
    }

    fn replied(&mut self, done: Done) {
        match done.outcome {
            Ok(()) => self.served += 1,
            Err(why) => {
                if let Some(n) = self.trouble.undelivered.note() {
                    eprintln!(
                        "server: reply {} to client {:016x} dropped: {why} ({n} so far)",
                        done.seq, done.client
                    );
                }
            }
        }
    }
}

/// Sends one reply, giving up after [`REPLY_DEADLINE`].
async fn deliver(ep: Endpoint, dest: FiAddr, reply: Bytes) -> Result<(), String> {
    match tokio::time::timeout(REPLY_DEADLINE, ep.tsend(dest, reply, REPLY_TAG)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.err.to_string()),
        Err(_) => Err(format!(
            "not delivered within {} s",
            REPLY_DEADLINE.as_secs()
        )),
    }
}

/// The pause before the next receive after `failures` failed in a row:
/// none for the first few (one bad peer), then doubling, so an error that
/// persists costs no CPU.
fn recv_backoff(failures: u32) -> Option<Duration> {
    let past = failures.checked_sub(RECV_FAILURES_BEFORE_BACKOFF + 1)?;
    let pause = FIRST_RECV_BACKOFF.saturating_mul(1 << past.min(16));
    Some(pause.min(MAX_RECV_BACKOFF))
}

/// A client's address must be a socket address of the family of our own
/// (with a host and a port) to be worth inserting: anything else is a
/// lie, or would send the reply nowhere. A provider whose addresses are
/// not socket addresses gets a length check only.
fn check_reply_addr(theirs: &[u8], ours: &[u8]) -> Result<(), String> {
    let Ok(own) = weft::decode_sockaddr(ours) else {
        if theirs.len() == ours.len() {
            return Ok(());
        }
        return Err(format!(
            "a {}-byte address, not {} as ours",
            theirs.len(),
            ours.len()
        ));
    };
    let a = weft::decode_sockaddr(theirs)
        .map_err(|_| format!("{} bytes that are not a socket address", theirs.len()))?;
    if a.is_ipv4() != own.is_ipv4() {
        return Err(format!("address {a} is not of our family ({own})"));
    }
    let ip = a.ip();
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_multicast() || broadcast || a.port() == 0 {
        return Err(format!("address {a} names no endpoint"));
    }
    Ok(())
}

/// Counts one kind of event and says when to report it: each of the first
/// [`REPORT_EACH`], then at powers of two.
#[derive(Debug, Default)]
struct Tally(u64);

impl Tally {
    /// The count so far, when this one is to be reported.
    fn note(&mut self) -> Option<u64> {
        self.0 = self.0.saturating_add(1);
        (self.0 <= REPORT_EACH || self.0.is_power_of_two()).then_some(self.0)
    }
}

/// A map of at most `cap` entries that, when full, makes room by
/// dropping the entry used least recently.
#[derive(Debug)]
struct Lru<V> {
    cap: usize,
    /// Increases with every use: an entry's last one orders it.
    clock: u64,
    entries: HashMap<u64, (V, u64)>,
    by_use: BTreeMap<u64, u64>,
}

impl<V: Copy> Lru<V> {
    fn new(cap: usize) -> Lru<V> {
        Lru {
            cap: cap.max(1),
            clock: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The value of `key`, which is now the most recently used.
    fn get(&mut self, key: u64) -> Option<V> {
        let now = self.tick();
        let (v, used) = self.entries.get_mut(&key)?;
        self.by_use.remove(used);
        *used = now;
        self.by_use.insert(now, key);
        Some(*v)
    }

    /// Inserts `key`, most recently used. Returns what it displaced: the
    /// old value of `key`, or the least recent entry if the map was full.
    fn insert(&mut self, key: u64, v: V) -> Option<(u64, V)> {
        let now = self.tick();
        let out = match self.entries.remove(&key) {
            Some((old, used)) => {
                self.by_use.remove(&used);
                Some((key, old))
            }
            None if self.entries.len() >= self.cap => self.pop_oldest(),
            None => None,
        };
        self.entries.insert(key, (v, now));
        self.by_use.insert(now, key);
        out
    }

    fn pop_oldest(&mut self) -> Option<(u64, V)> {
        let (_, key) = self.by_use.pop_first()?;
        self.entries.remove(&key).map(|(v, _)| (key, v))
    }
}

/// A finished reply.
#[derive(Debug)]
struct Done {
    client: u64,
    seq: u64,
    outcome: Result<(), String>,
}

/// Replies on their way, each a task of its own, bounded in number
/// overall and per client.
#[derive(Debug, Default)]
struct Replies {
    tasks: JoinSet<Result<(), String>>,
    /// Whose reply each task carries.
    owner: HashMap<Id, (u64, u64)>,
    per_client: HashMap<u64, usize>,
}

impl Replies {
    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Whether one more reply to `client` may go out now.
    fn room(&self, client: u64) -> Result<(), String> {
        if self.tasks.len() >= MAX_REPLIES_IN_FLIGHT {
            return Err(format!(
                "{MAX_REPLIES_IN_FLIGHT} replies already on their way"
            ));
        }
        if self.per_client.get(&client).copied().unwrap_or(0) >= MAX_REPLIES_PER_CLIENT {
            return Err(format!(
                "{MAX_REPLIES_PER_CLIENT} replies to it already on their way"
            ));
        }
        Ok(())
    }

    fn spawn(
        &mut self,
        client: u64,
        seq: u64,
        reply: impl Future<Output = Result<(), String>> + Send + 'static,
    ) {
        let id = self.tasks.spawn(reply).id();
        self.owner.insert(id, (client, seq));
        *self.per_client.entry(client).or_insert(0) += 1;
    }

    /// The next reply to finish; `None` when none is on its way.
    async fn next(&mut self) -> Option<Done> {
        let joined = self.tasks.join_next_with_id().await?;
        Some(self.finished(joined))
    }

    fn finished(&mut self, joined: Result<(Id, Result<(), String>), JoinError>) -> Done {
        let (id, outcome) = match joined {
            Ok((id, r)) => (id, r),
            Err(e) => (e.id(), Err(format!("reply task failed: {e}"))),
        };
        let (client, seq) = self.owner.remove(&id).unwrap_or_default();
        if let Some(n) = self.per_client.get_mut(&client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(&client);
            }
        }
        Done {
            client,
            seq,
            outcome,
        }
    }
}

// -------------------------------------------------------------- client

/// Why one request did not get its reply.
#[derive(Debug)]
enum Failed {
    /// The request could not be sent (the server may not be up yet).
    Send(String),
    /// The receive of the reply failed.
    Recv(String),
    /// Nothing within the time limit.
    Timeout { sent: bool },
}

/// Sends `req` and waits for one reply. The reply's receive is posted
/// before the request goes out (it is polled first), so the reply never
/// has to wait as an unexpected message.
async fn round_trip(
    ep: &Endpoint,
    server: FiAddr,
    req: Bytes,
    limit: Duration,
) -> Result<CqEntry, Failed> {
    let recv = ep.trecv(
        BytesMut::zeroed(HEADER_ROOM + MAX_PAYLOAD),
        FI_ADDR_UNSPEC,
        REPLY_TAG,
        0,
    );
    let send = ep.tsend(server, req, REQUEST_TAG);
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(recv, send, deadline);
    let mut reply = None;
    let mut sent = false;
    while reply.is_none() || !sent {
        tokio::select! {
            biased;
            r = &mut recv, if reply.is_none() => match r {
                Ok(e) => reply = Some(e),
                Err(e) => return Err(Failed::Recv(e.err.to_string())),
            },
            s = &mut send, if !sent => match s {
                Ok(_) => sent = true,
                // Returning drops the receive, which withdraws it.
                Err(e) => return Err(Failed::Send(e.err.to_string())),
            },
            () = &mut deadline => return Err(Failed::Timeout { sent }),
        }
    }
    reply.ok_or(Failed::Timeout { sent })
}

/// Checks a reply against the request it answers.
fn check_reply(e: CqEntry, seq: u64, payload: &[u8]) -> Result<(), String> {
    if e.tag != REPLY_TAG {
        return Err(format!("reply has tag {:#x}, not {REPLY_TAG:#x}", e.tag));
    }
    let mut b = received(e);
    let want = 4 + 8 + payload.len();
    if b.len() != want {
        return Err(format!("reply is {} bytes, expected {want}", b.len()));
    }
    if take(&mut b, 4, "magic")?[..] != REPLY_MAGIC[..] {
        return Err("reply has a bad magic".into());
    }
    let got_seq = be_u64(&take(&mut b, 8, "sequence number")?);
    if got_seq != seq {
        return Err(format!("reply is for request {got_seq}"));
    }
    if let Some(i) = b
        .iter()
        .zip(payload)
        .position(|(&got, &sent)| got != sent ^ REPLY_XOR)
    {
        return Err(format!("reply payload differs at byte {i}"));
    }
    Ok(())
}

/// A per-process id the server tells clients apart by.
fn client_id() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

async fn client(o: &Opts) -> Res<()> {
    let server_sa = o.server.ok_or("--server is required")?;
    let info = find_info(o)?;
    let src = match &o.addr {
        Some(a) => parse_bind(a, 0)?,
        None => SocketAddr::new(
            info_ip(&info)
                .or_else(|| routed_ip(server_sa))
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            0,
        ),
    };
    let side = open_side(info, src)?;
    let me = side.ep.local_addr()?;
    let server = side.insert(&weft::encode_sockaddr(&server_sa))?;
    let id = client_id();
    let count = o.count.unwrap_or(10);
    println!(
        "client {id:016x}: {} -> {server_sa} ({}), {count} requests of {} bytes",
        side.local_str()?,
        side.describe(),
        o.size
    );

    let started = Instant::now();
    let patience = started + o.wait;
    let mut verified = 0u64;
    let mut seq = 0u64;
    let mut retrying = false;
    while seq < count {
        let payload = pattern(id, seq, o.size);
        // The first request introduces us; the server answers nothing else
        // before it has seen it.
        let addr: &[u8] = if verified == 0 { &me } else { &[] };
        let req = encode_request(seq, id, addr, &payload)?;
        let fail = |why: String| -> Box<dyn Error> {
            format!("request {seq}: {why} ({verified} of {count} replies verified)").into()
        };
        match round_trip(&side.ep, server, req, o.timeout).await {
            Ok(reply) => {
                check_reply(reply, seq, &payload).map_err(fail)?;
                verified += 1;
                seq += 1;
            }
            // The server may not be listening yet: retry the introduction.
            Err(Failed::Send(e)) if verified == 0 && Instant::now() < patience => {
                if !retrying {
                    eprintln!(
                        "client: server not reachable yet ({e}); retrying for up to {}s",
                        o.wait.as_secs()
                    );
                    retrying = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(Failed::Send(e)) => return Err(fail(format!("send failed: {e}"))),
            Err(Failed::Recv(e)) => return Err(fail(format!("receive failed: {e}"))),
            Err(Failed::Timeout { sent }) => {
                let what = if sent {
                    "no reply"
                } else {
                    "the send did not complete"
                };
                return Err(fail(format!("{what} within {}s", o.timeout.as_secs())));
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "client: {verified} of {count} replies verified in {secs:.3}s ({:.1} us per request)",
        secs * 1e6 / count as f64
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&argv) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("tagged_service: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match opts.role {
        Role::Server => server(&opts).await,
        Role::Client => client(&opts).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let role = match opts.role {
                Role::Server => "server",
                Role::Client => "client",
            };
            eprintln!("tagged_service {role}: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// These run with weft-cli's tests (`crates/weft-cli/tests/tagged_service.rs`
/// includes this file): the `weft` package builds its examples without
/// their tests.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_client_goes_first() {
        let mut t: Lru<u32> = Lru::new(2);
        assert_eq!(t.insert(1, 10), None);
        assert_eq!(t.insert(2, 20), None);
        // Hearing from 1 again makes 2 the least recent.
        assert_eq!(t.get(1), Some(10));
        assert_eq!(t.insert(3, 30), Some((2, 20)));
        assert_eq!((t.get(2), t.get(1), t.get(3)), (None, Some(10), Some(30)));
        assert_eq!(t.insert(4, 40), Some((1, 10)));
        assert_eq!(t.len(), 2);
        // A known key takes its new value and hands back the old one.
        assert_eq!(t.insert(4, 41), Some((4, 40)));
        assert_eq!((t.len(), t.get(4)), (2, Some(41)));
        assert_eq!(t.entries.len(), t.by_use.len());
    }

    #[test]
    fn the_client_table_stays_bounded() {
        let mut t: Lru<u64> = Lru::new(MAX_CLIENTS);
        let mut evicted = 0;
        for k in 0..(3 * MAX_CLIENTS as u64) {
            evicted += usize::from(t.insert(k, k).is_some());
        }
        assert_eq!((t.len(), t.by_use.len()), (MAX_CLIENTS, MAX_CLIENTS));
        assert_eq!(evicted, 2 * MAX_CLIENTS);
        assert_eq!(t.get(0), None);
        let last = 3 * MAX_CLIENTS as u64 - 1;
        assert_eq!(t.get(last), Some(last));
    }

    fn sa(s: &str) -> Vec<u8> {
        weft::encode_sockaddr(&s.parse().unwrap())
    }

    #[test]
    fn reply_addresses_are_validated() {
        let ours = sa("127.0.0.1:47610");
        assert_eq!(check_reply_addr(&sa("127.0.0.1:5000"), &ours), Ok(()));
        assert_eq!(check_reply_addr(&sa("10.1.2.3:1"), &ours), Ok(()));
        assert_eq!(
            check_reply_addr(b"garbage", &ours),
            Err("7 bytes that are not a socket address".into())
        );
        assert_eq!(
            check_reply_addr(&sa("[::1]:5000"), &ours),
            Err("address [::1]:5000 is not of our family (127.0.0.1:47610)".into())
        );
        for bad in [
            "0.0.0.0:5000",
            "127.0.0.1:0",
            "224.0.0.1:5000",
            "255.255.255.255:5000",
        ] {
            assert_eq!(
                check_reply_addr(&sa(bad), &ours),
                Err(format!("address {bad} names no endpoint"))
            );
        }
        // A sockaddr_in with a sockaddr_in6's length is neither.
        let mut long = sa("127.0.0.1:5000");
        long.resize(28, 0);
        assert!(check_reply_addr(&long, &ours).is_err());
        // v6 servers take v6 clients only.
        let ours6 = sa("[::1]:47610");
        assert_eq!(check_reply_addr(&sa("[::1]:5000"), &ours6), Ok(()));
        assert!(check_reply_addr(&sa("127.0.0.1:5000"), &ours6).is_err());
        // Addresses of another format: the length must be ours.
        assert_eq!(check_reply_addr(b"abcd", b"wxyz"), Ok(()));
        assert!(check_reply_addr(b"abc", b"wxyz").is_err());
    }

    #[test]
    fn failed_receives_back_off_up_to_half_a_second() {
        assert_eq!(recv_backoff(0), None);
        assert_eq!(recv_backoff(RECV_FAILURES_BEFORE_BACKOFF), None);
        let first = RECV_FAILURES_BEFORE_BACKOFF + 1;
        assert_eq!(recv_backoff(first), Some(Duration::from_millis(10)));
        assert_eq!(recv_backoff(first + 1), Some(Duration::from_millis(20)));
        assert_eq!(recv_backoff(first + 5), Some(Duration::from_millis(320)));
        assert_eq!(recv_backoff(first + 6), Some(MAX_RECV_BACKOFF));
        assert_eq!(recv_backoff(u32::MAX), Some(MAX_RECV_BACKOFF));
    }

    #[test]
    fn trouble_is_reported_sparingly() {
        let mut t = Tally::default();
        let reported: Vec<u64> = (0..1000).filter_map(|_| t.note()).collect();
        let mut want: Vec<u64> = (1..=16).collect();
        want.extend([32, 64, 128, 256, 512]);
        assert_eq!(reported, want);
    }

    #[tokio::test]
    async fn replies_in_flight_are_bounded() {
        let mut r = Replies::default();
        let stuck = || std::future::pending::<Result<(), String>>();
        for seq in 0..MAX_REPLIES_PER_CLIENT as u64 {
            assert_eq!(r.room(7), Ok(()));
            r.spawn(7, seq, stuck());
        }
        assert_eq!(
            r.room(7),
            Err(format!(
                "{MAX_REPLIES_PER_CLIENT} replies to it already on their way"
            ))
        );
        // Others still get through, up to the overall bound.
        let mut client = 100;
        while r.room(client).is_ok() {
            r.spawn(client, 0, stuck());
            client += 1;
        }
        assert_eq!(r.tasks.len(), MAX_REPLIES_IN_FLIGHT);
        assert_eq!(
            r.room(client),
            Err(format!(
                "{MAX_REPLIES_IN_FLIGHT} replies already on their way"
            ))
        );
        r.tasks.abort_all();
        let mut failed = 0;
        while let Some(d) = r.next().await {
            assert!(d.outcome.is_err());
            failed += 1;
        }
        assert_eq!(failed, MAX_REPLIES_IN_FLIGHT);
        assert!(r.per_client.is_empty() && r.owner.is_empty());
        r.spawn(7, 99, async { Ok(()) });
        let d = r.next().await.unwrap();
        assert_eq!((d.client, d.seq, d.outcome), (7, 99, Ok(())));
        assert_eq!(r.room(7), Ok(()));
    }

    fn opts(args: &str) -> Opts {
        let argv: Vec<String> = args.split_whitespace().map(String::from).collect();
        parse_args(&argv).unwrap().unwrap()
    }

    /// A server on loopback, on a port of the kernel's choosing.
    fn loopback_side() -> Side {
        let o = opts("server --addr 127.0.0.1:0");
        open_side(find_info(&o).unwrap(), "127.0.0.1:0".parse().unwrap()).unwrap()
    }

    fn addr_of(side: &Side) -> SocketAddr {
        weft::decode_sockaddr(&side.ep.local_addr().unwrap()).unwrap()
    }

    /// Starts `serve` on a loopback side; returns its address.
    fn start_server() -> (SocketAddr, tokio::task::JoinHandle<Result<(), String>>) {
        let side = loopback_side();
        let addr = addr_of(&side);
        let task = tokio::spawn(async move { serve(&side, None).await.map_err(|e| e.to_string()) });
        (addr, task)
    }

    fn request(seq: u64, client: u64, addr: &[u8], payload: &[u8]) -> Bytes {
        encode_request(seq, client, addr, payload).unwrap()
    }

    /// A client whose address accepts connections and never answers (a
    /// tarpit) floods the server; a real client is still answered at once,
    /// not after the tarpit's replies run out of time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tarpit_client_does_not_stall_others() {
        let tarpit = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pit = tarpit.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = tarpit.accept().await {
                held.push(s);
            }
        });
        let (server, task) = start_server();
        let liar = loopback_side();
        let to = liar.insert(&weft::encode_sockaddr(&server)).unwrap();
        for seq in 0..40 {
            let addr = if seq == 0 {
                weft::encode_sockaddr(&pit)
            } else {
                Vec::new()
            };
            let req = request(seq, 0xbad, &addr, b"x");
            liar.ep.tsend(to, req, REQUEST_TAG).await.unwrap();
        }
        let t = Instant::now();
        let o = opts(&format!("client --server {server} -n 5 --timeout 3"));
        client(&o).await.unwrap();
        assert!(t.elapsed() < REPLY_DEADLINE, "took {:?}", t.elapsed());
        assert!(!task.is_finished());
        task.abort();
        hold.abort();
    }

    /// More failed receives in a row than the server used to tolerate
    /// (messages too large for its buffer), and messages that are no
    /// requests: the server logs them and goes on serving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_receives_do_not_end_the_server() {
        let (server, task) = start_server();
        let peer = loopback_side();
        let to = peer.insert(&weft::encode_sockaddr(&server)).unwrap();
        let huge = Bytes::from(vec![0u8; HEADER_ROOM + MAX_PAYLOAD + 1]);
        for _ in 0..25 {
            let _ = peer.ep.tsend(to, huge.clone(), REQUEST_TAG).await;
        }
        for junk in [&b"WTSQ"[..], b"nonsense", b""] {
            peer.ep
                .tsend(to, Bytes::from_static(junk), REQUEST_TAG)
                .await
                .unwrap();
        }
        // An unknown client without an address, and one with a bad address.
        peer.ep
            .tsend(to, request(0, 1, &[], b"x"), REQUEST_TAG)
            .await
            .unwrap();
        peer.ep
            .tsend(to, request(0, 2, b"bogus", b"x"), REQUEST_TAG)
            .await
            .unwrap();
        let t = Instant::now();
        let o = opts(&format!("client --server {server} -n 3 --timeout 5"));
        client(&o).await.unwrap();
        // No pause for failures that were the peer's doing.
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
        assert!(!task.is_finished());
        task.abort();
    }

    /// A client pushed out of a full table loses its AV entry too.
    #[tokio::test]
    async fn evicted_clients_leave_the_av() {
        let side = loopback_side();
        let mut svc = Service::new(&side, 2).unwrap();
        for (client, port) in [(1, 5001), (2, 5002), (3, 5003)] {
            let addr = sa(&format!("127.0.0.1:{port}"));
            let req = Request {
                seq: 0,
                client,
                addr,
                payload: Bytes::new(),
            };
            assert!(svc.admit(&req).is_some());
        }
        assert_eq!((svc.clients.len(), side.av.len()), (2, 2));
        assert_eq!(svc.clients.get(1), None);
        // A lie about the address admits nobody.
        let bad = Request {
            seq: 0,
            client: 4,
            addr: b"bogus".to_vec(),
            payload: Bytes::new(),
        };
        assert_eq!(svc.admit(&bad), None);
        assert_eq!((svc.clients.len(), side.av.len()), (2, 2));
        assert_eq!(svc.trouble.bad_addr.0, 1);
    }
}
