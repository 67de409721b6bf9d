//! `fi_getinfo` semantics: matching an application's hints against a
//! provider's offers, narrowing the matches to what was asked for, provider
//! selection strings (`FI_PROVIDER`) and `fi_info`-style rendering.
//!
//! In hints, zero / `Unspec` / `None` / empty mean "don't care". Everything
//! else is a requirement: an offer that cannot meet it is no match, never a
//! weaker match.
//!
//! The rules, field by field:
//!
//! * **caps** (info, `tx_attr`, `rx_attr`, `domain_attr`): requested bits must
//!   be offered. If the request names primary caps, the result keeps exactly
//!   those plus the offer's secondary caps (libfabric forbids enabling primary
//!   caps that were not asked for). A request naming only secondary caps
//!   leaves the offer's primary caps. Attribute caps not requested follow the
//!   narrowed info caps, so they never exceed them. Caps in
//!   [`Caps::ON_REQUEST`] (`FI_SOURCE_ERR`, `FI_RMA_EVENT`) are in a result
//!   only when the hints name them (and then in the attributes that offer
//!   them too); `FI_SOURCE_ERR` with primary caps but without `FI_SOURCE`
//!   matches nothing.
//! * **mode**: the offer's required bits must all be accepted by the hints.
//!   `tx_attr`/`rx_attr`/`domain_attr` modes of 0 in the hints mean "same as
//!   `info.mode`" (fi_endpoint(3)). The result carries the offer's modes.
//!   [`OPTIONAL_MODES`] are the exception: an offer keeps them only for
//!   hints that accept them, and otherwise stands without them (the
//!   provider then refuses what needed them).
//! * **mr_mode**: the offer's required bits must be a subset of the hints'
//!   `mr_mode`. Hints with `mr_mode` 0 declare that the application supports
//!   no registration requirement, so they match only offers requiring none.
//!   As in libfabric, the bits that only concern RMA targets
//!   ([`MR_MODE_RMA_TARGET`]) are required only of hints that ask for
//!   `FI_RMA` or `FI_ATOMIC`. Hints that ask for neither get neither: the
//!   result carries no RMA/atomic caps and none of those bits (with empty
//!   caps, or only secondary ones, RMA stays in only if the hints' `mr_mode`
//!   accepts its bits). [`ON_REQUEST_MR_MODES`] (`FI_MR_RMA_EVENT`,
//!   `FI_MR_ENDPOINT`) are never required: an offer with `FI_RMA_EVENT`
//!   can work with or without them, and its result carries those the
//!   hints' `mr_mode` names (`FI_MR_RMA_EVENT` only with `FI_RMA_EVENT` in
//!   the result, neither without RMA), so regions need binding and enabling
//!   only for applications that said they would do it.
//! * **ep_type, protocol**: equal when given.
//! * **addr_format**: equal when given, except that `FI_SOCKADDR` and the
//!   specific `FI_SOCKADDR_IN{,6}` accept each other; the result is the more
//!   specific one.
//! * **av_type**: equal when given; an offer of `FI_AV_UNSPEC` supports any
//!   type and the result takes the requested one.
//! * **threading**: `FI_THREAD_SAFE` offers satisfy any request, otherwise the
//!   levels must be equal. The result reports the requested level, which is
//!   what the application promised to honour.
//! * **progress**: a request for `FI_PROGRESS_MANUAL` is met by manual and by
//!   auto offers (the app will drive progress, which an auto provider
//!   tolerates); a request for `FI_PROGRESS_AUTO` needs auto. The result
//!   reports what the provider actually does.
//! * **names**: fabric and domain names must be equal; `prov_name` is a
//!   selection string as accepted by [`provider_selected`].
//! * **sizes and counts**: a hint larger than the offer is no match; the
//!   result takes the hint (narrowing), else the offer's value.
//! * **mem_tag_format**: the requested tag must not be wider (highest set bit)
//!   than the offered one; the result takes the requested format.
//! * **protocol_version**: a hint above the offer is no match; the result
//!   keeps the offer's version, the one spoken on the wire.
//! * **msg_order / comp_order**: requested bits must be offered; the result
//!   is the request if nonzero, else the offer.
//! * **op_flags**: must be among the offer's `op_flags_supported` (a flag
//!   the provider would ignore is no match); passed into the result. A
//!   result without `FI_MULTI_RECV` in its caps does not list
//!   `FI_MULTI_RECV` among its receive flags, and hints that ask for it
//!   as a default receive flag while naming primary caps without it match
//!   nothing.
//! * **tclass, src_addr, dest_addr**: passed from the hints into the
//!   result when given; the provider validates them when objects open.
//! * **auth_key** (`ep_attr`, `domain_attr`): offers carry none. A hint
//!   with a key matches only offers whose `max_ep_auth_key` is at least 1
//!   (providers that enforce keys), and only if the key's size is one the
//!   provider takes (1 ..= [`MAX_KEY_LEN`](crate::auth::MAX_KEY_LEN)
//!   bytes); the result carries the hint's keys.
//! * **av_auth_key** (`FI_AV_AUTH_KEY`): a hint with it matches only
//!   offers whose `max_ep_auth_key` is at least 1, and no offer if it
//!   also carries a domain key; the result carries it.
//! * **max_ep_auth_key**: a size like the others.
//! * **tls**, **tls_capable** (`domain_attr`, Weft extensions): offers
//!   carry no files. A hint with files or with `tls_capable` set matches
//!   only offers that run TLS; the result carries the hint's files.
//! * **fabric versions, msg_prefix_size, mr_cnt**: not matched; offer values.

