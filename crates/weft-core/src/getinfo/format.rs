//! `fi_info`-style rendering with libfabric's spellings.

use std::fmt::{Display, LowerHex, Write};

use bitflags::Flags;

use crate::addr::{decode_sockaddr, sockaddr_to_str};
use crate::{attr::*, flags::*};

/// Joins the libfabric names of the set flags with `" | "`. Bits without a
/// name (only possible through `from_bits_retain`) are shown in hex rather
/// than dropped, so a dump never hides a flag.
fn flag_names<F>(flags: F, prefix: &str) -> String
where
    F: Flags,
    F::Bits: LowerHex,
{
    let mut names = flags.iter_names();
    let mut parts: Vec<String> = names
        .by_ref()
        .map(|(name, _)| format!("{prefix}{name}"))
        .collect();
    let rest = names.remaining();
    if !rest.is_empty() {
        parts.push(format!("{:#x}", rest.bits()));
    }
    parts.join(" | ")
}

/// Capabilities, e.g. `"FI_MSG | FI_TAGGED"`; empty for none.
pub fn caps_str(c: Caps) -> String {
    flag_names(c, "FI_")
}

/// Operation flags, e.g. `"FI_COMPLETION | FI_INJECT"`; empty for none.
pub fn op_flags_str(f: OpFlags) -> String {
    flag_names(f, "FI_")
}

/// Mode bits, e.g. `"FI_CONTEXT"`; empty for none.
pub fn mode_str(m: Mode) -> String {
    flag_names(m, "FI_")
}

/// Memory registration mode, e.g. `"FI_MR_LOCAL | FI_MR_PROV_KEY"`; empty
/// for none.
pub fn mr_mode_str(m: MrMode) -> String {
    flag_names(m, "FI_MR_")
}

/// Message ordering, e.g. `"FI_ORDER_SAS"`; empty for none, as `fi_info`
/// prints it.
pub fn msg_order_str(o: MsgOrder) -> String {
    flag_names(o, "FI_ORDER_")
}

/// Completion ordering: `"FI_ORDER_NONE"` for none (as `fi_info` prints it),
/// else `"FI_ORDER_STRICT"` and/or `"FI_ORDER_DATA"`.
pub fn comp_order_str(o: CompOrder) -> String {
    if o.is_empty() {
        "FI_ORDER_NONE".to_owned()
    } else {
        flag_names(o, "FI_ORDER_")
    }
}

/// `FI_SOCKADDR_IN`, `FI_ADDR_STR`, ...
pub const fn addr_format_str(f: AddrFormat) -> &'static str {
    match f {
        AddrFormat::Unspec => "FI_FORMAT_UNSPEC",
        AddrFormat::SockaddrIn => "FI_SOCKADDR_IN",
        AddrFormat::SockaddrIn6 => "FI_SOCKADDR_IN6",
        AddrFormat::Sockaddr => "FI_SOCKADDR",
        AddrFormat::Str => "FI_ADDR_STR",
    }
}

/// `FI_PROTO_SOCK_TCP`, `FI_PROTO_UDP`, ...
pub const fn protocol_str(p: Protocol) -> &'static str {
    match p {
        Protocol::Unspec => "FI_PROTO_UNSPEC",
        Protocol::Udp => "FI_PROTO_UDP",
        Protocol::SockTcp => "FI_PROTO_SOCK_TCP",
        Protocol::Shm => "FI_PROTO_SHM",
        Protocol::RdmaCmIbRc => "FI_PROTO_RDMA_CM_IB_RC",
        Protocol::WeftRdmRc => "FI_PROTO_WEFT_RDM_RC",
        Protocol::IbUd => "FI_PROTO_IB_UD",
        Protocol::WeftUdp => "FI_PROTO_WEFT_UDP",
    }
}

/// `FI_AV_MAP`, `FI_AV_TABLE`, `FI_AV_UNSPEC`.
pub const fn av_type_str(t: AvType) -> &'static str {
    match t {
        AvType::Unspec => "FI_AV_UNSPEC",
        AvType::Map => "FI_AV_MAP",
        AvType::Table => "FI_AV_TABLE",
    }
}

