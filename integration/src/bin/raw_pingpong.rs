//! The raw-socket floor that any TCP provider sits on: a ping-pong of
//! `SIZE`-byte messages over one loopback TCP connection with nothing but
//! `read`/`write`, in two threads. `block` reads block in the kernel;
//! `spin` reads are non-blocking and retried in a tight loop (what a
//! busy-polling fabric does); `tokio` waits in the Tokio reactor (one
//! current-thread runtime per side, `read_exact`/`write_all`), the floor of
//! anything that waits through it (`epoll_wait`, then `read`). The
//! `udp-spin` and `udp-block` modes are the floor of the udp provider: two
//! connected loopback UDP sockets trading `SIZE`-byte datagrams with bare
//! `send`/`recv` (at most 65507 bytes). A datagram endpoint cannot
//! connect its socket (it takes datagrams from any peer and names the
//! destination of each send), so `udp-spin-unconn` is the same spinning
//! pair unconnected, with `send_to`/`recv_from`: each send looks its route
//! up again, and each arrival its socket and input route (the kernel's
//! early demultiplexing caches both for connected sockets only). Given
//! `-B PORT` (server) or `-P PORT HOST` (client), a `udp-spin*` mode runs
//! one side per process, as `fi_pingpong` runs (pin each with `taskset`);
//! the client prints the result. `udp-self` and `udp-self-unconn` time the
//! system calls alone: one socket sends each datagram to itself and reads
//! it back at once, in one thread (no waiting, no second CPU), connected
//! to itself or not; each "transfer" is one send and one receive.
//! `udp-self-unconn-epoll` is `udp-self-unconn` with the socket also
//! registered with an epoll instance never waited on (as a socket a Tokio
//! reactor watches): what the kernel's wake-up callback adds per datagram.
//! Prints `usec/xfer` (half a round trip) and MB/s the way `fi_pingpong`
//! does. The TCP modes run the congestion control weft's tcp provider
//! gives a loopback connection (`cubic` where the system's is BBR;
//! `RAW_CC=system` keeps the system's, `RAW_CC=NAME` sets NAME).
//! `memcpy` is the floor of the shm provider's large messages: one core
//! copying `SIZE` bytes between two buffers (each "transfer" one copy),
//! what moving a message through memory costs at the least, with both
//! buffers in that core's cache. `xcopy` is the same copy of bytes another
//! core has just written (two threads taking turns: one writes its message,
//! the other copies it out; only the copies are timed): what a transfer
//! between two cores costs at the least. `xcopy-split` is `xcopy` with
//! both cores copying half of each message at once, as the shm
//! provider's split copies do: the least a transfer between two cores
//! costs when both copy. `wake` is the floor of the shm
//! provider's interrupt mode: two threads that sleep in the kernel until
//! the other wakes them, trading one byte over a Unix socket pair (blocking
//! `read`/`write`; `SIZE` is ignored) — a sleep and a wake-up per transfer,
//! what an eventfd or FIFO ping-pong costs, with no data moved. `cma` is
//! the floor of the shm provider's cross-memory attach: one
//! `process_vm_readv` of `SIZE` bytes per transfer (of this process's own
//! memory, which the kernel walks and pins as it does another's).
//!
//! usage: raw-pingpong MODE SIZE ITERS [-B PORT | -P PORT HOST]
//!   MODE: block|spin|tokio|udp-spin|udp-spin-unconn|udp-block|udp-self|
//!         udp-self-unconn|udp-self-unconn-epoll|memcpy|xcopy|xcopy-split|cma|
//!         wake
//!         (-B/-P: udp-spin* only)

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::Instant;