mod format;

pub use format::{
    addr_format_str, av_type_str, caps_str, comp_order_str, format_info, mode_str, mr_mode_str,
    msg_order_str, op_flags_str, progress_str, protocol_str, threading_str,
};

use crate::{attr::*, flags::*, Error, Result};

/// Declares the numeric limits once for both the check and the narrowing,
/// so the two lists cannot drift apart.
macro_rules! limits {
    ($($($field:ident).+),* $(,)?) => {
        fn limits_ok(h: &Info, o: &Info) -> bool {
            true $(&& (h.$($field).+ == 0 || h.$($field).+ <= o.$($field).+))*
        }

        fn narrow_limits(h: &Info, r: &mut Info) {
            $(if h.$($field).+ != 0 {
                r.$($field).+ = h.$($field).+;
            })*
        }
    };
}

limits!(
    ep_attr.max_msg_size,
    ep_attr.max_order_raw_size,
    ep_attr.max_order_war_size,
    ep_attr.max_order_waw_size,
    ep_attr.cm_data_size,
    tx_attr.inject_size,
    tx_attr.size,
    tx_attr.iov_limit,
    tx_attr.rma_iov_limit,
    rx_attr.size,
    rx_attr.iov_limit,
    rx_attr.total_buffered_recv,
    domain_attr.mr_key_size,
    domain_attr.cq_data_size,
    domain_attr.cq_cnt,
    domain_attr.ep_cnt,
    domain_attr.tx_ctx_cnt,
    domain_attr.rx_ctx_cnt,
    domain_attr.max_ep_tx_ctx,
    domain_attr.max_ep_rx_ctx,
    domain_attr.mr_iov_limit,
    domain_attr.max_ep_auth_key,
);

/// Mode bits an offer may do without: `FI_RX_CQ_DATA` (remote CQ data of
/// an RMA write takes a posted receive at the target). For hints that do
/// not accept it the offer is narrowed without it, and the endpoint
/// refuses RMA writes with remote CQ data (libfabric's verbs MSG offer
/// drops the bit the same way).
pub const OPTIONAL_MODES: Mode = Mode::RX_CQ_DATA;

/// `mr_mode` bits that matter only to the target of RMA and atomics
/// (libfabric's `OFI_MR_MODE_RMA_TARGET`).
pub const MR_MODE_RMA_TARGET: MrMode = MrMode::RAW
    .union(MrMode::VIRT_ADDR)
    .union(MrMode::PROV_KEY)
    .union(MrMode::RMA_EVENT);

/// `mr_mode` bits an offer with `FI_RMA_EVENT` takes on request: its
/// provider sees every remote access at the target, so it can count them
/// per region and confine a region to an endpoint, or not. A result
/// carries those the hints name (see the module docs); offers never
/// require them.
pub const ON_REQUEST_MR_MODES: MrMode = MrMode::RMA_EVENT.union(MrMode::ENDPOINT);

/// The caps that come with RMA and atomics.
const RMA_LIKE: Caps = Caps::RMA
    .union(Caps::ATOMIC)
    .union(Caps::READ)
    .union(Caps::WRITE)
    .union(Caps::REMOTE_READ)
    .union(Caps::REMOTE_WRITE)
    .union(Caps::RMA_EVENT);

