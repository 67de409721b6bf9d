//! One RDM endpoint with its fabric, domain, AV and CQ, opened on an address.

use super::*;

/// The fabric objects of one side. The fabric, domain and AV are kept so
/// that they live as long as the endpoint.
#[derive(Debug)]
pub(crate) struct Side {
    pub(crate) info: Info,
    pub(crate) _fabric: Fabric,
    pub(crate) domain: Domain,
    pub(crate) av: AddressVector,
    pub(crate) _cq: CompletionQueue,
    pub(crate) ep: Endpoint,
}

/// The provider's first RDM offer with tagged messages (on `-d`'s domain).
pub(crate) fn find_info(o: &Opts) -> Res<Info> {
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some(o.prov.clone());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    hints.domain_attr.name.clone_from(&o.domain);
    match weft::getinfo(Some(&hints)) {
        Ok(mut infos) if !infos.is_empty() => Ok(infos.remove(0)),
        Ok(_) | Err(_) => {
            let mut m = format!(
                "no RDM endpoint with tagged messages from provider '{}'{} (providers in this \
                 build: {})",
                o.prov,
                o.domain
                    .as_deref()
                    .map(|d| format!(" on domain {d}"))
                    .unwrap_or_default(),
                weft::providers().join(", ")
            );
            if let Some(why) = weft::provider_unavailable(&o.prov) {
                m.push_str(&format!("; {}: {why}", o.prov));
            }
            Err(m.into())
        }
    }
}

/// The IP of the offer's source address, if it has one (RDMA devices do).
pub(crate) fn info_ip(info: &Info) -> Option<IpAddr> {
    let raw = info.src_addr.as_deref()?;
    let a = weft::decode_sockaddr(raw).ok()?;
    (!a.ip().is_unspecified()).then_some(a.ip())
}

/// The local IP the kernel would use to reach `peer` (no packet is sent).
pub(crate) fn routed_ip(peer: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(peer).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

pub(crate) fn open_side(info: Info, src: SocketAddr) -> Res<Side> {
    let ctx = |what: &'static str| move |e: weft::Error| format!("{what}: {e}");
    let fabric = Fabric::open(&info).map_err(ctx("open fabric"))?;
    let domain = fabric.domain(&info).map_err(ctx("open domain"))?;
    let av = domain
        .av(AvAttr::default())
        .map_err(ctx("open address vector"))?;
    let cq = domain
        .cq(CqAttr::default())
        .map_err(ctx("open completion queue"))?;
    let ep = domain.endpoint(&info).map_err(ctx("create endpoint"))?;
    ep.bind_av(&av).map_err(ctx("bind address vector"))?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .map_err(ctx("bind completion queue"))?;
    ep.set_src_addr(weft::encode_sockaddr(&src))
        .map_err(ctx("set source address"))?;
    ep.enable()
        .map_err(|e| format!("enable endpoint at {src}: {e}"))?;
    Ok(Side {
        info,
        _fabric: fabric,
        domain,
        av,
        _cq: cq,
        ep,
    })
}

impl Side {
    pub(crate) fn describe(&self) -> String {
        format!(
            "provider {}, domain {}",
            self.domain.fabric().provider(),
            self.info.domain_attr.name.as_deref().unwrap_or("?")
        )
    }

    /// Our own address in printable form (`IP:PORT` when it is a socket
    /// address, the provider's string otherwise).
    pub(crate) fn local_str(&self) -> Res<String> {
        let raw = self.ep.local_addr()?;
        Ok(match weft::decode_sockaddr(&raw) {
            Ok(a) => a.to_string(),
            Err(_) => self.av.straddr(&raw),
        })
    }

    pub(crate) fn insert(&self, raw: &[u8]) -> Res<FiAddr> {
        let rep = self.av.insert_sync(&[raw.to_vec()], Default::default())?;
        match rep.results.into_iter().next() {
            Some(Ok(fi)) => Ok(fi),
            Some(Err(e)) => Err(format!("insert {}: {e}", self.av.straddr(raw)).into()),
            None => Err("insert: nothing inserted".into()),
        }
    }
}

// ------------------------------------------------------------ messages
