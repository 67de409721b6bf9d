//! Authorization keys over rdma_cm: proof that both ends of a verbs RC
//! connection hold the same key, carried in connect-request and
//! rejection private data (`docs/wire.md` §13.2, `docs/design.md`
//! "Authorization keys").
//!
//! rdma_cm gives a connector one message to the acceptor before the
//! connection exists (the request, 56 bytes of private data) and the
//! acceptor one answer (accept or reject). A proof in which the acceptor
//! proves first needs two of each, so a keyed connect is two requests:
//!
//! 1. The connector sends [`payload::OPEN`]: a fresh nonce `Nc`, the
//!    key selector (HMAC under the key over `Nc`; `weft_core::auth`) and
//!    the key's identifier ([`key_id`]).
//! 2. An acceptor holding that key (found by its identifier, then checked
//!    by its selector) picks a fresh nonce `Na`, remembers
//!    the challenge ([`challenges`]), and rejects the request with
//!    [`payload::CHALLENGE`]: `Na` and its MAC over the transcript.
//!    Any other acceptor rejects with [`payload::REFUSED`].
//! 3. The connector checks that MAC before proving anything. If it holds,
//!    it connects again with [`payload::PROOF`]: the challenge's handle,
//!    its own MAC (short: 16 bytes, for room) over the transcript and the
//!    request's data (MSG CM data, RDM hello), and that data. If not, it
//!    sends [`payload::NOTICE`] so that the acceptor hears of the failure.
//! 4. The acceptor takes the challenge out of its table (each is good
//!    once), checks the MAC in constant time, and only then treats the
//!    request as any other (an `FI_CONNREQ`, the RDM hello checks).
//!
//! The transcript is `weft_core::auth::Transcript` with the connector's
//! IP address (port 0: each request goes out on a new rdma_cm id, with a
//! new port) and the address the connector dialled (the acceptor's
//! listening address, which rdma_cm gives the acceptor as the request's
//! local address), followed by [`LABEL`] so that no MAC made here is
//! valid on tcp or the other way round.
//!
//! Nothing here touches rdma_cm: [`Dialer`] and [`Gate`] turn private
//! data into private data and verdicts, so every path is unit-tested
//! without a device; `dial` runs the connector's rounds on rdma_cm ids.

mod challenges;
#[cfg(feature = "rdma")]
pub(crate) mod dial;
pub(crate) mod payload;

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft_core::auth::{AuthKey, ConnKind, Role, Transcript, SHORT_MAC_LEN};
use weft_core::hash::{fast_map, FastMap};
use weft_core::sync::lock;
use weft_core::wire::claim::{fresh_nonce, Nonce};
use weft_core::{Error, Result};

use challenges::{Challenges, Pending};
use payload::{handle_of, CmAuth, Handle, KeyId, KEY_ID_LEN};

/// Follows the transcript in every MAC made over rdma_cm, so that these
/// MACs are never valid on another channel.
pub(crate) const LABEL: &[u8] = b"weft-verbs-cm-1";

/// Most challenges an acceptor keeps open at once: handshakes in the
/// middle of their two requests. A burst of connectors beyond it costs
/// the oldest their challenge (their proof is refused), not memory.
pub(crate) const MAX_CHALLENGES: usize = 1024;

/// What a key identifier is the MAC of (under the key): a label of its
/// own, so that it is no other MAC made with the key.
const KEY_ID_LABEL: &[u8] = b"weft-verbs-key-id-1";

/// The identifier of `key` that openings carry: the first
/// [`KEY_ID_LEN`] bytes of HMAC-SHA256 under the key over
/// [`KEY_ID_LABEL`]. One-way, so it does not give the key away; the same
/// in every opening, so an acceptor holding many keys finds the one a
/// connector names by lookup instead of trying each. What it reveals:
/// anyone who sees openings can tell which of them prove the same key,
/// and can check a guess of the key offline (as the selector already
/// lets them); nothing about the key's bytes beyond that.
pub(crate) fn key_id(key: &AuthKey) -> Result<KeyId> {
    let full = key.prove_bytes(KEY_ID_LABEL)?;
    let mut id = [0u8; KEY_ID_LEN];
    id.copy_from_slice(full.get(..KEY_ID_LEN).ok_or(Error::Inval)?);
    Ok(id)
}

/// Draws of a fresh acceptor nonce before giving up on a handle that is
/// free (a clash of 64 random bits with an open challenge).
const NONCE_DRAWS: usize = 4;

fn transcript(
    kind: ConnKind,
    connector_nonce: Nonce,
    acceptor_nonce: Nonce,
    connector: IpAddr,
    acceptor: SocketAddr,
) -> Transcript {
    Transcript {
        kind,
        connector_nonce,
        acceptor_nonce,
        connector: SocketAddr::new(connector, 0),
        acceptor,
    }
}

