//! Identities for raw test peers: an RDM `Hello` claims a listening
//! address, and the acceptor has that address confirm the claim
//! (`docs/wire.md` §8.2). A raw peer that wants its handshake accepted
//! therefore needs an address of its own that answers `Verify` for the
//! nonces it sent; this is one. [`raw_hello`] does the whole handshake
//! with one, for tests that then speak raw frames.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use weft_core::wire::claim::{canonical, fresh_nonce, Claim, Nonce};
use weft_core::wire::{self, FrameKind, Header, HEADER_LEN};

type Claims = Arc<Mutex<HashMap<Nonce, SocketAddr>>>;

/// A loopback listening address that confirms the claims made with it.
#[derive(Debug)]
pub struct Identity {
    addr: SocketAddr,
    claims: Claims,
    task: JoinHandle<()>,
}

impl Identity {
    /// Listens on a fresh loopback port. Needs a Tokio runtime.
    pub async fn new() -> std::io::Result<Identity> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let claims: Claims = Arc::default();
        let c = claims.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(answer(s, c.clone()));
            }
        });
        Ok(Identity { addr, claims, task })
    }

    /// The address it claims.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `Hello` payload claiming this identity to the endpoint at
    /// `victim`, which it will confirm.
    pub fn hello_to(&self, victim: SocketAddr) -> Vec<u8> {
        self.claim_as(self.addr, victim)
    }

    /// A `Hello` payload claiming to be `who` (usually somebody else's
    /// address: an impostor), with a nonce this identity would confirm
    /// for `victim` only if `who` were its own address.
    pub fn claim_as(&self, who: SocketAddr, victim: SocketAddr) -> Vec<u8> {
        let nonce = fresh_nonce().unwrap_or([0x5a; 16]);
        if let Ok(mut c) = self.claims.lock() {
            c.insert(nonce, canonical(victim));
        }
        Claim { addr: who, nonce }.encode()
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers one `Verify`: yes for a nonce claimed to the asker.
async fn answer(mut s: TcpStream, claims: Claims) {
    let mut b = [0u8; HEADER_LEN];
    if s.read_exact(&mut b).await.is_err() {
        return;
    }
    let Ok(h) = wire::decode(&b, 0) else { return };
    if h.kind != Some(FrameKind::Verify) {
        return;
    }
    let mut p = vec![0u8; h.len as usize];
    if s.read_exact(&mut p).await.is_err() {
        return;
    }
    let yes = Claim::decode(&p).is_ok_and(|c| {
        claims
            .lock()
            .is_ok_and(|m| m.get(&c.nonce) == Some(&canonical(c.addr)))
    });
    let mut ack = Header::new(FrameKind::VerifyAck);
    if !yes {
        ack.data = weft::Error::Access.code() as u64;
    }
    let _ = s.write_all(&ack.encode()).await;
}

/// A raw connection that has done the RDM handshake with `victim`, with
/// the identity it claimed (which confirms the claim when asked; keep it
/// while the connection lives). Fails the test if the victim refuses.
pub async fn raw_hello(victim: SocketAddr) -> (TcpStream, Identity) {
    let ident = Identity::new().await.unwrap();
    let mut s = TcpStream::connect(victim).await.unwrap();
    let payload = ident.hello_to(victim);
    let mut h = Header::new(FrameKind::Hello);
    h.len = payload.len() as u64;
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(&payload).await.unwrap();
    let (ack, _) = read_frame(&mut s).await;
    assert_eq!((ack.kind, ack.data), (Some(FrameKind::HelloAck), 0));
    (s, ident)
}

/// The next whole frame on `s` (within [`crate::TIMEOUT`]).
pub async fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut b = [0u8; HEADER_LEN];
    crate::within("frame", s.read_exact(&mut b)).await.unwrap();
    let h = wire::decode(&b, 1 << 30).unwrap();
    let mut p = vec![0u8; h.len as usize];
    crate::within("payload", s.read_exact(&mut p))
        .await
        .unwrap();
    (h, p)
}

/// Reads (and drops) what the victim sends until it closes `s`.
pub async fn expect_closed(mut s: TcpStream) {
    let mut b = [0u8; 256];
    loop {
        match crate::within("close", s.read(&mut b)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
