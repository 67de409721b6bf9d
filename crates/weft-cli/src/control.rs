//! Setting a cross-process run up. RDM and DGRAM first swap endpoint
//! addresses over a plain TCP control port; MSG connects through the
//! provider's passive endpoint. Either port is open to anyone who can
//! reach it, so every step is bounded by `--timeout`, and a peer that does
//! not complete its step in time, or sends something no weft peer would,
//! is dropped with a line on stderr while the server waits for the next.
//! The server reads every pending control connection at once: one that
//! says nothing delays nobody else.
//!
//! On the control port each side sends its raw endpoint address prefixed
//! by its length, a big-endian u32. The client writes first; the server
//! answers only once the client's address has arrived and looks like one,
//! so a stranger costs it no endpoint.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use weft::{EpType, EventQueue, PassiveEndpoint};

use crate::args::{PerfArgs, DEFAULT_PORT};
use crate::fail::{timed_out, within, Context, Failure, Res};
use crate::link::{self, Fab, Link, CONNECT_PATIENCE};

/// The longest endpoint address taken from a peer; Weft's are socket
/// addresses, 28 bytes at most.
const MAX_ADDR: usize = 1024;

/// Control connections read at once. More wait in the kernel's backlog,
/// so a flood of them costs a bounded number of descriptors.
const MAX_GREETINGS: usize = 64;

/// The pause after a failed accept (out of descriptors, say), so that an
/// error that persists does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// A control connection whose peer has named its endpoint.
#[derive(Debug)]
struct Hello {
    s: TcpStream,
    from: SocketAddr,
    /// Our address on the connection: the client reached it, so the
    /// endpoint bound to it is routable from there.
    local: IpAddr,
    peer: Vec<u8>,
}

type Greeting = Pin<Box<dyn Future<Output = (SocketAddr, Result<Hello, String>)> + Send>>;

/// A client set up; the inner error says why a would-be client was
/// dropped, the outer one is this side's own failure.
type Attempt = Res<Result<Link, String>>;

/// The server's listening side, kept across would-be clients that turn
/// out not to be.
#[derive(Debug)]
pub struct Listener {
    /// `weft pingpong`: what the lines about dropped peers start with.
    who: String,
    limit: Duration,
    how: Listening,
}

#[derive(Debug)]
enum Listening {
    Control {
        l: TcpListener,
        greetings: FuturesUnordered<Greeting>,
    },
    Passive {
        pep: Arc<PassiveEndpoint>,
        eq: EventQueue,
    },
}

impl Listener {
    /// Listens on `-B`: a TCP control port for RDM and DGRAM, a passive
    /// endpoint for MSG.
    pub async fn bind(fab: &Fab, a: &PerfArgs, who: String) -> Res<Listener> {
        let port = a.src_port.unwrap_or(DEFAULT_PORT);
        let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let (how, bound) = if fab.info.ep_attr.ep_type == EpType::Msg {
            let (pep, eq) = fab.listen(any)?;
            let bound = pep
                .local_addr()
                .ok()
                .and_then(|b| weft::decode_sockaddr(&b).ok());
            let pep = Arc::new(pep);
            (Listening::Passive { pep, eq }, bound)
        } else {
            let l = TcpListener::bind(any)
                .await
                .with_ctx(|| format!("listen on {any}"))?;
            let bound = l.local_addr().ok();
            let greetings = FuturesUnordered::new();
            (Listening::Control { l, greetings }, bound)
        };
        // -B 0 lets the kernel choose: the client has to be told.
        if port == 0 {
            let b = bound.ok_or_else(|| Failure::new("-B 0", "cannot tell the port chosen"))?;
            eprintln!("{who}: listening on port {}", b.port());
        }
        Ok(Listener {
            who,
            limit: a.ctrl_timeout,
            how,
        })
    }

    /// The next client whose link is up. Would-be clients that fail on
    /// the way are reported and skipped.
    pub async fn next(&mut self, fab: &Fab) -> Res<Link> {
        loop {
            let attempt = match &mut self.how {
                Listening::Control { l, greetings } => {
                    let h = next_hello(l, greetings, self.limit, &self.who).await;
                    welcome(fab, h, self.limit).await
                }
                Listening::Passive { pep, eq } => msg_client(fab, pep, eq, self.limit).await,
            };
            match attempt? {
                Ok(link) => return Ok(link),
                Err(why) => eprintln!("{}: {why}; waiting for another client", self.who),
            }
        }
    }
}