fn read_full(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if spin && e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_full(s: &mut TcpStream, buf: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn prepare(s: &TcpStream, spin: bool) -> io::Result<()> {
    s.set_nodelay(true)?;
    unpaced(s)?;
    s.set_nonblocking(spin)
}

/// The floor's sockets run the congestion control weft's tcp provider
/// gives a loopback connection: where the system's algorithm paces
/// (BBR), `cubic` (`reno` where `cubic` is refused); `RAW_CC=system`
/// keeps the system's, `RAW_CC=NAME` sets NAME. Under BBR's pacing a loopback 1 MiB ping-pong made half
/// the bandwidth, so a floor with it would not be the floor of the same
/// socket.
fn unpaced(s: &TcpStream) -> io::Result<()> {
    use rustix::net::sockopt::{set_tcp_congestion, tcp_congestion};
    let now = tcp_congestion(s)?;
    match std::env::var("RAW_CC").ok().as_deref() {
        Some("system") => Ok(()),
        Some(name) => Ok(set_tcp_congestion(s, name)?),
        None if now.starts_with("bbr") => {
            Ok(set_tcp_congestion(s, "cubic").or_else(|_| set_tcp_congestion(s, "reno"))?)
        }
        None => Ok(()),
    }
}

fn run(spin: bool, size: usize, iters: u64) -> io::Result<f64> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> io::Result<()> {
        let (mut s, _) = l.accept()?;
        prepare(&s, spin)?;
        let mut buf = vec![7u8; size];
        for _ in 0..iters {
            read_full(&mut s, &mut buf, spin)?;
            write_full(&mut s, &buf)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    prepare(&s, spin)?;
    let mut buf = vec![7u8; size];
    let t = Instant::now();
    for _ in 0..iters {
        write_full(&mut s, &buf)?;
        read_full(&mut s, &mut buf, spin)?;
    }
    let secs = t.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
}

/// How a side of a UDP floor addresses its peer: through a connected
/// socket (`send`/`recv`), or naming it per send (`send_to`/`recv_from`),
/// as a datagram endpoint must.
#[derive(Debug, Clone, Copy)]
enum Peer {
    Connected,
    To(SocketAddr),
}

/// A spinner gives up after this long without a datagram (the peer died):
/// a floor never hangs.
const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// One datagram into `buf`, spinning on `EAGAIN` when `spin`. A datagram
/// of another size (none is expected on a private loopback pair) fails.
fn recv_datagram(s: &UdpSocket, peer: Peer, buf: &mut [u8], spin: bool) -> io::Result<()> {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        let r = match peer {
            Peer::Connected => s.recv(buf),
            Peer::To(_) => s.recv_from(buf).map(|(n, _)| n),
        };
        match r {
            Ok(n) if n == buf.len() => return Ok(()),
            // A client's hello sent again (`run_udp_proc`): not a message.
            Ok(0) => {}
            Ok(n) => return Err(io::Error::other(format!("datagram of {n} bytes"))),
            Err(e) if spin && e.kind() == io::ErrorKind::WouldBlock => {
                // The clock once in 65536 spins: off the floor's path.
                spins = spins.wrapping_add(1);
                if spins % 65_536 == 0 {
                    let t = *since.get_or_insert_with(Instant::now);
                    if t.elapsed() > SPIN_LIMIT {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                }
                std::hint::spin_loop()
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn send_datagram(s: &UdpSocket, peer: Peer, buf: &[u8]) -> io::Result<()> {
    loop {
        let r = match peer {
            Peer::Connected => s.send(buf),
            Peer::To(a) => s.send_to(buf, a),
        };
        match r {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A loopback UDP socket, and how it reaches `to`: connected to it when
/// `connect`.
fn udp_side(to: SocketAddr, connect: bool, sock: UdpSocket) -> io::Result<(UdpSocket, Peer)> {
    if connect {
        sock.connect(to)?;
        Ok((sock, Peer::Connected))
    } else {
        Ok((sock, Peer::To(to)))
    }
}

fn run_udp(spin: bool, connect: bool, size: usize, iters: u64) -> io::Result<f64> {
    let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let (a, pa) = udp_side(ba, connect, a)?;
    let (b, pb) = udp_side(aa, connect, b)?;
    a.set_nonblocking(spin)?;
    b.set_nonblocking(spin)?;
    let server = std::thread::spawn(move || -> io::Result<()> {
        let mut buf = vec![7u8; size];
        for _ in 0..iters {
            recv_datagram(&b, pb, &mut buf, spin)?;
            send_datagram(&b, pb, &buf)?;
        }
        Ok(())
    });
    let mut buf = vec![7u8; size];
    let t = Instant::now();
    for _ in 0..iters {
        send_datagram(&a, pa, &buf)?;
        recv_datagram(&a, pa, &mut buf, spin)?;
    }
    let secs = t.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
}

/// Where a two-process floor runs: the server's port, or the server's
/// port and host for the client.
#[derive(Debug, Clone)]
enum Side {
    Server(u16),
    Client(u16, String),
}

/// The first datagram of a two-process floor, empty: the client says
/// hello until the server answers (it may not be bound yet), so that the
/// timed iterations start with both sides up.
const HELLO_TRIES: u32 = 100;

/// One side of the spinning floor in its own process. The server learns
/// the client's address from its hello (and connects to it when
/// `connect`); both then trade `iters` datagrams, spinning. The client
/// returns the time of the iterations; the server 0.
fn run_udp_proc(side: &Side, connect: bool, size: usize, iters: u64) -> io::Result<f64> {
    let mut buf = vec![7u8; size];
    let hello = [0u8; 0];
    let (sock, peer) = match side {
        Side::Server(port) => {
            let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, *port))?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
            let (_, from) = s.recv_from(&mut buf)?;
            let (s, p) = udp_side(from, connect, s)?;
            send_datagram(&s, p, &hello)?;
            (s, p)
        }
        Side::Client(port, host) => {
            let to = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))?
                .find(SocketAddr::is_ipv4)
                .ok_or_else(|| io::Error::other("no IPv4 address for the server"))?;
            let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
            let (s, p) = udp_side(to, connect, s)?;
            s.set_read_timeout(Some(std::time::Duration::from_millis(100)))?;
            let mut answered = false;
            for _ in 0..HELLO_TRIES {
                // A connected socket reports the refusal of an earlier
                // hello on a later call: try again.
                let _ = send_datagram(&s, p, &hello);
                // Anything else: not there yet (a refusal when
                // connected, or a timeout).
                if let Ok((0, _)) = s.recv_from(&mut buf) {
                    answered = true;
                    break;
                }
                // A refusal comes back at once: give the server time.
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if !answered {
                return Err(io::Error::other("the server did not answer"));
            }
            (s, p)
        }
    };
    sock.set_nonblocking(true)?;
    if let Side::Server(_) = side {
        for _ in 0..iters {
            recv_datagram(&sock, peer, &mut buf, true)?;
            send_datagram(&sock, peer, &buf)?;
        }
        return Ok(0.0);
    }
    let t = Instant::now();
    for _ in 0..iters {
        send_datagram(&sock, peer, &buf)?;
        recv_datagram(&sock, peer, &mut buf, true)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The system calls alone: `2 * iters` times, one socket sends a datagram
/// to itself and reads it back (loopback delivers it within the send),
/// connected to itself or naming itself per send. `epoll`: the socket is
/// also registered with an epoll instance (Tokio's reactor, as weft's
/// interrupt and inline modes register theirs) that is never waited on,
/// so every arrival runs the kernel's epoll callback.
fn run_udp_self(connect: bool, epoll: bool, size: usize, iters: u64) -> io::Result<f64> {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let me = s.local_addr()?;
    let (s, p) = udp_side(me, connect, s)?;
    s.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let _registered = if epoll {
        let _g = rt.enter();
        Some(tokio::net::UdpSocket::from_std(s.try_clone()?)?)
    } else {
        None
    };
    let mut buf = vec![7u8; size];
    // The first round trip outside the time (routes and caches filled).
    send_datagram(&s, p, &buf)?;
    recv_datagram(&s, p, &mut buf, true)?;
    let t = Instant::now();
    for _ in 0..2 * iters {
        send_datagram(&s, p, &buf)?;
        recv_datagram(&s, p, &mut buf, true)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

fn tokio_side<F: std::future::Future<Output = io::Result<()>>>(f: F) -> io::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn run_tokio(size: usize, iters: u64) -> io::Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> io::Result<()> {
        let (s, _) = l.accept()?;
        prepare(&s, true)?;
        tokio_side(async move {
            let mut s = tokio::net::TcpStream::from_std(s)?;
            let mut buf = vec![7u8; size];
            for _ in 0..iters {
                s.read_exact(&mut buf).await?;
                s.write_all(&buf).await?;
            }
            Ok(())
        })
    });
    let s = TcpStream::connect(addr)?;
    prepare(&s, true)?;
    let mut secs = 0.0;
    tokio_side(async {
        let mut s = tokio::net::TcpStream::from_std(s)?;
        let mut buf = vec![7u8; size];
        let t = Instant::now();
        for _ in 0..iters {
            s.write_all(&buf).await?;
            s.read_exact(&mut buf).await?;
        }
        secs = t.elapsed().as_secs_f64();
        Ok(())
    })?;
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
}

/// A one-byte ping-pong over a Unix socket pair between two threads
/// blocked in `read`: the cost of sleeping and being woken.
fn run_wake(iters: u64) -> io::Result<f64> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let server = std::thread::spawn(move || -> io::Result<()> {
        let mut x = [0u8; 1];
        for _ in 0..iters {
            b.read_exact(&mut x)?;
            b.write_all(&x)?;
        }
        Ok(())
    });
    let mut x = [1u8; 1];
    let t = Instant::now();
    for _ in 0..iters {
        a.write_all(&x)?;
        a.read_exact(&mut x)?;
    }
    let secs = t.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
}

/// The interrupt floor as the ping-pongs run: two threads, each pinned
/// to a CPU of its own (the first two this process may use, as the
/// benchmarks pin server and client), each blocked until the other
/// wakes it through an eventfd — in `read`, or (`epoll`) in
/// `epoll_wait` then `read`, as a Tokio reactor sleeps. `wake` leaves
/// its two threads to the scheduler, which may run both on one CPU (a
/// local switch, no cross-CPU wake-up); a ping-pong between processes
/// pinned apart cannot.
fn run_wake_pinned(iters: u64, epoll: bool) -> io::Result<f64> {
    use rustix::event::{eventfd, EventfdFlags};
    use rustix::thread::{sched_getaffinity, CpuSet};
    let allowed = sched_getaffinity(None)?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
    let (client_cpu, server_cpu) = (cpus.next(), cpus.next());
    let (ping, pong) = (
        eventfd(0, EventfdFlags::CLOEXEC)?,
        eventfd(0, EventfdFlags::CLOEXEC)?,
    );
    let one = 1u64.to_ne_bytes();
    let server = {
        let (ping, pong) = (ping.try_clone()?, pong.try_clone()?);
        let ep = wake_poller(&ping, epoll)?;
        std::thread::spawn(move || -> io::Result<()> {
            pin_to(server_cpu)?;
            for _ in 0..iters {
                wake_wait(&ping, ep.as_ref())?;
                rustix::io::write(&pong, &one)?;
            }
            Ok(())
        })
    };
    pin_to(client_cpu)?;
    let ep = wake_poller(&pong, epoll)?;
    let t = Instant::now();
    for _ in 0..iters {
        rustix::io::write(&ping, &one)?;
        wake_wait(&pong, ep.as_ref())?;
    }
    let secs = t.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
}

/// Pins the calling thread to `cpu` (none: left where it is).
fn pin_to(cpu: Option<usize>) -> io::Result<()> {
    use rustix::thread::{sched_setaffinity, CpuSet};
    if let Some(c) = cpu {
        let mut set = CpuSet::new();
        set.set(c);
        sched_setaffinity(None, &set)?;
    }
    Ok(())
}

/// An epoll set watching eventfd `fd` for [`wake_wait`], if `epoll`.
fn wake_poller(fd: &std::os::fd::OwnedFd, epoll: bool) -> io::Result<Option<std::os::fd::OwnedFd>> {
    use rustix::event::epoll;
    if !epoll {
        return Ok(None);
    }
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    epoll::add(&ep, fd, epoll::EventData::new_u64(0), epoll::EventFlags::IN)?;
    Ok(Some(ep))
}

/// Waits for the counter of eventfd `fd` to be set (in `epoll_wait` on
/// `ep` first, when given) and takes it.
fn wake_wait(fd: &std::os::fd::OwnedFd, ep: Option<&std::os::fd::OwnedFd>) -> io::Result<()> {
    if let Some(ep) = ep {
        let mut events = Vec::with_capacity(1);
        rustix::event::epoll::wait(ep, rustix::buffer::spare_capacity(&mut events), None)?;
    }
    let mut b = [0u8; 8];
    rustix::io::read(fd, &mut b)?;
    Ok(())
}

/// `2 * iters` copies of `size` bytes (so that, like the ping-pongs,
/// the time per transfer is the total over `2 * iters`).
fn run_memcpy(size: usize, iters: u64) -> io::Result<f64> {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    // Warm both buffers (page faults are not the floor).
    dst.copy_from_slice(&src);
    let t = Instant::now();
    for i in 0..2 * iters {
        dst.copy_from_slice(&src);
        dst[(i as usize) % size] ^= 1;
        std::hint::black_box(&mut dst);
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Spins until `done` holds, or fails once it has not for
/// [`SPIN_LIMIT`] (the other side of a two-thread floor stopped). Each
/// wait has its own limit: a long run is not a stopped side.
fn spin_until(floor: &str, done: impl Fn() -> bool) -> io::Result<()> {
    let deadline = Instant::now() + SPIN_LIMIT;
    while !done() {
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("{floor}: the other side stopped")));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// The cross-core floor of large messages: two threads take turns, each
/// writing every byte of its `size`-byte message, then the other copying
/// it out into its own buffer (`2 * iters` transfers). Returns the time
/// of the copies alone, each of bytes another core has just written —
/// the least a transfer between two cores costs beyond the writing,
/// which [`run_memcpy`] (both buffers in one core's cache) does not
/// show. Confine it to two cores (`taskset -c 0,1`): the two spinning
/// threads then run one on each.
fn run_xcopy(size: usize, iters: u64) -> io::Result<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    // In turn t, side t % 2 writes its message and sets `turn` to
    // 2t + 1; the other side copies it out and sets 2t + 2.
    let turn = Arc::new(AtomicU64::new(0));
    let msgs: Arc<[Mutex<Vec<u8>>; 2]> =
        Arc::new([Mutex::new(vec![1u8; size]), Mutex::new(vec![2u8; size])]);
    let side = |me: u64, turn: Arc<AtomicU64>, msgs: Arc<[Mutex<Vec<u8>>; 2]>| {
        move || -> io::Result<f64> {
            let mut dst = vec![0u8; size];
            let mut copying = std::time::Duration::ZERO;
            let lock = |i: usize| {
                msgs[i]
                    .lock()
                    .map_err(|_| io::Error::other("a side failed"))
            };
            for t in 0..2 * iters {
                let wait = |v: u64| spin_until("xcopy", || turn.load(Ordering::Acquire) == v);
                if t % 2 == me {
                    wait(2 * t)?;
                    lock(me as usize)?.fill(t as u8);
                    turn.store(2 * t + 1, Ordering::Release);
                } else {
                    wait(2 * t + 1)?;
                    let src = lock((1 - me) as usize)?;
                    let at = Instant::now();
                    dst.copy_from_slice(&src);
                    copying += at.elapsed();
                    drop(src);
                    std::hint::black_box(&mut dst);
                    turn.store(2 * t + 2, Ordering::Release);
                }
            }
            Ok(copying.as_secs_f64())
        }
    };
    let other = std::thread::spawn(side(1, turn.clone(), msgs.clone()));
    let mine = side(0, turn, msgs)()?;
    let theirs = other
        .join()
        .map_err(|_| io::Error::other("xcopy thread failed"))??;
    Ok(mine + theirs)
}

/// The cross-core floor of a message both cores copy (weft-shm's split
/// copies): as [`run_xcopy`], two threads take turns writing every byte
/// of their `size`-byte message, but then both copy it out at once, the
/// writer its back half into the other's buffer, the other its front
/// half. Returns the time from the other side seeing the message written
/// until both halves are copied, over the `2 * iters` transfers: the
/// least a transfer between two cores costs when each copies half, so a
/// process-to-process message on two cores cannot beat it.
fn run_xcopy_split(size: usize, iters: u64) -> io::Result<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, RwLock};
    let half = size / 2;
    // Turn t begins at step 3t; the writer's message is written at 3t + 1;
    // each finished half adds one, so the turn ends at 3t + 3.
    let step = AtomicU64::new(0);
    let msgs = [RwLock::new(vec![1u8; size]), RwLock::new(vec![2u8; size])];
    // Filled, not zeroed: a zeroed allocation is mapped on first write,
    // and page faults are not the floor (as `run_memcpy` warms its own).
    let fronts = [Mutex::new(vec![3u8; half]), Mutex::new(vec![3u8; half])];
    let backs = [
        Mutex::new(vec![3u8; size - half]),
        Mutex::new(vec![3u8; size - half]),
    ];
    let failed = || io::Error::other("xcopy-split: a side failed");
    let wait =
        |at_least: u64| spin_until("xcopy-split", || step.load(Ordering::Acquire) >= at_least);
    let side = |me: usize| -> io::Result<f64> {
        let mut copying = std::time::Duration::ZERO;
        for t in 0..2 * iters {
            let base = 3 * t;
            wait(base)?;
            if t % 2 == me as u64 {
                msgs[me].write().map_err(|_| failed())?.fill(t as u8);
                step.store(base + 1, Ordering::Release);
                let src = msgs[me].read().map_err(|_| failed())?;
                let mut dst = backs[1 - me].lock().map_err(|_| failed())?;
                dst.copy_from_slice(&src[half..]);
                std::hint::black_box(&mut *dst);
                step.fetch_add(1, Ordering::AcqRel);
            } else {
                wait(base + 1)?;
                let at = Instant::now();
                {
                    let src = msgs[1 - me].read().map_err(|_| failed())?;
                    let mut dst = fronts[me].lock().map_err(|_| failed())?;
                    dst.copy_from_slice(&src[..half]);
                    std::hint::black_box(&mut *dst);
                }
                step.fetch_add(1, Ordering::AcqRel);
                wait(base + 3)?;
                copying += at.elapsed();
            }
        }
        Ok(copying.as_secs_f64())
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| side(1));
        let mine = side(0)?;
        let theirs = other
            .join()
            .map_err(|_| io::Error::other("xcopy-split thread failed"))??;
        Ok(mine + theirs)
    })
}

/// `2 * iters` reads of `size` bytes by `process_vm_readv`, as
/// [`run_memcpy`] copies.
fn run_cma(size: usize, iters: u64) -> io::Result<f64> {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src);
    let me = std::process::id();
    let range = [(src.as_ptr() as usize as u64, size as u64)];
    let t = Instant::now();
    for _ in 0..2 * iters {
        weft_shm::cma::pull(me, &range, &mut [&mut dst[..]])
            .map_err(|e| io::Error::other(format!("process_vm_readv: {e:?}")))?;
        std::hint::black_box(&mut dst);
    }
    Ok(t.elapsed().as_secs_f64())
}

const USAGE: &str = "usage: raw-pingpong MODE SIZE ITERS [-B PORT | -P PORT HOST]
  MODE: block|spin|tokio|udp-spin|udp-spin-unconn|udp-block|udp-self|udp-self-unconn|
        udp-self-unconn-epoll|memcpy|xcopy|xcopy-split|cma|wake|wake-pinned|
        wake-epoll-pinned
  (-B/-P: udp-spin and udp-spin-unconn only, one side per process)";

/// The mode, size, iterations and (two-process floors) the side.
fn parse(args: &[String]) -> Option<(String, usize, u64, Option<Side>)> {
    let (mode, size, iters, rest) = match args {
        [_, mode, size, iters, rest @ ..] => (mode.as_str(), size, iters, rest),
        _ => return None,
    };
    let (size, iters) = (size.parse::<usize>().ok()?, iters.parse::<u64>().ok()?);
    if size == 0 || iters == 0 {
        return None;
    }
    let udp = mode.starts_with("udp-");
    let ok = matches!(
        mode,
        "block"
            | "spin"
            | "tokio"
            | "memcpy"
            | "cma"
            | "xcopy"
            | "xcopy-split"
            | "wake"
            | "wake-pinned"
            | "wake-epoll-pinned"
            | "udp-spin"
            | "udp-spin-unconn"
            | "udp-block"
            | "udp-self"
            | "udp-self-unconn"
            | "udp-self-unconn-epoll"
    );
    if !ok || (udp && size > 65_507) {
        return None;
    }
    let side = match rest {
        [] => None,
        [b, port] if b == "-B" => Some(Side::Server(port.parse().ok()?)),
        [p, port, host] if p == "-P" => Some(Side::Client(port.parse().ok()?, host.clone())),
        _ => return None,
    };
    if side.is_some() && !matches!(mode, "udp-spin" | "udp-spin-unconn") {
        return None;
    }
    Some((mode.to_string(), size, iters, side))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some((mode, size, iters, side)) = parse(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let res = match (mode.as_str(), &side) {
        ("udp-spin", Some(s)) => run_udp_proc(s, true, size, iters),
        ("udp-spin-unconn", Some(s)) => run_udp_proc(s, false, size, iters),
        ("tokio", _) => run_tokio(size, iters),
        ("udp-spin", _) => run_udp(true, true, size, iters),
        ("udp-spin-unconn", _) => run_udp(true, false, size, iters),
        ("udp-block", _) => run_udp(false, true, size, iters),
        ("udp-self", _) => run_udp_self(true, false, size, iters),
        ("udp-self-unconn", _) => run_udp_self(false, false, size, iters),
        ("udp-self-unconn-epoll", _) => run_udp_self(false, true, size, iters),
        ("memcpy", _) => run_memcpy(size, iters),
        ("cma", _) => run_cma(size, iters),
        ("xcopy", _) => run_xcopy(size, iters),
        ("xcopy-split", _) => run_xcopy_split(size, iters),
        ("wake", _) => run_wake(iters),
        ("wake-pinned", _) => run_wake_pinned(iters, false),
        ("wake-epoll-pinned", _) => run_wake_pinned(iters, true),
        (m, _) => run(m == "spin", size, iters),
    };
    match res {
        // The server of a two-process floor: the client reports.
        Ok(_) if matches!(side, Some(Side::Server(_))) => ExitCode::SUCCESS,
        Ok(secs) => {
            let half_rtt_us = secs / iters as f64 / 2.0 * 1e6;
            let mbps = size as f64 / half_rtt_us;
            println!("{half_rtt_us:.2} {mbps:.1}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("raw-pingpong: {e}");
            ExitCode::from(1)
        }
    }
}