/// `FI_PROGRESS_AUTO`, `FI_PROGRESS_MANUAL`, `FI_PROGRESS_UNSPEC`.
pub const fn progress_str(p: Progress) -> &'static str {
    match p {
        Progress::Unspec => "FI_PROGRESS_UNSPEC",
        Progress::Auto => "FI_PROGRESS_AUTO",
        Progress::Manual => "FI_PROGRESS_MANUAL",
    }
}

/// `FI_THREAD_SAFE`, `FI_THREAD_DOMAIN`, ...
pub const fn threading_str(t: Threading) -> &'static str {
    match t {
        Threading::Unspec => "FI_THREAD_UNSPEC",
        Threading::Safe => "FI_THREAD_SAFE",
        Threading::Fid => "FI_THREAD_FID",
        Threading::Domain => "FI_THREAD_DOMAIN",
        Threading::Completion => "FI_THREAD_COMPLETION",
        Threading::Endpoint => "FI_THREAD_ENDPOINT",
    }
}

/// `major.minor` of a packed `FI_VERSION`.
fn version_str(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

fn name_str(n: &Option<String>) -> &str {
    n.as_deref().unwrap_or("(null)")
}

/// The files only, never their contents.
fn tls_str(t: &Option<crate::tls::TlsFiles>) -> String {
    match t {
        None => "(null)".to_owned(),
        Some(f) => format!(
            "cert={} key={} ca={}",
            f.cert.display(),
            f.key.display(),
            f.ca.display()
        ),
    }
}

fn key_size(k: &Option<Vec<u8>>) -> usize {
    k.as_ref().map_or(0, Vec::len)
}

/// Socket addresses as `fi_av_straddr` prints them, `FI_ADDR_STR` as the
/// string itself, anything undecodable as hex bytes.
fn addr_str(format: AddrFormat, addr: Option<&[u8]>) -> String {
    let Some(bytes) = addr else {
        return "(null)".to_owned();
    };
    if format == AddrFormat::Str {
        return String::from_utf8_lossy(bytes)
            .trim_end_matches('\0')
            .to_owned();
    }
    match decode_sockaddr(bytes) {
        Ok(sa) => sockaddr_to_str(&sa),
        Err(_) => bytes.iter().fold("0x".to_owned(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }),
    }
}

/// Appends `key: value` at an indentation level of four spaces per level.
fn line(out: &mut String, level: usize, key: &str, value: impl Display) {
    // Writing into a String cannot fail.
    let _ = writeln!(out, "{:width$}{key}: {value}", "", width = level * 4);
}

/// A flag list in `fi_info -v`'s bracket form; empty sets print `[  ]` as
/// libfabric does.
fn list(flags: String) -> String {
    format!("[ {flags} ]")
}

/// Renders one info like `fi_info` does: `verbose == false` gives the short
/// block (provider, fabric, domain, version, type, protocol), `verbose ==
/// true` a YAML-like dump of every attribute like `fi_info -v`, starting
/// with the `---` document separator. Both end with a newline, so blocks can
/// simply be concatenated.
pub fn format_info(info: &Info, verbose: bool) -> String {
    let mut out = String::new();
    let (fa, da, ea, tx, rx) = (
        &info.fabric_attr,
        &info.domain_attr,
        &info.ep_attr,
        &info.tx_attr,
        &info.rx_attr,
    );
    if !verbose {
        line(&mut out, 0, "provider", name_str(&fa.prov_name));
        line(&mut out, 1, "fabric", name_str(&fa.name));
        line(&mut out, 1, "domain", name_str(&da.name));
        line(&mut out, 1, "version", version_str(fa.prov_version));
        line(&mut out, 1, "type", ea.ep_type.fi_name());
        line(&mut out, 1, "protocol", protocol_str(ea.protocol));
        return out;
    }

    out.push_str("---\nfi_info:\n");
    line(&mut out, 1, "caps", list(caps_str(info.caps)));
    line(&mut out, 1, "mode", list(mode_str(info.mode)));
    line(
        &mut out,
        1,
        "addr_format",
        addr_format_str(info.addr_format),
    );
    let src = info.src_addr.as_deref();
    let dest = info.dest_addr.as_deref();
    line(&mut out, 1, "src_addrlen", src.map_or(0, <[u8]>::len));
    line(&mut out, 1, "dest_addrlen", dest.map_or(0, <[u8]>::len));
    line(&mut out, 1, "src_addr", addr_str(info.addr_format, src));
    line(&mut out, 1, "dest_addr", addr_str(info.addr_format, dest));

    out.push_str("    fi_tx_attr:\n");
    line(&mut out, 2, "caps", list(caps_str(tx.caps)));
    line(&mut out, 2, "mode", list(mode_str(tx.mode)));
    line(&mut out, 2, "op_flags", list(op_flags_str(tx.op_flags)));
    line(&mut out, 2, "msg_order", list(msg_order_str(tx.msg_order)));
    line(
        &mut out,
        2,
        "comp_order",
        list(comp_order_str(tx.comp_order)),
    );
    line(&mut out, 2, "inject_size", tx.inject_size);
    line(&mut out, 2, "size", tx.size);
    line(&mut out, 2, "iov_limit", tx.iov_limit);
    line(&mut out, 2, "rma_iov_limit", tx.rma_iov_limit);
    line(&mut out, 2, "tclass", format_args!("{:#x}", tx.tclass));

    out.push_str("    fi_rx_attr:\n");
    line(&mut out, 2, "caps", list(caps_str(rx.caps)));
    line(&mut out, 2, "mode", list(mode_str(rx.mode)));
    line(&mut out, 2, "op_flags", list(op_flags_str(rx.op_flags)));
    line(&mut out, 2, "msg_order", list(msg_order_str(rx.msg_order)));
    line(
        &mut out,
        2,
        "comp_order",
        list(comp_order_str(rx.comp_order)),
    );
    line(&mut out, 2, "total_buffered_recv", rx.total_buffered_recv);
    line(&mut out, 2, "size", rx.size);
    line(&mut out, 2, "iov_limit", rx.iov_limit);

    out.push_str("    fi_ep_attr:\n");
    line(&mut out, 2, "type", ea.ep_type.fi_name());
    line(&mut out, 2, "protocol", protocol_str(ea.protocol));
    line(&mut out, 2, "protocol_version", ea.protocol_version);
    line(&mut out, 2, "max_msg_size", ea.max_msg_size);
    line(&mut out, 2, "msg_prefix_size", ea.msg_prefix_size);
    line(&mut out, 2, "max_order_raw_size", ea.max_order_raw_size);
    line(&mut out, 2, "max_order_war_size", ea.max_order_war_size);
    line(&mut out, 2, "max_order_waw_size", ea.max_order_waw_size);
    line(
        &mut out,
        2,
        "mem_tag_format",
        format_args!("{:#018x}", ea.mem_tag_format),
    );
    line(&mut out, 2, "tx_ctx_cnt", ea.tx_ctx_cnt);
    line(&mut out, 2, "rx_ctx_cnt", ea.rx_ctx_cnt);
    line(&mut out, 2, "cm_data_size", ea.cm_data_size);
    // The size only: a key printed in a log would be a key given away.
    line(&mut out, 2, "auth_key_size", key_size(&ea.auth_key));

    out.push_str("    fi_domain_attr:\n");
    line(&mut out, 2, "name", name_str(&da.name));
    line(&mut out, 2, "threading", threading_str(da.threading));
    line(
        &mut out,
        2,
        "control_progress",
        progress_str(da.control_progress),
    );
    line(&mut out, 2, "data_progress", progress_str(da.data_progress));
    line(&mut out, 2, "av_type", av_type_str(da.av_type));
    line(&mut out, 2, "mr_mode", list(mr_mode_str(da.mr_mode)));
    line(&mut out, 2, "mr_key_size", da.mr_key_size);
    line(&mut out, 2, "cq_data_size", da.cq_data_size);
    line(&mut out, 2, "cq_cnt", da.cq_cnt);
    line(&mut out, 2, "ep_cnt", da.ep_cnt);
    line(&mut out, 2, "tx_ctx_cnt", da.tx_ctx_cnt);
    line(&mut out, 2, "rx_ctx_cnt", da.rx_ctx_cnt);
    line(&mut out, 2, "max_ep_tx_ctx", da.max_ep_tx_ctx);
    line(&mut out, 2, "max_ep_rx_ctx", da.max_ep_rx_ctx);
    line(&mut out, 2, "max_ep_stx_ctx", da.max_ep_stx_ctx);
    line(&mut out, 2, "max_ep_srx_ctx", da.max_ep_srx_ctx);
    line(&mut out, 2, "mr_iov_limit", da.mr_iov_limit);
    line(&mut out, 2, "caps", list(caps_str(da.caps)));
    line(&mut out, 2, "mode", list(mode_str(da.mode)));
    line(&mut out, 2, "mr_cnt", da.mr_cnt);
    if da.av_auth_key {
        line(&mut out, 2, "auth_key_size", "FI_AV_AUTH_KEY");
    } else {
        line(&mut out, 2, "auth_key_size", key_size(&da.auth_key));
    }
    line(&mut out, 2, "max_ep_auth_key", da.max_ep_auth_key);
    line(&mut out, 2, "tls_capable", u8::from(da.tls_capable));
    line(&mut out, 2, "tls", tls_str(&da.tls));

    out.push_str("    fi_fabric_attr:\n");
    line(&mut out, 2, "name", name_str(&fa.name));
    line(&mut out, 2, "prov_name", name_str(&fa.prov_name));
    line(&mut out, 2, "prov_version", version_str(fa.prov_version));
    line(&mut out, 2, "api_version", version_str(fa.api_version));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::encode_sockaddr;

    fn sample() -> Info {
        let mut i = Info {
            caps: Caps::MSG | Caps::TAGGED,
            addr_format: AddrFormat::SockaddrIn,
            src_addr: Some(encode_sockaddr(&"127.0.0.1:0".parse().unwrap())),
            ..Info::default()
        };
        i.tx_attr.msg_order = MsgOrder::SAS | MsgOrder::RMA_WAW;
        i.tx_attr.inject_size = 64;
        i.tx_attr.op_flags = OpFlags::COMPLETION | OpFlags::DELIVERY_COMPLETE;
        i.rx_attr.comp_order = CompOrder::STRICT | CompOrder::DATA;
        i.ep_attr.ep_type = EpType::Rdm;
        i.ep_attr.protocol = Protocol::SockTcp;
        i.ep_attr.max_msg_size = usize::MAX;
        i.ep_attr.mem_tag_format = 0xaaaa_aaaa_aaaa_aaaa;
        i.domain_attr.name = Some("lo".into());
        i.domain_attr.threading = Threading::Safe;
        i.domain_attr.control_progress = Progress::Auto;
        i.domain_attr.data_progress = Progress::Manual;
        i.domain_attr.av_type = AvType::Table;
        i.domain_attr.mr_mode = MrMode::LOCAL | MrMode::PROV_KEY;
        i.fabric_attr.name = Some("127.0.0.0/8".into());
        i.fabric_attr.prov_name = Some("tcp".into());
        i.fabric_attr.prov_version = version(1, 2);
        i.fabric_attr.api_version = API_VERSION;
        i
    }

    #[test]
    fn flag_strings() {
        assert_eq!(caps_str(Caps::MSG | Caps::TAGGED), "FI_MSG | FI_TAGGED");
        assert_eq!(caps_str(Caps::empty()), "");
        assert_eq!(caps_str(Caps::REMOTE_COMM), "FI_REMOTE_COMM");
        assert_eq!(
            op_flags_str(OpFlags::INJECT | OpFlags::COMPLETION),
            "FI_COMPLETION | FI_INJECT"
        );
        assert_eq!(mode_str(Mode::CONTEXT), "FI_CONTEXT");
        assert_eq!(
            mr_mode_str(MrMode::VIRT_ADDR | MrMode::PROV_KEY),
            "FI_MR_VIRT_ADDR | FI_MR_PROV_KEY"
        );
        assert_eq!(msg_order_str(MsgOrder::empty()), "");
        assert_eq!(
            msg_order_str(MsgOrder::SAS | MsgOrder::ATOMIC_WAW),
            "FI_ORDER_SAS | FI_ORDER_ATOMIC_WAW"
        );
        assert_eq!(comp_order_str(CompOrder::empty()), "FI_ORDER_NONE");
        assert_eq!(
            comp_order_str(CompOrder::STRICT | CompOrder::DATA),
            "FI_ORDER_STRICT | FI_ORDER_DATA"
        );
        // Unnamed bits stay visible.
        assert_eq!(comp_order_str(CompOrder::from_bits_retain(1)), "0x1");
    }

    #[test]
    fn brief_block() {
        let s = format_info(&sample(), false);
        assert_eq!(
            s,
            "provider: tcp\n    fabric: 127.0.0.0/8\n    domain: lo\n    version: 1.2\n    \
             type: FI_EP_RDM\n    protocol: FI_PROTO_SOCK_TCP\n"
        );
        assert!(format_info(&Info::default(), false).starts_with("provider: (null)\n"));
    }

    #[test]
    fn verbose_dump_uses_libfabric_spellings() {
        let s = format_info(&sample(), true);
        assert!(s.starts_with("---\nfi_info:\n    caps: [ FI_MSG | FI_TAGGED ]\n"));
        for want in [
            "    mode: [  ]\n",
            "    addr_format: FI_SOCKADDR_IN\n",
            "    src_addrlen: 16\n",
            "    src_addr: fi_sockaddr_in://127.0.0.1:0\n",
            "    dest_addr: (null)\n",
            "    fi_tx_attr:\n",
            "        msg_order: [ FI_ORDER_SAS | FI_ORDER_RMA_WAW ]\n",
            "        comp_order: [ FI_ORDER_NONE ]\n",
            "        op_flags: [ FI_COMPLETION | FI_DELIVERY_COMPLETE ]\n",
            "        inject_size: 64\n",
            "        tclass: 0x0\n",
            "        comp_order: [ FI_ORDER_STRICT | FI_ORDER_DATA ]\n",
            "        type: FI_EP_RDM\n",
            "        protocol: FI_PROTO_SOCK_TCP\n",
            "        max_msg_size: 18446744073709551615\n",
            "        mem_tag_format: 0xaaaaaaaaaaaaaaaa\n",
            "        threading: FI_THREAD_SAFE\n",
            "        control_progress: FI_PROGRESS_AUTO\n",
            "        data_progress: FI_PROGRESS_MANUAL\n",
            "        av_type: FI_AV_TABLE\n",
            "        mr_mode: [ FI_MR_LOCAL | FI_MR_PROV_KEY ]\n",
            "    fi_fabric_attr:\n        name: 127.0.0.0/8\n        prov_name: tcp\n",
            "        prov_version: 1.2\n        api_version: 1.17\n",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(
            addr_str(AddrFormat::Str, Some(b"fi_shm://42\0")),
            "fi_shm://42"
        );
        assert_eq!(
            addr_str(AddrFormat::Unspec, Some(&[1, 2, 0xff])),
            "0x0102ff"
        );
        let v6 = encode_sockaddr(&"[::1]:7".parse().unwrap());
        assert_eq!(
            addr_str(AddrFormat::SockaddrIn6, Some(&v6)),
            "fi_sockaddr_in6://[::1]:7"
        );
        assert_eq!(addr_str(AddrFormat::Sockaddr, None), "(null)");
    }
}