/// Accepts control connections and reads them all at once until one has
/// sent a well-formed endpoint address.
async fn next_hello(
    l: &TcpListener,
    greetings: &mut FuturesUnordered<Greeting>,
    limit: Duration,
    who: &str,
) -> Hello {
    loop {
        tokio::select! {
            r = l.accept(), if greetings.len() < MAX_GREETINGS => match r {
                Ok((s, from)) => greetings.push(Box::pin(async move { (from, greet(s, limit).await) })),
                Err(e) => {
                    eprintln!("{who}: accept control connection: {e}");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            },
            Some((from, r)) = greetings.next(), if !greetings.is_empty() => match r {
                Ok(h) => return h,
                Err(why) => eprintln!("{who}: dropped control connection from {from}: {why}"),
            },
        }
    }
}

/// Reads one control connection's endpoint address, for at most `limit`.
async fn greet(mut s: TcpStream, limit: Duration) -> Result<Hello, String> {
    let from = s.peer_addr().map_err(|e| e.to_string())?;
    let local = link::unmap(s.local_addr().map_err(|e| e.to_string())?.ip());
    let peer = bounded(limit, read_addr(&mut s)).await?;
    check_peer_addr(&peer, local)?;
    Ok(Hello {
        s,
        from,
        local,
        peer,
    })
}

/// Answers a client that named its endpoint with ours, and puts its
/// address in the AV.
async fn welcome(fab: &Fab, h: Hello, limit: Duration) -> Attempt {
    let Hello {
        mut s,
        from,
        local,
        peer,
    } = h;
    let (ep, cq, av) = fab.connless(SocketAddr::new(local, 0))?;
    let mine = ep.local_addr().ctx("endpoint address")?;
    let dropped = |why: String| {
        Ok(Err(format!(
            "dropped control connection from {from}: {why}"
        )))
    };
    if let Err(why) = bounded(limit, send_addr(&mut s, &mine)).await {
        return dropped(why);
    }
    let insert = link::connless_link(fab, (ep, cq, av), &peer, Some(s));
    match within(limit, "insert its endpoint address", insert).await {
        Ok(link) => Ok(Ok(link)),
        Err(f) => dropped(f.to_string()),
    }
}

/// MSG: the next connection request, accepted.
async fn msg_client(
    fab: &Fab,
    pep: &Arc<PassiveEndpoint>,
    eq: &mut EventQueue,
    limit: Duration,
) -> Attempt {
    let req = match link::conn_req(eq).await? {
        Ok(r) => r,
        Err(why) => return Ok(Err(why)),
    };
    let link = fab.accept_req(&req, pep.clone(), limit).await;
    Ok(link.map_err(|f| format!("dropped a connection: {f}")))
}

/// The client of `dest`, on `-P`.
pub async fn dial(fab: &Fab, a: &PerfArgs, dest: &str) -> Res<Link> {
    let limit = a.ctrl_timeout;
    let port = a.dst_port.unwrap_or(DEFAULT_PORT);
    let addr = within(limit, &format!("resolve {dest}"), link::resolve(dest, port)).await?;
    if fab.info.ep_attr.ep_type == EpType::Msg {
        return fab.connect(addr, limit).await;
    }
    let mut s = control_connect(addr, a.src_port, limit).await?;
    let local = link::unmap(s.local_addr().ctx("control connection address")?.ip());
    let (ep, cq, av) = fab.connless(SocketAddr::new(local, 0))?;
    let mine = ep.local_addr().ctx("endpoint address")?;
    let peer = bounded(limit, swap(&mut s, &mine, local))
        .await
        .map_err(|why| Failure::new(format!("exchange endpoint addresses with {addr}"), why))?;
    let insert = link::connless_link(fab, (ep, cq, av), &peer, Some(s));
    within(limit, "insert peer address", insert).await
}

/// The client's half of the exchange: our address, then the server's.
async fn swap<S>(s: &mut S, mine: &[u8], local: IpAddr) -> Result<Vec<u8>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    send_addr(s, mine).await?;
    let peer = read_addr(s).await?;
    check_peer_addr(&peer, local)?;
    Ok(peer)
}