/// Whether the result for `h` keeps the offer's RMA (and with it the
/// RMA-target `mr_mode` bits of `o`).
fn keeps_rma(h: &Info, o: &Info) -> bool {
    // Without primary caps in the hints, the result keeps the offer's
    // (see `narrow_caps`): RMA among them if its bits are accepted.
    h.caps.intersects(Caps::RMA | Caps::ATOMIC)
        || (!h.caps.intersects(Caps::PRIMARY)
            && h.domain_attr
                .mr_mode
                .contains(o.domain_attr.mr_mode & MR_MODE_RMA_TARGET))
}

/// `offer` (a provider's MSG offer) made a `FI_EP_SOCK_STREAM` one. The
/// bytes move through the stream, not through sends and receives: no
/// data capabilities or operation flags, no inject, and no order but
/// that of the bytes; nothing to register.
pub fn sock_stream_offer(mut i: Info) -> Info {
    i.caps = Caps::LOCAL_COMM | Caps::REMOTE_COMM;
    i.tx_attr.caps = Caps::empty();
    i.rx_attr.caps = Caps::empty();
    i.tx_attr.op_flags_supported = OpFlags::empty();
    i.rx_attr.op_flags_supported = OpFlags::empty();
    i.tx_attr.msg_order = MsgOrder::empty();
    i.rx_attr.msg_order = MsgOrder::empty();
    i.rx_attr.comp_order = CompOrder::empty();
    i.tx_attr.inject_size = 0;
    i.ep_attr.ep_type = EpType::SockStream;
    i.domain_attr.mr_mode = MrMode::empty();
    i
}

/// Does a provider's offer satisfy the hints? A request the provider cannot
/// meet is no match (never a weaker one). See the module docs for the rules.
pub fn satisfies(hints: &Info, offer: &Info) -> bool {
    let (h, o) = (hints, offer);
    let (hd, od) = (&h.domain_attr, &o.domain_attr);
    let (he, oe) = (&h.ep_attr, &o.ep_attr);
    let (ht, ot) = (&h.tx_attr, &o.tx_attr);
    let (hr, or) = (&h.rx_attr, &o.rx_attr);

    let caps = o.caps.contains(h.caps)
        && ot.caps.contains(ht.caps)
        && or.caps.contains(hr.caps)
        && od.caps.contains(hd.caps);
    let mode = h.mode.contains(o.mode - OPTIONAL_MODES)
        && mode_or(ht.mode, h.mode).contains(ot.mode - OPTIONAL_MODES)
        && mode_or(hr.mode, h.mode).contains(or.mode - OPTIONAL_MODES)
        && mode_or(hd.mode, h.mode).contains(od.mode - OPTIONAL_MODES);
    let endpoint = enum_ok(he.ep_type, EpType::Unspec, oe.ep_type)
        && enum_ok(he.protocol, Protocol::Unspec, oe.protocol)
        && addr_format_ok(h.addr_format, o.addr_format)
        && (he.protocol_version == 0 || he.protocol_version <= oe.protocol_version)
        && tag_format_ok(he.mem_tag_format, oe.mem_tag_format);
    let domain =
        (hd.av_type == AvType::Unspec || od.av_type == AvType::Unspec || hd.av_type == od.av_type)
            && threading_ok(hd.threading, od.threading)
            && progress_ok(hd.control_progress, od.control_progress)
            && progress_ok(hd.data_progress, od.data_progress)
            && hd.mr_mode.contains(if keeps_rma(h, o) {
                od.mr_mode
            } else {
                od.mr_mode - MR_MODE_RMA_TARGET
            });
    // A default FI_MULTI_RECV needs the cap, which hints naming primary
    // caps must name too.
    let multi = !hr.op_flags.contains(OpFlags::MULTI_RECV)
        || !h.caps.intersects(Caps::PRIMARY)
        || h.caps.contains(Caps::MULTI_RECV);
    let flags = multi
        && ot.op_flags_supported.contains(ht.op_flags)
        && or.op_flags_supported.contains(hr.op_flags);
    let order = ot.msg_order.contains(ht.msg_order)
        && ot.comp_order.contains(ht.comp_order)
        && or.msg_order.contains(hr.msg_order)
        && or.comp_order.contains(hr.comp_order);
    let names = name_ok(&h.fabric_attr.name, &o.fabric_attr.name)
        && name_ok(&hd.name, &od.name)
        && match h.fabric_attr.prov_name.as_deref() {
            None => true,
            Some(filter) => {
                provider_selected(filter, o.fabric_attr.prov_name.as_deref().unwrap_or(""))
            }
        };

    caps && mode
        && endpoint
        && domain
        && flags
        && order
        && names
        && limits_ok(h, o)
        && rx_ctx_ok(h, o)
        && tx_ctx_ok(h, o)
        && keys_ok(h, o)
        && source_err_ok(h)
        && tls_ok(h, o)
}

