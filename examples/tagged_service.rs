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
//! Over loopback:
//!
//! ```text
//! cargo run --example tagged_service -- server --addr 127.0.0.1:47610 &
//! cargo run --example tagged_service -- client --server 127.0.0.1:47610 -n 100
//! ```

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::error::Error;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, CqAttr, CqEntry, Domain, Endpoint, EpType,
    Fabric, FiAddr, Info, FI_ADDR_UNSPEC,
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
/// The server gives up after this many failed receives in a row.
const MAX_RECV_ERRORS: u32 = 10;

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
                weft::PROVIDERS.join(", ")
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

async fn server(o: &Opts) -> Res<()> {
    let info = find_info(o)?;
    let src = match &o.addr {
        Some(a) => parse_bind(a, DEFAULT_PORT)?,
        None => SocketAddr::new(
            info_ip(&info).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            DEFAULT_PORT,
        ),
    };
    let side = open_side(info, src)?;
    println!(
        "server: listening on {} ({})",
        side.local_str()?,
        side.describe()
    );

    let cap = HEADER_ROOM + MAX_PAYLOAD;
    let mut clients: HashMap<u64, FiAddr> = HashMap::new();
    let mut served: u64 = 0;
    let mut recv_errors = 0;
    while !o.count.is_some_and(|n| served >= n) {
        let got = side
            .ep
            .trecv(BytesMut::zeroed(cap), FI_ADDR_UNSPEC, REQUEST_TAG, 0)
            .await;
        let entry = match got {
            Ok(e) => {
                recv_errors = 0;
                e
            }
            Err(e) => {
                recv_errors += 1;
                eprintln!("server: receive failed: {}", e.err);
                if recv_errors >= MAX_RECV_ERRORS {
                    return Err(
                        format!("{recv_errors} receives failed in a row; last: {}", e.err).into(),
                    );
                }
                continue;
            }
        };
        let req = match decode_request(received(entry)) {
            Ok(r) => r,
            Err(why) => {
                eprintln!("server: dropped a message: {why}");
                continue;
            }
        };
        let dest = match clients.get(&req.client) {
            Some(&fi) => fi,
            None if req.addr.is_empty() => {
                eprintln!(
                    "server: request {} from unknown client {:016x} without its address: dropped",
                    req.seq, req.client
                );
                continue;
            }
            None => match side.insert(&req.addr) {
                Ok(fi) => {
                    println!(
                        "server: client {:016x} at {}",
                        req.client,
                        side.av.straddr(&req.addr)
                    );
                    clients.insert(req.client, fi);
                    fi
                }
                Err(e) => {
                    eprintln!("server: client {:016x}: {e}", req.client);
                    continue;
                }
            },
        };
        let reply = encode_reply(req.seq, &req.payload);
        if let Err(e) = side.ep.tsend(dest, reply, REPLY_TAG).await {
            eprintln!(
                "server: reply {} to client {:016x} failed: {e}",
                req.seq, req.client
            );
            continue;
        }
        served += 1;
    }
    println!(
        "server: served {served} requests from {} client(s)",
        clients.len()
    );
    Ok(())
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
