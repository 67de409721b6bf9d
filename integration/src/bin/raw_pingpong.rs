//! The raw-socket floor that any TCP provider sits on: a ping-pong of
//! `SIZE`-byte messages over one loopback TCP connection with nothing but
//! `read`/`write`, in two threads. `block` reads block in the kernel;
//! `spin` reads are non-blocking and retried in a tight loop (what a
//! busy-polling fabric does); `tokio` waits in the Tokio reactor (one
//! current-thread runtime per side, `read_exact`/`write_all`), the floor of
//! anything that waits through it (`epoll_wait`, then `read`). The
//! `udp-spin` and `udp-block` modes are the floor of the udp provider: two
//! connected loopback UDP sockets trading `SIZE`-byte datagrams with bare
//! `send`/`recv` (at most 65507 bytes). Prints `usec/xfer` (half a round
//! trip) and MB/s the way `fi_pingpong` does. `memcpy` is the floor of
//! the shm provider's large messages: one core copying `SIZE` bytes
//! between two buffers (each "transfer" one copy), what moving a message
//! through memory costs at the least. `wake` is the floor of the shm
//! provider's interrupt mode: two threads that sleep in the kernel until
//! the other wakes them, trading one byte over a Unix socket pair
//! (blocking `read`/`write`; `SIZE` is ignored) — a sleep and a wake-up
//! per transfer, what an eventfd or FIFO ping-pong costs, with no data
//! moved. `cma` is the floor of the shm provider's cross-memory attach:
//! one `process_vm_readv` of `SIZE` bytes per transfer (of this process's
//! own memory, which the kernel walks and pins as it does another's).
//!
//! usage: raw-pingpong block|spin|tokio|udp-spin|udp-block|memcpy|cma|wake SIZE ITERS

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
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
    s.set_nonblocking(spin)
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

/// One datagram into `buf`, spinning on `EAGAIN` when `spin`. A datagram
/// of another size (none is expected on a private loopback pair) fails.
fn recv_datagram(s: &UdpSocket, buf: &mut [u8], spin: bool) -> io::Result<()> {
    loop {
        match s.recv(buf) {
            Ok(n) if n == buf.len() => return Ok(()),
            Ok(n) => return Err(io::Error::other(format!("datagram of {n} bytes"))),
            Err(e) if spin && e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn send_datagram(s: &UdpSocket, buf: &[u8]) -> io::Result<()> {
    loop {
        match s.send(buf) {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn run_udp(spin: bool, size: usize, iters: u64) -> io::Result<f64> {
    let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    a.connect(b.local_addr()?)?;
    b.connect(a.local_addr()?)?;
    a.set_nonblocking(spin)?;
    b.set_nonblocking(spin)?;
    let server = std::thread::spawn(move || -> io::Result<()> {
        let mut buf = vec![7u8; size];
        for _ in 0..iters {
            recv_datagram(&b, &mut buf, spin)?;
            send_datagram(&b, &buf)?;
        }
        Ok(())
    });
    let mut buf = vec![7u8; size];
    let t = Instant::now();
    for _ in 0..iters {
        send_datagram(&a, &buf)?;
        recv_datagram(&a, &mut buf, spin)?;
    }
    let secs = t.elapsed().as_secs_f64();
    server
        .join()
        .map_err(|_| io::Error::other("server thread failed"))??;
    Ok(secs)
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = match args.as_slice() {
        [_, mode, size, iters] => {
            match (mode.as_str(), size.parse::<usize>(), iters.parse::<u64>()) {
                (m @ ("block" | "spin" | "tokio" | "memcpy" | "cma" | "wake"), Ok(s), Ok(i))
                    if s > 0 && i > 0 =>
                {
                    Some((m.to_string(), s, i))
                }
                (m @ ("udp-spin" | "udp-block"), Ok(s), Ok(i)) if s > 0 && s <= 65_507 && i > 0 => {
                    Some((m.to_string(), s, i))
                }
                _ => None,
            }
        }
        _ => None,
    };
    let Some((mode, size, iters)) = parsed else {
        eprintln!(
            "usage: raw-pingpong block|spin|tokio|udp-spin|udp-block|memcpy|cma|wake SIZE ITERS"
        );
        return ExitCode::from(2);
    };
    let res = match mode.as_str() {
        "tokio" => run_tokio(size, iters),
        "udp-spin" => run_udp(true, size, iters),
        "udp-block" => run_udp(false, size, iters),
        "memcpy" => run_memcpy(size, iters),
        "cma" => run_cma(size, iters),
        "wake" => run_wake(iters),
        m => run(m == "spin", size, iters),
    };
    match res {
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
