//! Endpoints bound to a shared receive context, for the tests of shared
//! contexts (`tests/conformance/srx.rs`, `tests/srx_peers.rs`).

use weft::{
    BindFlags, CompletionQueue, ConnLimits, ConnRequest, Endpoint, EqEventKind, EventQueue,
    PassiveEndpoint, SharedRxContext,
};

use crate::{next_eq, within, Harness, RdmEp};

/// An enabled RDM endpoint of `h` on `av` and `cq` (both directions)
/// whose receives are `srx`'s, with `limits` if given.
pub fn srx_rdm_ep(
    h: &Harness,
    av: &weft::AddressVector,
    cq: &CompletionQueue,
    srx: &SharedRxContext,
    limits: Option<ConnLimits>,
) -> RdmEp {
    let ep = h.endpoint();
    if let Some(l) = limits {
        ep.set_conn_limits(l).expect("limits");
    }
    ep.bind_av(av).expect("bind av");
    ep.bind_cq(cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .expect("bind cq");
    ep.bind_srx(srx).expect("bind srx");
    ep.enable().expect("enable");
    RdmEp {
        ep,
        av: av.clone(),
        cq: cq.clone(),
    }
}

/// An accepted MSG connection whose server endpoint takes its receives
/// from a shared context, and its client.
#[derive(Debug)]
pub struct SrxConn {
    /// The accepted endpoint.
    pub ep: Endpoint,
    /// Its CQ.
    pub cq: CompletionQueue,
    /// Its EQ.
    pub eq: EventQueue,
    /// The connected client.
    pub client: Endpoint,
    /// The client's EQ.
    pub client_eq: EventQueue,
}

/// `n` clients of `h` connected to endpoints accepted onto `srx`, each
/// reporting to `cq` if given, else to a CQ of its own; and the listener.
pub async fn accept_onto_srx(
    h: &Harness,
    srx: &SharedRxContext,
    n: usize,
    cq: Option<&CompletionQueue>,
) -> (Vec<SrxConn>, PassiveEndpoint) {
    let pep = h.fabric.passive_endpoint(&h.info, None).expect("pep");
    let peq = h.eq();
    pep.bind_eq(&peq).expect("bind eq");
    pep.listen().expect("listen");
    let addr = pep.local_addr().expect("pep address");
    let mut out = Vec::new();
    for _ in 0..n {
        let client = h.endpoint();
        let client_eq = h.eq();
        client.bind_eq(&client_eq).expect("bind eq");
        client
            .bind_cq(&h.cq(), BindFlags::TRANSMIT | BindFlags::RECV)
            .expect("bind cq");
        client.enable().expect("enable");
        let c2 = client.clone();
        let a = addr.clone();
        let connecting = tokio::spawn(async move { c2.connect(a, Vec::new()).await });
        let ev = within("connreq", next_eq(&peq)).await.expect("connreq");
        let req = ConnRequest::from_event(&ev).expect("a connection request");
        let ep = h.domain.accept_endpoint(&h.info, &req).expect("endpoint");
        let eq = h.eq();
        let cq = cq.cloned().unwrap_or_else(|| h.cq());
        ep.bind_eq(&eq).expect("bind eq");
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .expect("bind cq");
        ep.bind_srx(srx).expect("bind srx");
        ep.enable().expect("enable");
        within("accept", ep.accept(Vec::new()))
            .await
            .expect("accept");
        within("connect", connecting)
            .await
            .expect("join")
            .expect("connect");
        for q in [&client_eq, &eq] {
            let ev = within("connected", next_eq(q)).await.expect("event");
            assert_eq!(ev.kind, EqEventKind::Connected);
        }
        out.push(SrxConn {
            ep,
            cq,
            eq,
            client,
            client_eq,
        });
    }
    (out, pep)
}