/// `tx_ctx_cnt`, likewise: `FI_SHARED_CONTEXT` asks for an endpoint that
/// sends through a shared transmit context. More than one context is a
/// scalable endpoint's, up to the domain's `max_ep_tx_ctx` (the offer's
/// own count is what an endpoint gets by default).
fn tx_ctx_ok(h: &Info, o: &Info) -> bool {
    match h.ep_attr.tx_ctx_cnt {
        0 => true,
        SHARED_CONTEXT => o.domain_attr.max_ep_stx_ctx > 0,
        n => n <= o.ep_attr.tx_ctx_cnt.max(o.domain_attr.max_ep_tx_ctx),
    }
}

/// The [`ON_REQUEST_MR_MODES`] a result for `h` carries, given its
/// narrowed `caps`: those the hints accept, from an offer that sees remote
/// accesses, in a result that keeps RMA (and `FI_MR_RMA_EVENT` only with
/// `FI_RMA_EVENT`: without it no region is registered for events).
fn on_request_mr_modes(h: &Info, o: &Info, caps: Caps) -> MrMode {
    if !o.caps.contains(Caps::RMA_EVENT) || !caps.intersects(Caps::RMA | Caps::ATOMIC) {
        return MrMode::empty();
    }
    let mut m = h.domain_attr.mr_mode & ON_REQUEST_MR_MODES;
    if !caps.contains(Caps::RMA_EVENT) {
        m -= MrMode::RMA_EVENT;
    }
    m
}

/// `FI_SOURCE_ERR` needs `FI_SOURCE` (a hint naming primary caps must
/// name both).
fn source_err_ok(h: &Info) -> bool {
    !h.caps.contains(Caps::SOURCE_ERR)
        || !h.caps.intersects(Caps::PRIMARY)
        || h.caps.contains(Caps::SOURCE)
}

/// A hint that names TLS files or asks for TLS matches only providers
/// that run it.
fn tls_ok(h: &Info, o: &Info) -> bool {
    let wants = h.domain_attr.tls.is_some() || h.domain_attr.tls_capable;
    !wants || o.domain_attr.tls_capable
}

/// A hint's authorization keys: sizes the provider takes, and an offer
/// that takes a key at all.
fn keys_ok(h: &Info, o: &Info) -> bool {
    let keys = [
        h.ep_attr.auth_key.as_deref(),
        h.domain_attr.auth_key.as_deref(),
    ];
    if h.domain_attr.av_auth_key
        && (h.domain_attr.auth_key.is_some() || o.domain_attr.max_ep_auth_key == 0)
    {
        return false;
    }
    let mut given = keys.into_iter().flatten().peekable();
    given.peek().is_none()
        || (o.domain_attr.max_ep_auth_key >= 1 && given.all(|k| crate::auth::check_key(k).is_ok()))
}

/// `rx_ctx_cnt`, a limit like the others except for
/// `FI_SHARED_CONTEXT`, which asks for an endpoint that takes its receives
/// from a shared receive context: offers whose domain has them match.
fn rx_ctx_ok(h: &Info, o: &Info) -> bool {
    match h.ep_attr.rx_ctx_cnt {
        0 => true,
        SHARED_CONTEXT => o.domain_attr.max_ep_srx_ctx > 0,
        n => n <= o.ep_attr.rx_ctx_cnt.max(o.domain_attr.max_ep_rx_ctx),
    }
}

