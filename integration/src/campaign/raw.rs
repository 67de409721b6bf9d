//! Raw attacker sockets: they speak as much of the wire protocol as an
//! attack needs (`docs/wire.md`) and no more.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};

use crate::identity::Identity;

/// How long an attacker waits for the victim before calling it a hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Connects to `victim`.
pub async fn connect(victim: SocketAddr) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(PATIENCE, TcpStream::connect(victim)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// A raw connection that completed the RDM handshake, with the identity
/// it claimed (kept while the connection is, so no other attacker is
/// handed the same address meanwhile).
#[derive(Debug)]
pub struct Handshaken {
    s: TcpStream,
    _id: Identity,
}

impl std::ops::Deref for Handshaken {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.s
    }
}

impl std::ops::DerefMut for Handshaken {
    fn deref_mut(&mut self) -> &mut TcpStream {
        &mut self.s
    }
}

impl From<Handshaken> for TcpStream {
    fn from(h: Handshaken) -> TcpStream {
        h.s
    }
}

/// Connects and completes the RDM handshake claiming a fresh identity of
/// its own, which confirms the claim when the victim asks
/// ([`Identity`]). `Ok(None)`: the victim closed the connection instead
/// of answering (a limit).
pub async fn handshaken(victim: SocketAddr) -> std::io::Result<Option<Handshaken>> {
    let id = Identity::new().await?;
    let mut s = connect(victim).await?;
    let payload = id.hello_to(victim);
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
        Ok(a) if a.kind == Some(FrameKind::HelloAck) && a.data == 0 => {
            Ok(Some(Handshaken { s, _id: id }))
        }
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
pub fn reset(s: impl Into<TcpStream>) {
    let s: TcpStream = s.into();
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
