#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weft_core::wire::{FrameKind, Header};

use super::*;
use crate::frame::{read_frame, read_frame_of, write_frame};

const T: Duration = Duration::from_secs(5);

/// A throw-away directory of PEM files, removed when dropped.
pub struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Pki {
    pub fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weft-tcp-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A CA (`<ca>.pem`) and one leaf it signed (`<ca>-leaf.pem`, its key
    /// `<ca>-leaf.key`): the files an endpoint of that CA runs with.
    pub fn issue(&self, ca: &str) -> TlsFiles {
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = p.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["weft".to_string()])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        TlsFiles::new(
            self.write(&format!("{ca}-leaf.pem"), &leaf.pem()),
            self.write(&format!("{ca}-leaf.key"), &key.serialize_pem()),
            self.write(&format!("{ca}.pem"), &ca_cert.pem()),
        )
    }
}

fn ctx(f: &TlsFiles) -> TlsContext {
    TlsContext::load(f).unwrap()
}

fn with(f: &TlsFiles, change: impl FnOnce(&mut TlsFiles)) -> TlsFiles {
    let mut f = f.clone();
    change(&mut f);
    f
}

fn err(f: &TlsFiles) -> Error {
    TlsContext::load(f).unwrap_err()
}

#[test]
fn a_good_configuration_loads_and_bad_ones_are_refused() {
    let pki = Pki::new();
    let a = pki.issue("a");
    let b = pki.issue("b");
    TlsContext::load(&a).unwrap();
    let missing = pki.path("missing.pem");
    assert_eq!(err(&with(&a, |f| f.cert = missing.clone())), Error::NoEnt);
    assert_eq!(err(&with(&a, |f| f.key = missing.clone())), Error::NoEnt);
    assert_eq!(err(&with(&a, |f| f.ca = missing.clone())), Error::NoEnt);
    let junk = pki.write("junk.pem", "not a certificate\n");
    let broken = pki.write(
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\n@@@@\n-----END CERTIFICATE-----\n",
    );
    for bad in [&junk, &broken] {
        assert_eq!(err(&with(&a, |f| f.cert = bad.clone())), Error::Inval);
        assert_eq!(err(&with(&a, |f| f.key = bad.clone())), Error::Inval);
        assert_eq!(err(&with(&a, |f| f.ca = bad.clone())), Error::Inval);
    }
    // A key that is not the certificate's, a certificate given as the
    // key, a key given as the CA.
    assert_eq!(err(&with(&a, |f| f.key = b.key.clone())), Error::Inval);
    assert_eq!(err(&with(&a, |f| f.key = a.cert.clone())), Error::Inval);
    assert_eq!(err(&with(&a, |f| f.ca = a.key.clone())), Error::Inval);
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

/// Connector and acceptor handshakes run at once, as two peers do.
async fn handshake(
    client: &TlsContext,
    server: &TlsContext,
) -> (Result<HsStream>, Result<HsStream>) {
    let (c, s) = pair().await;
    let dest = s.local_addr().unwrap();
    tokio::join!(connect(c, client, dest, T), accept(s, server, T))
}

#[tokio::test]
async fn frames_cross_the_session_both_ways_and_data_follows() {
    let pki = Pki::new();
    let a = ctx(&pki.issue("a"));
    let (c, s) = handshake(&a, &a).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    write_frame(&mut c, Header::new(FrameKind::ConnReq), b"cm", T)
        .await
        .unwrap();
    let (h, p) = read_frame(&mut s, FrameKind::ConnReq, T).await.unwrap();
    assert_eq!((h.kind, &p[..]), (Some(FrameKind::ConnReq), &b"cm"[..]));
    write_frame(&mut s, Header::new(FrameKind::ConnResp), b"ok", T)
        .await
        .unwrap();
    // Bytes sent right behind the handshake frame are read into the
    // session with it and must survive the hand-over to the data path.
    let (ct, cs) = c.into_parts();
    let (_st, ss) = s.into_parts();
    let (cs, ss) = (Session::new(cs.unwrap()), Session::new(ss.unwrap()));
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut f = crate::frame::TxFrame::new(
        Header::new(FrameKind::Msg),
        weft_core::provider::Iov::from_vec(vec![bytes::Bytes::from(payload.clone())]),
        None,
    );
    f.hdr.len = payload.len() as u64;
    f.enc = f.hdr.encode();
    let (ct_std, st_std) = (ct.into_std().unwrap(), _st.into_std().unwrap());
    let want = f.total_len();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 7000];
        let t0 = Instant::now();
        while got.len() < want && t0.elapsed() < T {
            match ss.read(&mut buf, &mut &st_std, &st_std) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(e) => panic!("{e}"),
            }
        }
        got
    });
    // The acceptor's ConnResp (40 + 2 bytes) is still in the connector's
    // session: the data path reads it first.
    let mut head = [0u8; 42];
    let t0 = Instant::now();
    let mut n = 0;
    while n < 42 && t0.elapsed() < T {
        match cs.read(&mut head[n..], &mut &ct_std, &ct_std) {
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(&head[40..], b"ok");
    let t0 = Instant::now();
    while !cs.write_frame(&ct_std, &mut f).unwrap() {
        assert!(t0.elapsed() < T, "writing stalled");
        std::thread::sleep(Duration::from_micros(50));
    }
    let got = reader.join().unwrap();
    assert_eq!(got.len(), want);
    assert_eq!(&got[40..], &payload[..]);
}

#[tokio::test]
async fn a_certificate_of_another_ca_is_refused_on_both_sides() {
    let pki = Pki::new();
    let (a, b) = (ctx(&pki.issue("a")), ctx(&pki.issue("b")));
    let (c, s) = handshake(&b, &a).await;
    assert_eq!(c.err(), Some(Error::KeyRejected), "connector");
    assert_eq!(s.err(), Some(Error::KeyRejected), "acceptor");
    // The connector trusts the acceptor, but not the reverse: the
    // connector learns it at its first read.
    let mixed = ctx(&with(&pki.issue("d"), |f| f.ca = pki.path("a.pem")));
    let (c, s) = handshake(&mixed, &a).await;
    assert_eq!(s.err(), Some(Error::KeyRejected), "acceptor");
    let r = async { read_frame(&mut c?, FrameKind::HelloAck, T).await }.await;
    assert_eq!(r.err(), Some(Error::KeyRejected), "connector");
}

#[tokio::test]
async fn a_plain_peer_and_a_tls_peer_tell_each_other() {
    let pki = Pki::new();
    let a = ctx(&pki.issue("a"));
    // A plain connector to a TLS acceptor gets its own refusal frame.
    let (c, s) = pair().await;
    let mut c = HsStream::Plain(c);
    let plain = async {
        write_frame(&mut c, Header::new(FrameKind::Hello), &[0; 32], T).await?;
        read_frame(&mut c, FrameKind::HelloAck, T).await
    };
    let (p, s) = tokio::join!(plain, accept(s, &a, T));
    assert_eq!(s.err(), Some(Error::NoProtoOpt));
    assert_eq!(p.unwrap().0.data, Error::NoProtoOpt.code() as u64);
    // A TLS connector to a plain acceptor gets a TLS alert.
    let (c, s) = pair().await;
    let dest = s.local_addr().unwrap();
    let mut s = HsStream::Plain(s);
    let (c, p) = tokio::join!(
        connect(c, &a, dest, T),
        read_frame_of(&mut s, &[FrameKind::Hello], T)
    );
    assert_eq!(p.err(), Some(Error::NoProtoOpt), "plain side");
    assert_eq!(c.err(), Some(Error::NoProtoOpt), "TLS side");
}

#[tokio::test]
async fn garbage_and_cut_records_end_within_the_timeout() {
    let pki = Pki::new();
    let a = ctx(&pki.issue("a"));
    let short = Duration::from_millis(300);
    // Not TLS at all.
    let (mut c, s) = pair().await;
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    assert_eq!(accept(s, &a, short).await.err(), Some(Error::NoProtoOpt));
    // A record header promising more than ever comes.
    let (mut c, s) = pair().await;
    c.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 1, 2, 3])
        .await
        .unwrap();
    let t0 = Instant::now();
    assert_eq!(accept(s, &a, short).await.err(), Some(Error::TimedOut));
    assert!(t0.elapsed() < short * 3);
    // The same, then closed.
    let (mut c, s) = pair().await;
    c.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 1, 2, 3])
        .await
        .unwrap();
    drop(c);
    assert_eq!(accept(s, &a, short).await.err(), Some(Error::ConnReset));
    // A whole record of garbage inside the handshake.
    let (mut c, s) = pair().await;
    let mut rec = vec![0x16, 0x03, 0x01, 0x00, 0x40];
    rec.extend_from_slice(&[0xee; 0x40]);
    c.write_all(&rec).await.unwrap();
    let e = accept(s, &a, short).await.err();
    assert!(matches!(e, Some(Error::NoProtoOpt | Error::Io)), "{e:?}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(short, c.read_to_end(&mut rest)).await;
}