/// What the connector's MAC covers after the transcript: the label, then
/// the request's data with its length.
fn connector_extra(data: &[u8]) -> Result<Vec<u8>> {
    let mut v = LABEL.to_vec();
    v.extend_from_slice(&payload::covered(data)?);
    Ok(v)
}

/// The connector's side of one keyed connect.
#[derive(Debug)]
pub(crate) struct Dialer {
    key: AuthKey,
    kind: ConnKind,
    nonce: Nonce,
}

/// What a connector does once its opening request was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Connect again with this private data (a proof).
    Prove(Vec<u8>),
    /// The challenge proved nothing: send this notice, then fail with
    /// `KeyRejected`.
    Refuse(Vec<u8>),
    /// Fail with this error.
    Fail(Error),
}

impl Dialer {
    /// A connect proving `key`, for a connection of `kind`, with a fresh
    /// nonce.
    pub(crate) fn new(key: AuthKey, kind: ConnKind) -> Result<Dialer> {
        Ok(Dialer {
            key,
            kind,
            nonce: fresh_nonce()?,
        })
    }

    /// The private data of the opening request.
    pub(crate) fn opening(&self) -> Result<Vec<u8>> {
        Ok(payload::open(
            &self.nonce,
            &self.key.selector(&self.nonce)?,
            &key_id(&self.key)?,
        ))
    }

    /// The next step after the opening request was rejected with `err`
    /// and private data `rejected`. `me`: this side's IP address as the
    /// request left it; `dest`: the address dialled; `data`: what the
    /// proof is to carry (and its MAC to cover).
    ///
    /// A challenge whose MAC holds gets a proof; one whose MAC does not
    /// (another key, a forgery, a challenge for another attempt) gets a
    /// notice and nothing proven. A refusal is `KeyRejected`, as is a
    /// keyed form cut short; any other rejection (no listener, a
    /// foreign program) is `err`.
    pub(crate) fn answer(
        &self,
        err: Error,
        rejected: &[u8],
        me: IpAddr,
        dest: SocketAddr,
        data: &[u8],
    ) -> Answer {
        let (na, mac) = match payload::decode(rejected) {
            Ok(CmAuth::Challenge { nonce, mac }) => (nonce, mac),
            Ok(CmAuth::Plain) => return Answer::Fail(err),
            Ok(_) | Err(_) => return Answer::Fail(Error::KeyRejected),
        };
        let h = handle_of(&na);
        let t = transcript(self.kind, self.nonce, na, me, dest);
        if self
            .key
            .verify_with(&t, Role::Acceptor, LABEL, &mac)
            .is_err()
        {
            return Answer::Refuse(payload::notice(&h));
        }
        let made = connector_extra(data)
            .and_then(|extra| self.key.prove_with(&t, Role::Connector, &extra))
            .and_then(|full| {
                let mut short = [0u8; SHORT_MAC_LEN];
                short.copy_from_slice(&full[..SHORT_MAC_LEN]);
                payload::proof(&h, &short, data)
            });
        match made {
            Ok(p) => Answer::Prove(p),
            Err(e) => Answer::Fail(e),
        }
    }
}

/// An acceptor's side: its keys (none for an unkeyed acceptor) and its
/// open challenges.
#[derive(Debug)]
pub(crate) struct Gate {
    keys: Vec<AuthKey>,
    /// Indices into `keys` by identifier; several for keys with the same
    /// bytes (an AV may hold one key under two handles).
    by_id: FastMap<KeyId, Vec<usize>>,
    kind: ConnKind,
    table: Mutex<Challenges>,
}

/// What to do with a connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// An unkeyed acceptor's plain request: read its private data as
    /// before.
    Plain,
    /// A request that proved a key: the data its MAC covered (MSG CM
    /// data, RDM keyed hello), and which of the gate's keys it proved
    /// (an index into the keys it was made with).
    Proven(Vec<u8>, usize),
    /// Reject it with this private data. `report`: the refusal to report
    /// with the requester's address; `None` for a challenge, the
    /// protocol's normal first answer.
    Reject {
        data: Vec<u8>,
        report: Option<Error>,
    },
}

fn refuse() -> Verdict {
    Verdict::Reject {
        data: payload::refused(),
        report: Some(Error::KeyRejected),
    }
}

impl Gate {
    /// An acceptor holding `key` (or none) for connections of `kind`,
    /// whose challenges stay open for `ttl` (the handshake timeout).
    pub(crate) fn new(key: Option<AuthKey>, kind: ConnKind, ttl: Duration) -> Result<Gate> {
        Gate::with_keys(key.into_iter().collect(), kind, ttl)
    }