/// The offer narrowed to the request: what `fi_getinfo` returns for an offer
/// that [`satisfies`] the hints. Meaningless for offers that do not.
pub fn narrow(hints: &Info, offer: &Info) -> Info {
    let h = hints;
    let mut r = offer.clone();

    r.mode -= OPTIONAL_MODES - h.mode;
    r.tx_attr.mode -= OPTIONAL_MODES - mode_or(h.tx_attr.mode, h.mode);
    r.rx_attr.mode -= OPTIONAL_MODES - mode_or(h.rx_attr.mode, h.mode);
    r.domain_attr.mode -= OPTIONAL_MODES - mode_or(h.domain_attr.mode, h.mode);
    // Caps granted on request come with the request only.
    r.caps = narrow_caps(h.caps, offer.caps, Caps::all() - Caps::ON_REQUEST);
    r.tx_attr.caps = narrow_caps(h.tx_attr.caps, offer.tx_attr.caps, r.caps);
    r.rx_attr.caps = narrow_caps(h.rx_attr.caps, offer.rx_attr.caps, r.caps);
    r.domain_attr.caps = narrow_caps(h.domain_attr.caps, offer.domain_attr.caps, r.caps);
    if !keeps_rma(h, offer) {
        r.caps -= RMA_LIKE;
        r.tx_attr.caps -= RMA_LIKE;
        r.rx_attr.caps -= RMA_LIKE;
        r.domain_attr.caps -= RMA_LIKE;
        r.domain_attr.mr_mode -= MR_MODE_RMA_TARGET;
    }
    r.domain_attr.mr_mode |= on_request_mr_modes(h, offer, r.caps);
    // A result without FI_MULTI_RECV honours no multi-receive flag.
    if !r.caps.contains(Caps::MULTI_RECV) {
        r.rx_attr.op_flags_supported -= OpFlags::MULTI_RECV;
    }

    r.addr_format = match (h.addr_format, offer.addr_format) {
        (AddrFormat::SockaddrIn | AddrFormat::SockaddrIn6, AddrFormat::Sockaddr) => h.addr_format,
        (AddrFormat::Str, _) => {
            // The offer's own address in the string form the result uses.
            if let Some(a) = r
                .src_addr
                .as_deref()
                .and_then(|b| crate::addr::decode_sockaddr(b).ok())
            {
                r.src_addr = Some(crate::addr::sockaddr_to_str(&a).into_bytes());
            }
            AddrFormat::Str
        }
        (_, o) => o,
    };
    if h.domain_attr.av_type != AvType::Unspec {
        r.domain_attr.av_type = h.domain_attr.av_type;
    }
    if h.domain_attr.threading != Threading::Unspec {
        r.domain_attr.threading = h.domain_attr.threading;
    }
    if h.ep_attr.mem_tag_format != 0 {
        r.ep_attr.mem_tag_format = h.ep_attr.mem_tag_format;
    }

    narrow_nonzero(&mut r.tx_attr.op_flags, h.tx_attr.op_flags);
    narrow_nonzero(&mut r.rx_attr.op_flags, h.rx_attr.op_flags);
    narrow_nonzero(&mut r.tx_attr.msg_order, h.tx_attr.msg_order);
    narrow_nonzero(&mut r.rx_attr.msg_order, h.rx_attr.msg_order);
    narrow_nonzero(&mut r.tx_attr.comp_order, h.tx_attr.comp_order);
    narrow_nonzero(&mut r.rx_attr.comp_order, h.rx_attr.comp_order);
    if h.tx_attr.tclass != 0 {
        r.tx_attr.tclass = h.tx_attr.tclass;
    }
    narrow_limits(h, &mut r);
    if h.ep_attr.rx_ctx_cnt != 0 {
        r.ep_attr.rx_ctx_cnt = h.ep_attr.rx_ctx_cnt;
    }
    if h.ep_attr.tx_ctx_cnt != 0 {
        r.ep_attr.tx_ctx_cnt = h.ep_attr.tx_ctx_cnt;
    }

    if h.ep_attr.auth_key.is_some() {
        r.ep_attr.auth_key.clone_from(&h.ep_attr.auth_key);
    }
    if h.domain_attr.auth_key.is_some() {
        r.domain_attr.auth_key.clone_from(&h.domain_attr.auth_key);
    }
    r.domain_attr.av_auth_key = h.domain_attr.av_auth_key;
    if h.domain_attr.tls.is_some() {
        r.domain_attr.tls.clone_from(&h.domain_attr.tls);
    }
    if h.src_addr.is_some() {
        r.src_addr.clone_from(&h.src_addr);
    }
    if h.dest_addr.is_some() {
        r.dest_addr.clone_from(&h.dest_addr);
    }
    r
}

