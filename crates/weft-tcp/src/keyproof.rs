//! Proof of a shared authorization key at connection set-up
//! (`docs/wire.md` §8.6 and §10.1).
//!
//! A connector with a key opens with `KeyedHello` (RDM) or `KeyedConnReq`
//! (MSG), carrying its nonce. A keyed acceptor answers `KeyChallenge`: its
//! own nonce and its MAC over the transcript. The connector checks that
//! MAC before proving anything itself, then answers `KeyProof` with its
//! MAC, or with a refusal. Only then does the acceptor go on (RDM: the
//! identity check; MSG: the `FI_CONNREQ` event).
//!
//! A keyed endpoint and an unkeyed one refuse each other: the opening
//! frame says whether the connector holds a key, and the acceptor refuses
//! the mismatch; a keyed connector refuses an acceptor that does not
//! challenge it. Every failure is `KeyRejected` to both sides, whatever
//! its cause (another key, no key, a forged, replayed or truncated
//! frame), so a peer learns nothing but the refusal; only a handshake
//! that runs out of time is `TimedOut`.

use std::net::SocketAddr;
use std::time::Duration;

use weft_core::auth::{AuthKey, ConnKind, Role, Selector, Transcript};
use weft_core::wire::auth::{decode_conn_req, decode_proof, Challenge};
use weft_core::wire::claim::{fresh_nonce, Nonce};
use weft_core::wire::{FrameKind, Header};
use weft_core::{Error, Result};

use crate::frame::{read_frame, read_frame_of, write_frame};
use crate::keys::{ConnAuth, EpKeys};
use crate::tls::HsStream;

/// What a failed proof is called: `TimedOut` if time ran out, else
/// `KeyRejected` (a peer that closed, sent garbage or the wrong MAC has
/// not proven the key either way).
fn refusal(e: Error) -> Error {
    match e {
        Error::TimedOut => Error::TimedOut,
        _ => Error::KeyRejected,
    }
}

/// Acceptor: whether the connector may go on, and what the connection
/// proves. `opening` is the connector's nonce and key selector if its
/// opening frame was the keyed kind, `None` if it was not; `connector`
/// its address for the transcript. A selector naming no key this
/// endpoint holds, a keyed connector of an unkeyed endpoint and the
/// reverse are refused before anything is proven. Otherwise sends
/// `KeyChallenge` and checks the `KeyProof`.
pub async fn accept(
    s: &mut HsStream,
    keys: &EpKeys,
    opening: Option<(Nonce, Selector)>,
    kind: ConnKind,
    connector: SocketAddr,
    t: Duration,
) -> Result<ConnAuth> {
    let Some((nonce, sel)) = opening else {
        return if keys.keyed() {
            Err(Error::KeyRejected)
        } else {
            Ok(ConnAuth::default())
        };
    };
    let auth = keys.for_selector(&nonce, &sel).ok_or(Error::KeyRejected)?;
    let key = auth.key.as_ref().ok_or(Error::KeyRejected)?;
    prove(s, key, kind, nonce, connector, t)
        .await
        .map_err(refusal)?;
    Ok(auth)
}

/// The acceptor's half of the proof with `key`.
async fn prove(
    s: &mut HsStream,
    key: &AuthKey,
    kind: ConnKind,
    nonce: Nonce,
    connector: SocketAddr,
    t: Duration,
) -> Result<()> {
    let tr = Transcript {
        kind,
        connector_nonce: nonce,
        acceptor_nonce: fresh_nonce()?,
        connector,
        acceptor: s.local_addr()?,
    };
    let challenge = Challenge {
        nonce: tr.acceptor_nonce,
        mac: key.prove(&tr, Role::Acceptor)?,
    };
    write_frame(
        s,
        Header::new(FrameKind::KeyChallenge),
        &challenge.encode(),
        t,
    )
    .await?;
    let (h, p) = read_frame(s, FrameKind::KeyProof, t).await?;
    key.verify(&tr, Role::Connector, &decode_proof(h.data, &p)?)
}

/// Acceptor of MSG connections: the CM data of a `ConnReq` or
/// `KeyedConnReq` (`opening`, `payload`) and what the connection proved,
/// once the key proof, if any, succeeded. `peer` is the connector's end of the stream.
pub async fn accept_msg(
    s: &mut HsStream,
    keys: &EpKeys,
    opening: &Header,
    payload: Vec<u8>,
    peer: SocketAddr,
    t: Duration,
) -> Result<(Vec<u8>, ConnAuth)> {
    if opening.kind != Some(FrameKind::KeyedConnReq) {
        let auth = accept(s, keys, None, ConnKind::Msg, peer, t).await?;
        return Ok((payload, auth));
    }
    let (nonce, sel, cm) = decode_conn_req(&payload)?;
    let auth = accept(s, keys, Some((nonce, sel)), ConnKind::Msg, peer, t).await?;
    Ok((cm.to_vec(), auth))
}

/// Connector: after sending the keyed opening frame with `nonce`, checks
/// the acceptor's `KeyChallenge` and answers `KeyProof`. `answer` is the
/// frame an acceptor refuses with (`HelloAck`, `ConnResp`): its status
/// is the error; `connector` and `dialled` the transcript's addresses.
#[allow(clippy::too_many_arguments)]
pub async fn connect(
    s: &mut HsStream,
    key: &AuthKey,
    kind: ConnKind,
    nonce: Nonce,
    connector: SocketAddr,
    dialled: SocketAddr,
    answer: FrameKind,
    t: Duration,
) -> Result<()> {
    let (h, p) = read_frame_of(s, &[FrameKind::KeyChallenge, answer], t)
        .await
        .map_err(refusal)?;
    if h.kind == Some(answer) {
        // An acceptor that answers without challenging has proven
        // nothing, even if it says yes.
        return Err(
            match i32::try_from(h.data).ok().and_then(Error::from_code) {
                Some(e) => e,
                None => Error::KeyRejected,
            },
        );
    }
    let checked = Challenge::decode(&p).and_then(|c| {
        let tr = Transcript {
            kind,
            connector_nonce: nonce,
            acceptor_nonce: c.nonce,
            connector,
            acceptor: dialled,
        };
        key.verify(&tr, Role::Acceptor, &c.mac)?;
        key.prove(&tr, Role::Connector)
    });
    match checked {
        Ok(mac) => write_frame(s, Header::new(FrameKind::KeyProof), &mac, t)
            .await
            .map_err(refusal),
        Err(e) => {
            let mut no = Header::new(FrameKind::KeyProof);
            no.data = Error::KeyRejected.code() as u64;
            let _ = write_frame(s, no, &[], t).await;
            Err(refusal(e))
        }
    }
}
