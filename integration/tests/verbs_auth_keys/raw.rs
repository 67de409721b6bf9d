//! Raw rdma_cm peers (`weft_verbs::sys`), for what a Weft endpoint would
//! never send: forged, reflected, replayed and cut-short proofs against
//! keyed listeners, and forged challenges and unchallenged accepts
//! against keyed connectors. Built with the `verbs` feature only.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use weft_core::auth::{AuthKey, ConnKind, Role, Transcript, MAC_LEN, SHORT_MAC_LEN};
use weft_core::wire::claim::fresh_nonce;
use weft_verbs::sys::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};

/// The layouts of `docs/wire.md` §13.2, written out here from the text
/// rather than taken from the provider.
pub const OPEN: u8 = 0xA1;
pub const CHALLENGE: u8 = 0xA2;
pub const PROOF: u8 = 0xA3;
pub const REFUSED: u8 = 0xA4;
pub const NOTICE: u8 = 0xA5;
pub const LABEL: &[u8] = b"weft-verbs-cm-1";
pub const KEY_ID_LABEL: &[u8] = b"weft-verbs-key-id-1";

/// The identifier an opening names `key` by.
pub fn key_id(key: &[u8]) -> Vec<u8> {
    AuthKey::new(key)
        .unwrap()
        .prove_bytes(KEY_ID_LABEL)
        .unwrap()[..8]
        .to_vec()
}