/// Connects to the server's control port, retrying while it refuses
/// (not up yet) for [`CONNECT_PATIENCE`]; each attempt may take `limit`.
async fn control_connect(
    addr: SocketAddr,
    src_port: Option<u16>,
    limit: Duration,
) -> Res<TcpStream> {
    let what = || format!("connect to {addr}");
    let deadline = Instant::now() + CONNECT_PATIENCE;
    loop {
        let sock = control_socket(addr, src_port)?;
        let outcome = match tokio::time::timeout(limit, sock.connect(addr)).await {
            Ok(r) => r,
            Err(_) => return Err(timed_out(&what(), limit)),
        };
        match outcome {
            Ok(s) => return Ok(s),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(Failure::new(what(), e)),
        }
    }
}

/// A socket to reach `addr` from, bound to `src_port` if given.
fn control_socket(addr: SocketAddr, src_port: Option<u16>) -> Res<TcpSocket> {
    let what = || format!("connect to {addr}");
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .with_ctx(what)?;
    if let Some(p) = src_port {
        let unspec: IpAddr = if addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        sock.set_reuseaddr(true).with_ctx(what)?;
        sock.bind(SocketAddr::new(unspec, p))
            .with_ctx(|| format!("bind source port {p}"))?;
    }
    Ok(sock)
}

/// `fut`, or after `limit` the reason why not.
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no endpoint address within {} s (--timeout): not a weft peer, or it is gone",
            limit.as_secs_f64()
        )),
    }
}

async fn send_addr<S: AsyncWrite + Unpin>(s: &mut S, mine: &[u8]) -> Result<(), String> {
    let len = u32::try_from(mine.len()).map_err(|e| e.to_string())?;
    let mut msg = len.to_be_bytes().to_vec();
    msg.extend_from_slice(mine);
    s.write_all(&msg).await.map_err(|e| e.to_string())
}

async fn read_addr<S: AsyncRead + Unpin>(s: &mut S) -> Result<Vec<u8>, String> {
    let mut lb = [0u8; 4];
    read_full(s, &mut lb, "length").await?;
    let n = u32::from_be_bytes(lb) as usize;
    if n == 0 || n > MAX_ADDR {
        return Err(format!(
            "announced a {n}-byte endpoint address (1 to {MAX_ADDR}): not a weft peer"
        ));
    }
    let mut peer = vec![0u8; n];
    read_full(s, &mut peer, "endpoint address").await?;
    Ok(peer)
}