    /// An acceptor taking a connector that proves any of `keys` (none:
    /// an unkeyed acceptor); a proof's verdict says which.
    pub(crate) fn with_keys(keys: Vec<AuthKey>, kind: ConnKind, ttl: Duration) -> Result<Gate> {
        let mut by_id: FastMap<KeyId, Vec<usize>> = fast_map();
        for (i, k) in keys.iter().enumerate() {
            by_id.entry(key_id(k)?).or_default().push(i);
        }
        Ok(Gate {
            keys,
            by_id,
            kind,
            table: Mutex::new(Challenges::new(MAX_CHALLENGES, ttl)),
        })
    }

    /// The key of index `i` (as a [`Verdict::Proven`] names it).
    pub(crate) fn proven(&self, i: usize) -> Option<&AuthKey> {
        self.keys.get(i)
    }

    /// The held key whose identifier is `id` and whose selector for `nc`
    /// is `sel`: one lookup and a selector check per key with that
    /// identifier (one, but for keys held twice), never a trial of all.
    fn named(&self, id: &KeyId, nc: &Nonce, sel: &[u8]) -> Option<usize> {
        self.by_id
            .get(id)?
            .iter()
            .copied()
            .find(|&i| self.keys.get(i).is_some_and(|k| k.selects(nc, sel)))
    }

    /// Challenges open now (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        lock(&self.table).len()
    }

    /// The verdict on a request with private data `pd` from `from` (the
    /// requester's IP address, as rdma_cm reports it), received on
    /// `local` (the listening address the requester dialled) at `now`.
    ///
    /// An unkeyed acceptor takes plain requests and refuses keyed ones;
    /// a keyed acceptor refuses plain requests, challenges an opening
    /// whose identifier and selector name one of its keys (under that
    /// key), and takes a proof only for an open challenge, from the
    /// address that opened it, whose MAC holds under the challenge's key.
    pub(crate) fn on_request(
        &self,
        pd: &[u8],
        from: Option<IpAddr>,
        local: SocketAddr,
        now: Instant,
    ) -> Verdict {
        let parsed = payload::decode(pd);
        if self.keys.is_empty() {
            return match parsed {
                Ok(CmAuth::Plain) => Verdict::Plain,
                _ => refuse(),
            };
        }
        let Some(from) = from else {
            // Nothing to bind the transcript to.
            return refuse();
        };
        match parsed {
            Ok(CmAuth::Open {
                nonce,
                selector,
                key_id,
            }) => match self.named(&key_id, &nonce, &selector) {
                Some(k) => self
                    .challenge(k, nonce, from, local, now)
                    .unwrap_or_else(|_| refuse()),
                None => refuse(),
            },
            Ok(CmAuth::Proof { handle, mac, data }) => {
                self.check(&handle, &mac, data, from, local, now)
            }
            Ok(CmAuth::Notice { handle }) => {
                // The connector refused our challenge: it is spent.
                lock(&self.table).take(&handle, now);
                refuse()
            }
            _ => refuse(),
        }
    }

    /// Issues a challenge under key `k` to connector nonce `nc` from
    /// `from`.
    fn challenge(
        &self,
        k: usize,
        nc: Nonce,
        from: IpAddr,
        local: SocketAddr,
        now: Instant,
    ) -> Result<Verdict> {
        let key = self.keys.get(k).ok_or(Error::Inval)?;
        for _ in 0..NONCE_DRAWS {
            let na = fresh_nonce()?;
            let t = transcript(self.kind, nc, na, from, local);
            let mac = key.prove_with(&t, Role::Acceptor, LABEL)?;
            let pending = Pending {
                connector_nonce: nc,
                acceptor_nonce: na,
                from,
                key: k,
            };
            if lock(&self.table).insert(handle_of(&na), pending, now) {
                return Ok(Verdict::Reject {
                    data: payload::challenge(&na, &mac),
                    report: None,
                });
            }
        }
        Err(Error::Again)
    }

    /// Checks a proof for challenge `h`, under the key the challenge was
    /// made with.
    fn check(
        &self,
        h: &Handle,
        mac: &[u8],
        data: &[u8],
        from: IpAddr,
        local: SocketAddr,
        now: Instant,
    ) -> Verdict {
        let Some(p) = lock(&self.table).take(h, now) else {
            return refuse();
        };
        let Some(key) = self.keys.get(p.key).filter(|_| p.from == from) else {
            return refuse();
        };
        let t = transcript(self.kind, p.connector_nonce, p.acceptor_nonce, from, local);
        let ok = connector_extra(data)
            .and_then(|extra| key.verify_short_with(&t, Role::Connector, &extra, mac));
        match ok {
            Ok(()) => Verdict::Proven(data.to_vec(), p.key),
            Err(_) => refuse(),
        }
    }
}

#[cfg(test)]
mod tests;