/// Queue pair numbers rxe never hands out (its numbers stay far
/// below), one per request: a QP-less request naming the number of a
/// live connection from the same device would make the passive side's
/// CM disconnect that one as stale.
pub fn fake_qpn() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0x00F0_0000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub async fn next_event(ch: &Arc<EventChannel>) -> CmEvent {
    let deadline = Instant::now() + T;
    loop {
        if let Some(ev) = ch.get_event().unwrap() {
            return ev;
        }
        assert!(Instant::now() < deadline, "no rdma_cm event in {T:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A raw requester's id, resolved from `src` to `dest`.
pub struct Raw {
    pub id: CmId,
    pub ch: Arc<EventChannel>,
}

impl Raw {
    pub async fn resolved(src: IpAddr, dest: SocketAddr) -> Raw {
        let ch = EventChannel::new().unwrap();
        let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
        id.resolve_addr(Some(SocketAddr::new(src, 0)), dest, 2000)
            .unwrap();
        assert_eq!(next_event(&ch).await.kind, CmEventKind::AddrResolved);
        id.resolve_route(2000).unwrap();
        assert_eq!(next_event(&ch).await.kind, CmEventKind::RouteResolved);
        Raw { id, ch }
    }

    /// Sends a request with private data `pd`; the answer.
    pub async fn ask(&self, pd: &[u8]) -> CmEvent {
        self.id
            .connect(&ConnParam::new(pd).with_qp_num(fake_qpn()))
            .unwrap();
        next_event(&self.ch).await
    }
}

/// One request from `src` to `dest` on a fresh id: the answer.
pub async fn request(src: IpAddr, dest: SocketAddr, pd: &[u8]) -> CmEvent {
    Raw::resolved(src, dest).await.ask(pd).await
}

pub fn transcript(
    kind: ConnKind,
    nc: [u8; 16],
    na: [u8; 16],
    me: IpAddr,
    dest: SocketAddr,
) -> Transcript {
    Transcript {
        kind,
        connector_nonce: nc,
        acceptor_nonce: na,
        connector: SocketAddr::new(me, 0),
        acceptor: dest,
    }
}

pub fn opening(key: &[u8], nc: &[u8; 16]) -> Vec<u8> {
    let mut v = vec![OPEN];
    v.extend_from_slice(nc);
    v.extend_from_slice(&AuthKey::new(key).unwrap().selector(nc).unwrap());
    v.extend_from_slice(&key_id(key));
    v
}

pub fn proof(handle: &[u8], mac: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = vec![PROOF];
    v.extend_from_slice(handle);
    v.extend_from_slice(mac);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    v
}

/// The connector's short MAC over `t` and `data`.
pub fn connector_mac(key: &[u8], t: &Transcript, data: &[u8]) -> Vec<u8> {
    let mut extra = LABEL.to_vec();
    extra.push(data.len() as u8);
    extra.extend_from_slice(data);
    let full = AuthKey::new(key)
        .unwrap()
        .prove_with(t, Role::Connector, &extra)
        .unwrap();
    full[..SHORT_MAC_LEN].to_vec()
}

/// An opening with JOB_A's selector from `src` to `dest`: the
/// challenge's acceptor nonce, checked against the key the way a
/// connector checks it, and the transcript.
pub async fn challenged(kind: ConnKind, src: IpAddr, dest: SocketAddr) -> ([u8; 16], Transcript) {
    let nc = fresh_nonce().unwrap();
    let ev = request(src, dest, &opening(JOB_A, &nc)).await;
    assert_eq!(ev.kind, CmEventKind::Rejected, "{ev:?}");
    let pd = &ev.private_data;
    assert_eq!(pd[0], CHALLENGE, "a challenge: {pd:?}");
    let na: [u8; 16] = pd[1..17].try_into().unwrap();
    let mac = &pd[17..17 + MAC_LEN];
    let t = transcript(kind, nc, na, src, dest);
    AuthKey::new(JOB_A)
        .unwrap()
        .verify_with(&t, Role::Acceptor, LABEL, mac)
        .expect("the acceptor's MAC is the key's over the transcript");
    (na, t)
}

/// The next connection request on a raw listener's channel (the
/// events of ids it answered before are passed over).
pub async fn next_request(ch: &Arc<EventChannel>) -> CmEvent {
    loop {
        let ev = next_event(ch).await;
        if ev.kind == CmEventKind::ConnectRequest {
            return ev;
        }
    }
}

pub fn is_refusal(ev: &CmEvent) -> bool {
    ev.kind == CmEventKind::Rejected && ev.private_data.first() == Some(&REFUSED)
}

pub fn random_mac() -> Vec<u8> {
    fresh_nonce().unwrap().to_vec()
}

/// A raw listener on `ip`: its id (bound, listening) and channel.
pub fn listen(ip: IpAddr) -> (CmId, Arc<EventChannel>, SocketAddr) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    id.listen(8).unwrap();
    let addr = id.local_addr().unwrap();
    (id, ch, addr)
}

pub fn challenge_bytes(na: &[u8; 16], mac: &[u8]) -> Vec<u8> {
    let mut v = vec![CHALLENGE];
    v.extend_from_slice(na);
    v.extend_from_slice(mac);
    v
}

/// The body of `forged_reflected_and_replayed_proofs_are_refused_without_harm`.
pub async fn proofs() {
    let client_ip = ip_of(&info(CLIENT_DEV, EpType::Msg, None).src_addr.unwrap());
    let l = listener(Some(JOB_A));
    let victim = Rdm::open(SERVER_DEV, Some(JOB_A));
    let friend = Rdm::open(CLIENT_DEV, Some(JOB_A));
    let msg_dest = weft::decode_sockaddr(&l.addr).unwrap();
    let rdm_dest = weft::decode_sockaddr(&victim.addr()).unwrap();

    for (kind, dest, eq) in [
        (ConnKind::Msg, msg_dest, &l.eq),
        (ConnKind::Rdm, rdm_dest, &victim.eq),
    ] {
        // Whatever the proof carries must be what the victim reads: an RDM
        // keyed hello (port, incarnation), or CM data.
        let data: Vec<u8> = match kind {
            ConnKind::Rdm => {
                let mut d = 4791u16.to_le_bytes().to_vec();
                d.extend_from_slice(&7u64.to_le_bytes());
                d
            }
            ConnKind::Msg => b"raw cm".to_vec(),
        };
        let refused = |ev: &weft_verbs::sys::CmEvent, what: &str| {
            assert!(is_refusal(ev), "{what}: {ev:?}");
        };

        // Forged: a MAC made without the key.
        let (na, _) = challenged(kind, client_ip, dest).await;
        let ev = request(client_ip, dest, &proof(&na[..8], &random_mac(), &data)).await;
        refused(&ev, "a forged proof");
        reported(eq, Error::KeyRejected, client_ip).await;

        // Reflected: the acceptor's own MAC, cut to size.
        let (na, t) = challenged(kind, client_ip, dest).await;
        let amac = AuthKey::new(JOB_A)
            .unwrap()
            .prove_with(&t, Role::Acceptor, LABEL)
            .unwrap();
        let ev = request(client_ip, dest, &proof(&na[..8], &amac[..16], &data)).await;
        refused(&ev, "a reflected MAC");
        reported(eq, Error::KeyRejected, client_ip).await;

        // Good: accepted once ...
        let (na, t) = challenged(kind, client_ip, dest).await;
        let good = proof(&na[..8], &connector_mac(JOB_A, &t, &data), &data);
        match kind {
            ConnKind::Msg => {
                // The listener reports the request; the application turns
                // it down, and the raw requester hears that.
                let app = async {
                    let ev = within("FI_CONNREQ", l.eq.next_timeout(T))
                        .await
                        .unwrap()
                        .unwrap();
                    assert_eq!(ev.kind, EqEventKind::ConnReq);
                    assert_eq!(ev.cm_data, data);
                    let req = ConnRequest::from_event(&ev).unwrap();
                    l.pep.reject(&req, b"no".to_vec()).unwrap();
                };
                let (ev, ()) = tokio::join!(request(client_ip, dest, &good), app);
                assert_eq!(ev.kind, CmEventKind::Rejected);
                assert_eq!(
                    ev.private_data[..3],
                    [2, b'n', b'o'],
                    "the application's reject"
                );
            }
            ConnKind::Rdm => {
                // The victim accepted (a QP-less requester sees the
                // response); dropping the id walks away from it.
                let ev = request(client_ip, dest, &good).await;
                assert_eq!(ev.kind, CmEventKind::ConnectResponse, "{ev:?}");
            }
        }
        // ... and replayed, refused: the challenge is spent.
        let ev = request(client_ip, dest, &good).await;
        refused(&ev, "a replayed proof");
        reported(eq, Error::KeyRejected, client_ip).await;

        // Tampered data under a good MAC.
        let (na, t) = challenged(kind, client_ip, dest).await;
        let mac = connector_mac(JOB_A, &t, &data);
        let mut other = data.clone();
        other[0] ^= 1;
        let ev = request(client_ip, dest, &proof(&na[..8], &mac, &other)).await;
        refused(&ev, "tampered data");
        reported(eq, Error::KeyRejected, client_ip).await;

        // A data length beyond what a request can hold.
        let (na, t) = challenged(kind, client_ip, dest).await;
        let mut long = proof(&na[..8], &connector_mac(JOB_A, &t, &data), &data);
        long[25] = 31;
        let ev = request(client_ip, dest, &long).await;
        refused(&ev, "a data length overrunning the request");
        reported(eq, Error::KeyRejected, client_ip).await;

        // A handle never issued.
        let ev = request(client_ip, dest, &proof(&[9; 8], &random_mac(), &data)).await;
        refused(&ev, "an unknown handle");
        reported(eq, Error::KeyRejected, client_ip).await;

        // A notice spends the challenge and is reported.
        let (na, t) = challenged(kind, client_ip, dest).await;
        let mut notice = vec![NOTICE];
        notice.extend_from_slice(&na[..8]);
        let ev = request(client_ip, dest, &notice).await;
        refused(&ev, "a notice");
        reported(eq, Error::KeyRejected, client_ip).await;
        let late = proof(&na[..8], &connector_mac(JOB_A, &t, &data), &data);
        refused(
            &request(client_ip, dest, &late).await,
            "a proof after a notice",
        );
        reported(eq, Error::KeyRejected, client_ip).await;

        // Another key's opening: refused before any challenge.
        let nc = fresh_nonce().unwrap();
        refused(
            &request(client_ip, dest, &opening(JOB_B, &nc)).await,
            "another key",
        );
        reported(eq, Error::KeyRejected, client_ip).await;

        // A plain request (as an unkeyed Weft peer sends it).
        refused(
            &request(client_ip, dest, &[2, b'h', b'i']).await,
            "a plain request",
        );
        reported(eq, Error::KeyRejected, client_ip).await;
    }
    assert!(l.eq.is_empty(), "nothing else reported");

    // The victims kept serving their own job.
    exchange(&friend, &victim, 2).await;
    exchange(&victim, &friend, 2).await;
    msg_connects(&l, Some(JOB_A), b"after").await;
}

/// The body of `a_connector_refuses_forged_challenges_and_unchallenged_accepts`.
pub async fn acceptor() {
    let server_ip = ip_of(&info(SERVER_DEV, EpType::Msg, None).src_addr.unwrap());
    let (_lid, ch, addr) = listen(server_ip);
    let raw_addr = weft::encode_sockaddr(&addr);

    // A forged challenge.
    let c = msg_ep(CLIENT_DEV, None, Some(JOB_A), None);
    let c2 = c.ep.clone();
    let dest = raw_addr.clone();
    let connecting = tokio::spawn(async move { c2.connect(dest, b"secret".to_vec()).await });
    let mut ev = next_request(&ch).await;
    assert_eq!(ev.private_data[0], OPEN);
    assert_eq!(&ev.private_data[33..41], &key_id(JOB_A)[..]);
    assert!(
        ev.private_data[41..].iter().all(|&b| b == 0),
        "only nonce, selector and key identifier: {:?}",
        ev.private_data
    );
    let na = fresh_nonce().unwrap();
    let id = ev.new_id.take().unwrap();
    id.reject(&challenge_bytes(&na, &[0x42; 32])).unwrap();
    drop(id);
    let mut ev = next_request(&ch).await;
    assert_eq!(
        ev.private_data[0], NOTICE,
        "a notice, no proof: {:?}",
        ev.private_data
    );
    assert_eq!(&ev.private_data[1..9], &na[..8]);
    let id = ev.new_id.take().unwrap();
    id.reject(&[REFUSED]).unwrap();
    drop(id);
    let r = within("the refused connect", connecting).await.unwrap();
    assert_eq!(r.err(), Some(Error::KeyRejected));
    let e = within("the client's report", c.eq.next_timeout(T))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.err, Error::KeyRejected);

    // An accept without a challenge.
    let c = msg_ep(CLIENT_DEV, None, Some(JOB_A), None);
    let c2 = c.ep.clone();
    let dest = raw_addr.clone();
    let connecting = tokio::spawn(async move { c2.connect(dest, Vec::new()).await });
    let mut ev = next_request(&ch).await;
    let id = ev.new_id.take().unwrap();
    id.accept(&ConnParam::new(&[]).with_qp_num(fake_qpn()))
        .unwrap();
    let r = within("the unchallenged connect", connecting)
        .await
        .unwrap();
    assert_eq!(r.err(), Some(Error::KeyRejected));
    drop(id);

    // A keyed RDM endpoint's send to the raw listener fails the same way.
    let ep = Rdm::open(CLIENT_DEV, Some(JOB_A));
    let dest = ep
        .av
        .insert_sync(std::slice::from_ref(&raw_addr), Default::default())
        .unwrap()
        .fi_addrs[0];
    let sending = ep.ep.tsend(dest, Bytes::from_static(b"secret"), 1);
    let answer = async {
        let mut ev = next_request(&ch).await;
        assert_eq!(ev.private_data[0], OPEN);
        let id = ev.new_id.take().unwrap();
        id.reject(&challenge_bytes(&fresh_nonce().unwrap(), &[0x42; 32]))
            .unwrap();
        drop(id);
        let mut ev = next_request(&ch).await;
        assert_eq!(ev.private_data[0], NOTICE);
        let id = ev.new_id.take().unwrap();
        id.reject(&[REFUSED]).unwrap();
    };
    let (sent, ()) = within("the refused send", async { tokio::join!(sending, answer) }).await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    assert_eq!(reported(&ep.eq, Error::KeyRejected, server_ip).await, addr);
}
