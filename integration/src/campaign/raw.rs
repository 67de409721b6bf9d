//! Raw attacker sockets: they speak as much of the wire protocol as an
//! attack needs (`docs/wire.md`) and no more.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};

/// How long an attacker waits for the victim before calling it a hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Connects to `victim`.
pub async fn connect(victim: SocketAddr) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(PATIENCE, TcpStream::connect(victim)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Connects and completes the RDM handshake claiming a fresh identity:
/// its own socket's address, which no other attacker can hold at the same
/// time (nothing listens there). `Ok(None)`: the victim closed the
/// connection instead of answering (a limit).
pub async fn handshaken(victim: SocketAddr) -> std::io::Result<Option<TcpStream>> {
    let mut s = connect(victim).await?;
    let ident = s.local_addr()?;
    let payload = weft::encode_sockaddr(&ident);
    let mut h = Header::new(FrameKind::Hello);
    h.len = payload.len() as u64;
    if s.write_all(&h.encode()).await.is_err() || s.write_all(&payload).await.is_err() {
        return Ok(None);
    }
    let mut ack = [0u8; HEADER_LEN];
    match tokio::time::timeout(PATIENCE, s.read_exact(&mut ack)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return Ok(None),
        Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
    }
    match wire::decode(&ack, 0) {
        Ok(a) if a.kind == Some(FrameKind::HelloAck) && a.data == 0 => Ok(Some(s)),
        _ => Ok(None),
    }
}

/// The encoded header of a tagged message announcing `len` bytes.
pub fn tagged_header(tag: u64, len: u64, seq: u64) -> [u8; HEADER_LEN] {
    let mut h = Header::new(FrameKind::Tagged);
    h.tag = tag;
    h.len = len;
    h.seq = seq;
    h.encode()
}

/// Waits until the victim closes `s` (EOF or reset); `false` if it did
/// not within `within`. Whatever the victim sends meanwhile is read and
/// dropped.
pub async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 256];
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Closes abortively (a reset), as a killed process with unread data
/// does. An ordinary close queues its FIN behind unsent bytes, and bytes
/// the victim will not read (it parked the connection) keep that FIN from
/// ever arriving: the attacker's kernel gives such an orphan up only
/// after minutes (`tcp_orphan_retries`).
pub fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

/// Writes `bytes` one at a time, `gap` apart, stopping at the first
/// error (the victim closed). Returns how many went out.
pub async fn trickle(s: &mut TcpStream, bytes: &[u8], gap: Duration) -> usize {
    for (i, b) in bytes.iter().enumerate() {
        if s.write_all(std::slice::from_ref(b)).await.is_err() {
            return i;
        }
        tokio::time::sleep(gap).await;
    }
    bytes.len()
}