async fn read_full<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut [u8],
    what: &str,
) -> Result<(), String> {
    match s.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(format!(
            "closed the connection before its {what} ({} bytes) was whole",
            buf.len()
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// A peer's endpoint address must be a socket address (what the socket
/// and verbs providers use) of the family the control connection runs
/// over, with a host and a port, or an shm name (`fi_shm://<name>`):
/// anything else is not a weft peer, or would have this side send to
/// nowhere.
fn check_peer_addr(raw: &[u8], local: IpAddr) -> Result<(), String> {
    if let Some(name) = raw.strip_prefix(b"fi_shm://") {
        // A named endpoint of this host (shm); the insert checks the
        // name again.
        let ok = (1..=48).contains(&name.len())
            && name
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(c));
        return if ok {
            Ok(())
        } else {
            Err(format!(
                "sent {} bytes that are not an shm address",
                raw.len()
            ))
        };
    }
    let a = weft::decode_sockaddr(raw)
        .map_err(|_| format!("sent {} bytes that are not a socket address", raw.len()))?;
    if a.is_ipv4() != local.is_ipv4() {
        return Err(format!(
            "sent {a}, not of this connection's family ({local})"
        ));
    }
    let ip = a.ip();
    if ip.is_unspecified() || ip.is_multicast() || a.port() == 0 {
        return Err(format!("sent {a}, which no endpoint can have"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const SHORT: Duration = Duration::from_millis(200);

    fn framed(addr: &[u8]) -> Vec<u8> {
        let mut v = (addr.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(addr);
        v
    }

    fn sockaddr(s: &str) -> Vec<u8> {
        weft::encode_sockaddr(&s.parse().unwrap())
    }

    /// What the server makes of a control connection that sends `bytes`
    /// and then holds the connection open.
    async fn server_reads(bytes: &[u8]) -> Result<Vec<u8>, String> {
        let (mut peer, mut ours) = tokio::io::duplex(4096);
        peer.write_all(bytes).await.unwrap();
        let r = bounded(SHORT, read_addr(&mut ours)).await;
        drop(peer);
        r.and_then(|a| check_peer_addr(&a, LO).map(|_| a))
    }

    #[tokio::test]
    async fn a_well_formed_address_is_taken() {
        let a = sockaddr("127.0.0.1:4000");
        assert_eq!(server_reads(&framed(&a)).await, Ok(a));
    }

    #[tokio::test]
    async fn an_shm_name_is_taken_and_a_bad_one_refused() {
        let a = b"fi_shm://123-0".to_vec();
        assert_eq!(server_reads(&framed(&a)).await, Ok(a));
        let e = server_reads(&framed(b"fi_shm://../x")).await.unwrap_err();
        assert!(e.contains("not an shm address"), "{e}");
    }

    #[tokio::test]
    async fn silence_times_out() {
        let e = server_reads(b"").await.unwrap_err();
        assert!(e.starts_with("no endpoint address within 0.2 s"), "{e}");
    }

    #[tokio::test]
    async fn a_truncated_address_times_out() {
        let a = sockaddr("127.0.0.1:4000");
        let e = server_reads(&framed(&a)[..10]).await.unwrap_err();
        assert!(e.starts_with("no endpoint address within"), "{e}");
    }

    #[tokio::test]
    async fn a_closed_connection_says_so() {
        let (peer, mut ours) = tokio::io::duplex(64);
        drop(peer);
        let e = read_addr(&mut ours).await.unwrap_err();
        assert_eq!(
            e,
            "closed the connection before its length (4 bytes) was whole"
        );
    }

    #[tokio::test]
    async fn oversized_and_empty_lengths_are_refused() {
        let e = server_reads(b"GET / HTTP/1.1\r\n").await.unwrap_err();
        assert_eq!(
            e,
            "announced a 1195725856-byte endpoint address (1 to 1024): not a weft peer"
        );
        let e = server_reads(&[0, 0, 0, 0]).await.unwrap_err();
        assert!(e.starts_with("announced a 0-byte"), "{e}");
    }

    #[tokio::test]
    async fn garbage_addresses_are_refused() {
        let e = server_reads(&framed(b"garbage")).await.unwrap_err();
        assert_eq!(e, "sent 7 bytes that are not a socket address");
        let e = server_reads(&framed(&sockaddr("[::1]:4000")))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "sent [::1]:4000, not of this connection's family (127.0.0.1)"
        );
        for bad in ["0.0.0.0:4000", "127.0.0.1:0", "224.0.0.1:4000"] {
            let e = server_reads(&framed(&sockaddr(bad))).await.unwrap_err();
            assert_eq!(e, format!("sent {bad}, which no endpoint can have"));
        }
    }

    #[tokio::test]
    async fn the_client_half_swaps_addresses() {
        let (mut server, mut client) = tokio::io::duplex(4096);
        let mine = sockaddr("127.0.0.1:5000");
        let theirs = sockaddr("127.0.0.1:6000");
        server.write_all(&framed(&theirs)).await.unwrap();
        assert_eq!(swap(&mut client, &mine, LO).await, Ok(theirs));
        let mut got = vec![0u8; framed(&mine).len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, framed(&mine));
    }

    /// A server that accepts and never answers: the client gives up
    /// after its time limit, saying why.
    #[tokio::test]
    async fn the_client_gives_up_on_a_silent_server() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        let hold = tokio::spawn(async move { l.accept().await });
        let mut s = control_connect(addr, None, SHORT).await.unwrap();
        let mine = sockaddr("127.0.0.1:5000");
        let t = Instant::now();
        let e = bounded(SHORT, swap(&mut s, &mine, LO)).await.unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(e.contains("within 0.2 s (--timeout)"), "{e}");
        hold.abort();
    }
}