/// `fi_getinfo` over a provider's offers: the offers that [`satisfies`] the
/// hints, each [`narrow`]ed to the request, in offer order. Without hints,
/// every offer unchanged.
///
/// # Errors
///
/// [`Error::NoData`] (`-FI_ENODATA`) when nothing matches.
pub fn getinfo(hints: Option<&Info>, offers: &[Info]) -> Result<Vec<Info>> {
    let out: Vec<Info> = match hints {
        None => offers.to_vec(),
        Some(h) => offers
            .iter()
            .filter(|o| satisfies(h, o))
            .map(|o| narrow(h, o))
            .collect(),
    };
    if out.is_empty() {
        Err(Error::NoData)
    } else {
        Ok(out)
    }
}

/// Is provider `prov` selected by `filter`, a string like `FI_PROVIDER`:
/// `"tcp"`, `"tcp,udp"`, or `"^shm"` (the caret excludes the whole list)?
///
/// Comparison ignores ASCII case. A layered name in the filter
/// (`"tcp;ofi_rxm"`) stands for its first component; a layered `prov` is
/// named by any of its components, so `"tcp"` selects `"tcp;ofi_rxm"` and
/// `"^ofi_rxm"` rejects it. An empty filter (or a bare `"^"`) selects all.
pub fn provider_selected(filter: &str, prov: &str) -> bool {
    let filter = filter.trim();
    let (negated, list) = match filter.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let mut names = list
        .split(',')
        .map(|n| n.split(';').next().unwrap_or_default().trim())
        .filter(|n| !n.is_empty())
        .peekable();
    if names.peek().is_none() {
        return true;
    }
    let listed = names.any(|n| prov.split(';').any(|p| p.trim().eq_ignore_ascii_case(n)));
    listed != negated
}

/// A zero mode in a sub-attribute stands for the info-level mode.
fn mode_or(specific: Mode, info: Mode) -> Mode {
    if specific.is_empty() {
        info
    } else {
        specific
    }
}

fn enum_ok<T: PartialEq>(hint: T, unspec: T, offer: T) -> bool {
    hint == unspec || hint == offer
}

fn addr_format_ok(hint: AddrFormat, offer: AddrFormat) -> bool {
    use AddrFormat::{Sockaddr, SockaddrIn, SockaddrIn6, Str, Unspec};
    hint == Unspec
        || hint == offer
        || matches!(
            (hint, offer),
            (Sockaddr, SockaddrIn | SockaddrIn6)
                | (SockaddrIn | SockaddrIn6, Sockaddr)
                // Socket addresses have a string form (FI_ADDR_STR).
                | (Str, Sockaddr | SockaddrIn | SockaddrIn6)
        )
}

fn threading_ok(hint: Threading, offer: Threading) -> bool {
    hint == Threading::Unspec || offer == Threading::Safe || hint == offer
}

fn progress_ok(hint: Progress, offer: Progress) -> bool {
    match hint {
        Progress::Unspec => true,
        Progress::Auto => offer == Progress::Auto,
        Progress::Manual => matches!(offer, Progress::Manual | Progress::Auto),
    }
}

/// Tag formats are compared by width: a provider with 64 usable tag bits
/// (e.g. the generic `0xaaaa...` format) can carry any narrower layout.
fn tag_format_ok(hint: u64, offer: u64) -> bool {
    hint == 0 || hint.leading_zeros() >= offer.leading_zeros()
}

fn name_ok(hint: &Option<String>, offer: &Option<String>) -> bool {
    match hint.as_deref() {
        None | Some("") => true,
        Some(h) => offer.as_deref() == Some(h),
    }
}

/// Primary caps are narrowed to the request; secondary caps are reported as
/// offered, except [`Caps::ON_REQUEST`], which only a request brings.
/// `parent` bounds the primary and on-request caps of a request that names
/// no primary caps: for an attribute, the narrowed info caps; for the info
/// itself, everything but the caps granted on request.
fn narrow_caps(hint: Caps, offer: Caps, parent: Caps) -> Caps {
    let secondary = offer.difference(Caps::PRIMARY | Caps::ON_REQUEST);
    let asked = hint.intersection(Caps::ON_REQUEST);
    if hint.intersects(Caps::PRIMARY) {
        hint.intersection(Caps::PRIMARY) | secondary | asked
    } else {
        offer
            .intersection(Caps::PRIMARY | Caps::ON_REQUEST)
            .intersection(parent)
            | secondary
            | asked
    }
}

fn narrow_nonzero<F: bitflags::Flags + Copy>(result: &mut F, hint: F) {
    if !hint.is_empty() {
        *result = hint;
    }
}

#[cfg(test)]
mod tests;
