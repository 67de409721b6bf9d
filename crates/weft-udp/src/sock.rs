//! The socket's two calls on the data path, `recvfrom` and `sendmsg`,
//! made with as few instructions around them as found (`docs/benchmarks.md`,
//! "udp: instructions per round trip").

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::sys::socket::{recvfrom, SockaddrIn, SockaddrIn6};
use rustix::io::Errno;
use rustix::net::addr::SocketAddrArg;
use rustix::net::{SendAncillaryBuffer, SendFlags};

/// Reads one datagram into `buf`: its length and sender. The sender's
/// address is read as the socket's own family's (`v6`; an IPv6 socket
/// takes no IPv4 peers, `open_socket`): `UdpSocket::recv_from` clears
/// and decodes a `sockaddr_storage` for every datagram, and so does
/// `rustix`'s, about 25 instructions more of a 64 B round trip than the
/// libc wrapper's cancellation point costs. An address of another form,
/// which the kernel does not give, reads as `InvalidData`.
#[inline(always)]
pub fn recv_from(sock: &UdpSocket, v6: bool, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    let fd = sock.as_raw_fd();
    let (n, from) = if v6 {
        let (n, a) = recvfrom::<SockaddrIn6>(fd, buf)?;
        (n, a.map(|a| SocketAddr::V6(a.into())))
    } else {
        let (n, a) = recvfrom::<SockaddrIn>(fd, buf)?;
        (n, a.map(|a| SocketAddr::V4(a.into())))
    };
    from.map(|f| (n, f))
        .ok_or_else(|| io::ErrorKind::InvalidData.into())
}

/// Sends one datagram made of `parts` to `to`, with `sendmsg` made
/// straight to the kernel (`rustix`): libc's wrapper is a cancellation
/// point, whose entry and exit cost about 25 instructions a send.
#[inline(always)]
pub fn send_parts(
    sock: &UdpSocket,
    parts: &[IoSlice<'_>],
    to: &impl SocketAddrArg,
) -> io::Result<()> {
    loop {
        let mut none = SendAncillaryBuffer::default();
        match rustix::net::sendmsg_addr(sock, to, parts, &mut none, SendFlags::empty()) {
            // UDP takes a datagram whole or not at all.
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
