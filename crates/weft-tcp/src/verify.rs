//! Proof of identity for RDM connections (`docs/wire.md` §8.2).
//!
//! A connector's `Hello` claims a listening address and carries a fresh
//! nonce; the connector remembers the nonce with the address it dialled
//! until the handshake ends. The acceptor then dials the claimed address
//! and sends `Verify` with the nonce and the address the claimant reached
//! it at; the endpoint listening there answers yes only for a nonce it
//! sent there. An impostor's claim is refused (`FI_EACCES`) and reported
//! on the EQ. A peer that learnt a nonce because it was dialled cannot use
//! it elsewhere: the address it would be verified against is its own.
//!
//! Verifications are bounded: each answer must come within the handshake
//! timeout, and at most [`MAX_VERIFYING`] run at once per endpoint (a
//! flood of claims makes the endpoint dial out at most that often); the
//! rest wait their turn, in order, within the handshake timeout, and are
//! refused with `FI_EAGAIN` when it runs out.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use weft_core::sync::lock;
use weft_core::wire::claim::{canonical, fresh_nonce, Claim, Nonce};
use weft_core::wire::{FrameKind, Header};
use weft_core::{Error, Result};

use crate::endpoint::EpShared;
use crate::frame::{read_frame, write_frame};
use crate::tls::HsStream;

/// Verifications one endpoint runs at once.
pub const MAX_VERIFYING: usize = 64;

/// A nonce this endpoint sent in a `Hello`, remembered until the
/// handshake ends (dropping it forgets the nonce).
pub struct OpenClaim {
    ep: Arc<EpShared>,
    nonce: Nonce,
}

impl OpenClaim {
    /// A claim to the endpoint listening at `dest`.
    pub fn new(ep: &Arc<EpShared>, dest: SocketAddr) -> Result<OpenClaim> {
        let nonce = fresh_nonce()?;
        lock(&ep.claims).insert(nonce, canonical(dest));
        Ok(OpenClaim {
            ep: ep.clone(),
            nonce,
        })
    }

    /// The nonce of this claim.
    pub fn nonce(&self) -> Nonce {
        self.nonce
    }

    /// The claim: this endpoint's address and the nonce.
    pub fn claim(&self) -> Claim {
        Claim {
            addr: self.ep.local,
            nonce: self.nonce,
        }
    }

    /// The `Hello` payload.
    pub fn hello(&self) -> Vec<u8> {
        self.claim().encode()
    }
}

impl Drop for OpenClaim {
    fn drop(&mut self) {
        lock(&self.ep.claims).remove(&self.nonce);
    }
}

impl EpShared {
    /// Whether this endpoint sent `nonce` to the endpoint it reached at
    /// `dialled`.
    pub fn made_claim(&self, nonce: &Nonce, dialled: SocketAddr) -> bool {
        lock(&self.claims).get(nonce) == Some(&canonical(dialled))
    }
}

/// Whether the endpoint listening at `claim.addr` made `claim` to this
/// endpoint, which the claimant reached at `reached`. `Ok(())` if it did;
/// `Access` if it says no, or if nothing answering as a Weft endpoint is
/// there; `Again` when no turn to verify came within the handshake timeout.
pub async fn confirm(ep: &Arc<EpShared>, claim: &Claim, reached: SocketAddr) -> Result<()> {
    if claim.addr == ep.local {
        // A claim to be ourselves: our own table says.
        return match ep.made_claim(&claim.nonce, reached) {
            true => Ok(()),
            false => Err(Error::Access),
        };
    }
    let t = ep.limits.handshake_timeout;
    let _turn = match tokio::time::timeout(t, ep.verify_turns.acquire()).await {
        Ok(Ok(turn)) => turn,
        _ => return Err(Error::Again),
    };
    let ask = Claim {
        addr: reached,
        nonce: claim.nonce,
    };
    let answer = async {
        let s = tokio::time::timeout(t, TcpStream::connect(claim.addr))
            .await
            .map_err(|_| Error::TimedOut)??;
        // The claimed endpoint speaks what this one does: TLS first if
        // this endpoint runs it.
        let mut s = match &ep.tls {
            Some(ctx) => crate::tls::connect(s, ctx, claim.addr, t).await?,
            None => HsStream::Plain(s),
        };
        write_frame(&mut s, Header::new(FrameKind::Verify), &ask.encode(), t).await?;
        let (h, _) = read_frame(&mut s, FrameKind::VerifyAck, t).await?;
        Ok::<u64, Error>(h.data)
    }
    .await;
    match answer {
        Ok(0) => Ok(()),
        // Refused, or whatever is there does not speak for the claim.
        Ok(_) | Err(_) => Err(Error::Access),
    }
}

/// Answers a `Verify` (the first frame of `s`, payload `payload`): yes if
/// this endpoint made the claim to the asker.
pub async fn answer(ep: &EpShared, mut s: HsStream, payload: &[u8]) -> Result<()> {
    let t = ep.limits.handshake_timeout;
    let mut ack = Header::new(FrameKind::VerifyAck);
    let yes = Claim::decode(payload).is_ok_and(|c| ep.made_claim(&c.nonce, c.addr));
    if !yes {
        ack.data = Error::Access.code() as u64;
    }
    write_frame(&mut s, ack, &[], t).await
}
