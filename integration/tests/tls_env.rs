//! TLS configured in libfabric's style, by `FI_TCP_TLS_CERT`,
//! `FI_TCP_TLS_KEY` and `FI_TCP_TLS_CA`, read when a domain or passive
//! endpoint is created. A file of its own because it sets the process's
//! environment, which every other test of a binary would see; one test,
//! so nothing runs beside it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, AvFlags, BindFlags, CqAttr, Domain, EpType, Error, Info, TlsFiles, WaitMode};
use weft_integration::tls::TestPki;

const T: Duration = Duration::from_secs(10);
const VARS: [&str; 3] = ["FI_TCP_TLS_CERT", "FI_TCP_TLS_KEY", "FI_TCP_TLS_CA"];

fn set(files: Option<&TlsFiles>) {
    match files {
        Some(f) => {
            std::env::set_var(VARS[0], &f.cert);
            std::env::set_var(VARS[1], &f.key);
            std::env::set_var(VARS[2], &f.ca);
        }
        None => VARS.iter().for_each(|v| std::env::remove_var(v)),
    }
}

fn info(ep_type: EpType, tls: Option<&TlsFiles>) -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = ep_type;
    h.caps = weft::Caps::MSG;
    h.fabric_attr.prov_name = Some("tcp".into());
    h.domain_attr.tls = tls.cloned();
    weft::getinfo(Some(&h)).unwrap().remove(0)
}

fn domain(tls: Option<&TlsFiles>) -> weft::Result<Domain> {
    let i = info(EpType::Rdm, tls);
    weft::Fabric::open(&i).unwrap().domain(&i)
}

/// Sends 64 bytes from an endpoint of `from` to one of `at`: `Ok` if it
/// arrived, the send's error if the connection was refused.
async fn send(from: &Domain, at: &Domain) -> weft::Result<()> {
    let open = |d: &Domain| {
        let av = d.av(AvAttr::default()).unwrap();
        let (ep, cq) = weft_integration::enabled_endpoint(d, d.info(), &av, WaitMode::Interrupt);
        (ep, av, cq)
    };
    let (a, av, _cqa) = open(from);
    let (b, _avb, _cqb) = open(at);
    let dest = av
        .insert(&[b.local_addr().unwrap()], AvFlags::empty(), 0)
        .unwrap()
        .await
        .fi_addrs[0];
    let recv = b.recv(BytesMut::zeroed(64));
    let sent = tokio::time::timeout(T, a.send(dest, Bytes::from_static(&[5; 64])))
        .await
        .unwrap();
    sent.map_err(|e| e.err)?;
    let got = tokio::time::timeout(T, recv).await.unwrap().unwrap();
    assert_eq!(&got.into_bytes()[..], &[5; 64]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_turns_tls_on_when_objects_are_created() {
    let pki = TestPki::new();
    let job = pki.issue("job");
    set(Some(&job));
    let from_env = domain(None).unwrap();
    assert_eq!(from_env.info().domain_attr.tls, None, "not an attribute");
    let listener = {
        let f = weft::Fabric::open(&info(EpType::Msg, None)).unwrap();
        let pep = f.passive_endpoint(&info(EpType::Msg, None), None).unwrap();
        let eq = f.eq(16).unwrap();
        pep.bind_eq(&eq).unwrap();
        pep.listen().unwrap();
        (f, pep, eq)
    };
    set(None);
    let plain = domain(None).unwrap();
    let by_attr = domain(Some(&job)).unwrap();
    // The environment's domain runs TLS: a plain one is refused, one
    // configured in code with the same files is a peer.
    assert_eq!(send(&plain, &from_env).await, Err(Error::NoProtoOpt));
    assert_eq!(send(&from_env, &by_attr).await, Ok(()));
    assert_eq!(send(&by_attr, &from_env).await, Ok(()));
    assert_eq!(send(&plain, &plain).await, Ok(()), "variables unset: plain");
    // So does the passive endpoint created while they were set.
    let (fabric, pep, eq) = listener;
    let c = plain.endpoint(&info(EpType::Msg, None)).unwrap();
    let ceq = fabric.eq(16).unwrap();
    let cq = plain.cq(CqAttr::default()).unwrap();
    c.bind_eq(&ceq).unwrap();
    c.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    c.enable().unwrap();
    let r = tokio::time::timeout(T, c.connect(pep.local_addr().unwrap(), Vec::new())).await;
    assert_eq!(r.unwrap().err(), Some(Error::NoProtoOpt));
    let e = tokio::time::timeout(T, eq.next_timeout(T)).await.unwrap();
    assert_eq!(e.unwrap().unwrap_err().err, Error::NoProtoOpt);
    // Only some of the three, or a file that is not there, fails the
    // domain (and a passive endpoint) instead of leaving TLS off.
    for skip in VARS {
        set(Some(&job));
        std::env::remove_var(skip);
        assert_eq!(domain(None).err(), Some(Error::Inval), "without {skip}");
        let pi = info(EpType::Msg, None);
        assert_eq!(
            fabric.passive_endpoint(&pi, None).err(),
            Some(Error::Inval),
            "passive endpoint without {skip}"
        );
    }
    set(Some(&job));
    std::env::set_var(VARS[0], pki.path("missing.pem"));
    assert_eq!(domain(None).err(), Some(Error::NoEnt));
    // Files in code win over the environment.
    assert!(domain(Some(&job)).is_ok());
    set(None);
}