#[test]
fn refusals_are_named_by_cause() {
    use rustls::{AlertDescription as A, CertificateError, Error as E};
    assert_eq!(
        tls_error(&E::InvalidCertificate(CertificateError::UnknownIssuer)),
        Error::KeyRejected
    );
    assert_eq!(
        tls_error(&E::AlertReceived(A::UnknownCA)),
        Error::KeyRejected
    );
    assert_eq!(
        tls_error(&E::AlertReceived(A::ProtocolVersion)),
        Error::NoProtoOpt
    );
    assert_eq!(tls_error(&E::DecryptError), Error::Io);
}

/// Reads `s` until it says something other than "nothing yet", within
/// the test's bound.
fn read_until_answer(s: &Session, sock: &std::net::TcpStream) -> io::Result<usize> {
    let t0 = Instant::now();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf, &mut &*sock, sock) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && t0.elapsed() < T => {
                std::thread::sleep(Duration::from_millis(1));
            }
            r => return r,
        }
    }
}

#[tokio::test]
async fn a_forged_or_cut_record_on_an_established_session_ends_it() {
    let pki = Pki::new();
    let a = ctx(&pki.issue("a"));
    // A record that does not decrypt: the read fails (FI_EIO), no panic.
    let (c, s) = handshake(&a, &a).await;
    let (ct, _) = c.unwrap().into_parts();
    let (st, ss) = s.unwrap().into_parts();
    let (ct, st) = (ct.into_std().unwrap(), st.into_std().unwrap());
    let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x30];
    forged.extend_from_slice(&[0x5a; 0x30]);
    std::io::Write::write_all(&mut &ct, &forged).unwrap();
    let ss = Session::new(ss.unwrap());
    let e = read_until_answer(&ss, &st).unwrap_err();
    assert_eq!(Error::from(e), Error::Io);
    // A record cut short by the peer's close: the end of the stream, for
    // the frame layer to judge.
    let (c, s) = handshake(&a, &a).await;
    let (ct, _) = c.unwrap().into_parts();
    let (st, ss) = s.unwrap().into_parts();
    let (ct, st) = (ct.into_std().unwrap(), st.into_std().unwrap());
    std::io::Write::write_all(&mut &ct, &forged[..20]).unwrap();
    drop(ct);
    let ss = Session::new(ss.unwrap());
    assert_eq!(read_until_answer(&ss, &st).unwrap(), 0);
    ss.shrink();
    assert_eq!(read_until_answer(&ss, &st).unwrap(), 0, "after shrinking");
}
