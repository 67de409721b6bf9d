//! Tests of the matching and narrowing rules of `fi_getinfo`.

use super::*;

fn offer() -> Info {
    let mut o = Info {
        caps: Caps::MSG
            | Caps::TAGGED
            | Caps::RMA
            | Caps::READ
            | Caps::WRITE
            | Caps::SEND
            | Caps::RECV
            | Caps::REMOTE_READ
            | Caps::REMOTE_WRITE
            | Caps::LOCAL_COMM
            | Caps::REMOTE_COMM,
        addr_format: AddrFormat::SockaddrIn,
        src_addr: Some(vec![1; 16]),
        ..Info::default()
    };
    let order = MsgOrder::SAS | MsgOrder::RAW | MsgOrder::RMA_WAW;
    o.tx_attr = TxAttr {
        op_flags_supported: OpFlags::TX_BASE | OpFlags::DELIVERY_COMPLETE,
        caps: Caps::MSG | Caps::TAGGED | Caps::RMA | Caps::READ | Caps::WRITE | Caps::SEND,
        msg_order: order,
        inject_size: 64,
        size: 1024,
        iov_limit: 4,
        rma_iov_limit: 4,
        ..TxAttr::default()
    };
    o.rx_attr = RxAttr {
        op_flags_supported: OpFlags::RX_BASE | OpFlags::PEEK_FAMILY,
        caps: Caps::MSG | Caps::TAGGED | Caps::RMA | Caps::RECV | Caps::REMOTE_WRITE,
        msg_order: order,
        size: 1024,
        iov_limit: 4,
        ..RxAttr::default()
    };
    o.ep_attr = EpAttr {
        ep_type: EpType::Rdm,
        protocol: Protocol::SockTcp,
        protocol_version: 1,
        max_msg_size: 1 << 30,
        max_order_raw_size: usize::MAX,
        max_order_waw_size: usize::MAX,
        mem_tag_format: 0xaaaa_aaaa_aaaa_aaaa,
        tx_ctx_cnt: 1,
        rx_ctx_cnt: 1,
        cm_data_size: 256,
        ..EpAttr::default()
    };
    o.domain_attr = DomainAttr {
        name: Some("lo".into()),
        threading: Threading::Safe,
        control_progress: Progress::Auto,
        data_progress: Progress::Auto,
        mr_key_size: 8,
        cq_data_size: 8,
        cq_cnt: 64,
        ep_cnt: 128,
        tx_ctx_cnt: 1,
        rx_ctx_cnt: 1,
        max_ep_tx_ctx: 1,
        max_ep_rx_ctx: 1,
        mr_iov_limit: 1,
        caps: Caps::LOCAL_COMM | Caps::REMOTE_COMM,
        ..DomainAttr::default()
    };
    o.fabric_attr = FabricAttr {
        name: Some("127.0.0.0/8".into()),
        prov_name: Some("tcp".into()),
        prov_version: version(1, 0),
        api_version: API_VERSION,
    };
    o
}

fn with(f: impl FnOnce(&mut Info)) -> Info {
    let mut h = Info::default();
    f(&mut h);
    h
}

fn matches(h: &Info) -> bool {
    satisfies(h, &offer())
}

#[test]
fn no_hints_returns_every_offer_unchanged() {
    let mut second = offer();
    second.ep_attr.ep_type = EpType::Msg;
    let offers = [offer(), second];
    assert_eq!(getinfo(None, &offers).unwrap(), offers.to_vec());
    assert_eq!(getinfo(None, &[]), Err(Error::NoData));
    assert_eq!(getinfo(Some(&Info::default()), &[]), Err(Error::NoData));
}

#[test]
fn empty_hints_match_and_change_nothing() {
    assert!(matches(&Info::default()));
    assert_eq!(narrow(&Info::default(), &offer()), offer());
}

#[test]
fn unmet_request_is_no_match_not_a_weaker_one() {
    let mut o = offer();
    o.caps.remove(Caps::RMA);
    let rma = with(|h| h.caps = Caps::MSG | Caps::RMA);
    assert!(!satisfies(&rma, &o));
    assert_eq!(getinfo(Some(&rma), &[o]), Err(Error::NoData));
    let inject = with(|h| h.tx_attr.inject_size = 65);
    assert_eq!(getinfo(Some(&inject), &[offer()]), Err(Error::NoData));
    assert!(matches(&with(|h| h.tx_attr.inject_size = 64)));
}

#[test]
fn getinfo_filters_and_keeps_offer_order() {
    let mut msg = offer();
    msg.ep_attr.ep_type = EpType::Msg;
    msg.fabric_attr.name = Some("a".into());
    let mut rdm2 = offer();
    rdm2.fabric_attr.name = Some("b".into());
    let h = with(|h| h.ep_attr.ep_type = EpType::Rdm);
    let got = getinfo(Some(&h), &[offer(), msg, rdm2]).unwrap();
    let names: Vec<_> = got.iter().map(|i| i.fabric_attr.name.clone()).collect();
    assert_eq!(names, [Some("127.0.0.0/8".into()), Some("b".into())]);
}

#[test]
fn caps_are_checked_and_narrowed() {
    let h = with(|h| h.caps = Caps::MSG | Caps::TAGGED);
    assert!(matches(&h));
    let r = narrow(&h, &offer());
    let secondary = Caps::LOCAL_COMM | Caps::REMOTE_COMM;
    assert_eq!(r.caps, Caps::MSG | Caps::TAGGED | secondary);
    assert_eq!(r.tx_attr.caps, Caps::MSG | Caps::TAGGED);
    assert_eq!(r.rx_attr.caps, Caps::MSG | Caps::TAGGED);
    assert_eq!(r.domain_attr.caps, secondary);

    // Only secondary caps requested: the offer's primary caps remain.
    let h = with(|h| h.caps = Caps::LOCAL_COMM);
    assert_eq!(narrow(&h, &offer()).caps, offer().caps);
    assert!(!matches(&with(|h| h.caps = Caps::SHARED_AV)));

    // Attribute caps: checked against the attribute, narrowed on request.
    assert!(!matches(&with(|h| h.tx_attr.caps = Caps::ATOMIC)));
    assert!(!matches(&with(|h| h.rx_attr.caps = Caps::REMOTE_READ)));
    assert!(!matches(&with(|h| h.domain_attr.caps = Caps::SHARED_AV)));
    let h = with(|h| h.tx_attr.caps = Caps::MSG | Caps::SEND);
    assert_eq!(narrow(&h, &offer()).tx_attr.caps, Caps::MSG | Caps::SEND);
}

#[test]
fn required_modes_must_be_accepted() {
    let mut o = offer();
    o.mode = Mode::CONTEXT;
    assert!(!satisfies(&Info::default(), &o));
    let h = with(|h| h.mode = Mode::CONTEXT | Mode::MSG_PREFIX);
    assert!(satisfies(&h, &o));
    assert_eq!(narrow(&h, &o).mode, Mode::CONTEXT);

    // A zero tx mode means "as info.mode"; a nonzero one is its own.
    o.tx_attr.mode = Mode::CONTEXT;
    assert!(satisfies(&h, &o));
    let mut h2 = h.clone();
    h2.tx_attr.mode = Mode::MSG_PREFIX;
    assert!(!satisfies(&h2, &o));
    o.domain_attr.mode = Mode::CONTEXT2;
    assert!(!satisfies(&h, &o));
}

#[test]
fn endpoint_type_protocol_and_address_format() {
    assert!(!matches(&with(|h| h.ep_attr.ep_type = EpType::Msg)));
    assert!(matches(&with(|h| h.ep_attr.ep_type = EpType::Rdm)));
    assert!(!matches(&with(|h| h.ep_attr.protocol = Protocol::Udp)));
    assert!(matches(&with(|h| h.ep_attr.protocol = Protocol::SockTcp)));
    assert!(!matches(&with(|h| h.ep_attr.protocol_version = 2)));
    assert!(!matches(&with(|h| h.addr_format = AddrFormat::SockaddrIn6)));
    // Socket addresses have a string form (FI_ADDR_STR): the result
    // carries it, the offer's own address included.
    let h = with(|h| h.addr_format = AddrFormat::Str);
    assert!(matches(&h));
    let r = narrow(&h, &offer());
    assert_eq!(r.addr_format, AddrFormat::Str);
    assert_eq!(r.src_addr, offer().src_addr, "not a socket address: kept");
    let h = with(|h| h.addr_format = AddrFormat::Sockaddr);
    assert_eq!(narrow(&h, &offer()).addr_format, AddrFormat::SockaddrIn);
    let mut o = offer();
    o.addr_format = AddrFormat::Sockaddr;
    let h = with(|h| h.addr_format = AddrFormat::SockaddrIn6);
    assert!(satisfies(&h, &o));
    assert_eq!(narrow(&h, &o).addr_format, AddrFormat::SockaddrIn6);
}

#[test]
fn av_type_unspec_offer_accepts_any() {
    let h = with(|h| h.domain_attr.av_type = AvType::Table);
    assert!(matches(&h));
    assert_eq!(narrow(&h, &offer()).domain_attr.av_type, AvType::Table);
    let mut o = offer();
    o.domain_attr.av_type = AvType::Map;
    assert!(!satisfies(&h, &o));
}

#[test]
fn threading_safe_satisfies_anything_else_equal() {
    let h = with(|h| h.domain_attr.threading = Threading::Domain);
    assert!(matches(&h));
    assert_eq!(
        narrow(&h, &offer()).domain_attr.threading,
        Threading::Domain
    );
    let mut o = offer();
    o.domain_attr.threading = Threading::Domain;
    assert!(satisfies(&h, &o));
    assert!(!satisfies(
        &with(|h| h.domain_attr.threading = Threading::Safe),
        &o
    ));
    let ep = with(|h| h.domain_attr.threading = Threading::Endpoint);
    assert!(!satisfies(&ep, &o));
}

#[test]
fn manual_requests_accept_auto_but_not_the_reverse() {
    let manual = with(|h| {
        h.domain_attr.data_progress = Progress::Manual;
        h.domain_attr.control_progress = Progress::Manual;
    });
    assert!(matches(&manual));
    // The result tells the truth about what the provider does.
    assert_eq!(
        narrow(&manual, &offer()).domain_attr.data_progress,
        Progress::Auto
    );
    let mut o = offer();
    o.domain_attr.data_progress = Progress::Manual;
    assert!(satisfies(&manual, &o));
    assert!(!satisfies(
        &with(|h| h.domain_attr.data_progress = Progress::Auto),
        &o
    ));
    o.domain_attr.control_progress = Progress::Manual;
    let auto = with(|h| h.domain_attr.control_progress = Progress::Auto);
    assert!(!satisfies(&auto, &o));
}

#[test]
fn names_must_agree() {
    assert!(matches(&with(
        |h| h.fabric_attr.name = Some("127.0.0.0/8".into())
    )));
    assert!(!matches(&with(
        |h| h.fabric_attr.name = Some("10.0.0.0/8".into())
    )));
    assert!(matches(&with(|h| h.fabric_attr.name = Some(String::new()))));
    assert!(matches(&with(|h| h.domain_attr.name = Some("lo".into()))));
    assert!(!matches(
        &with(|h| h.domain_attr.name = Some("eth0".into()))
    ));
    for (filter, want) in [
        ("TCP", true),
        ("udp,tcp", true),
        ("^tcp", false),
        ("udp", false),
    ] {
        let h = with(|h| h.fabric_attr.prov_name = Some(filter.into()));
        assert_eq!(matches(&h), want, "{filter}");
    }
    let mut anonymous = offer();
    anonymous.fabric_attr.name = None;
    let h = with(|h| h.fabric_attr.name = Some("127.0.0.0/8".into()));
    assert!(!satisfies(&h, &anonymous));
}

#[test]
fn mr_mode_requirements_must_be_supported() {
    let mut o = offer();
    o.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::LOCAL;
    // mr_mode 0 in hints: the app supports no requirement at all.
    assert!(!satisfies(&Info::default(), &o));
    let h = with(|h| h.domain_attr.mr_mode = MrMode::PROV_KEY);
    assert!(!satisfies(&h, &o));
    o.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
    let all = MrMode::LOCAL | MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::ALLOCATED;
    let h = with(|h| h.domain_attr.mr_mode = all);
    assert!(satisfies(&h, &o));
    assert_eq!(narrow(&h, &o).domain_attr.mr_mode, o.domain_attr.mr_mode);
    // An offer needing nothing suits any app.
    assert!(matches(&h));
}

#[test]
fn optional_modes_stay_only_for_hints_that_accept_them() {
    let mut o = offer();
    o.mode = Mode::RX_CQ_DATA;
    o.rx_attr.mode = Mode::RX_CQ_DATA;
    // Hints without the bit still match, and the result is without it.
    let plain = Info::default();
    assert!(satisfies(&plain, &o));
    let r = narrow(&plain, &o);
    assert!(!r.mode.contains(Mode::RX_CQ_DATA));
    assert!(!r.rx_attr.mode.contains(Mode::RX_CQ_DATA));
    // Hints accepting it keep it.
    let h = with(|h| h.mode = Mode::RX_CQ_DATA);
    let r = narrow(&h, &o);
    assert!(r.mode.contains(Mode::RX_CQ_DATA) && r.rx_attr.mode.contains(Mode::RX_CQ_DATA));
    // Other mode bits remain requirements.
    o.mode |= Mode::CONTEXT;
    assert!(!satisfies(&plain, &o));
}

#[test]
fn rma_target_mr_bits_bind_only_apps_that_want_rma() {
    let mut o = offer();
    o.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
    let rma_like = Caps::RMA | Caps::READ | Caps::WRITE | Caps::REMOTE_READ | Caps::REMOTE_WRITE;
    // Asking for messages only: the bits are not required, and the
    // result has neither them nor RMA.
    let h = with(|h| h.caps = Caps::TAGGED);
    assert!(satisfies(&h, &o));
    let r = narrow(&h, &o);
    assert_eq!(r.domain_attr.mr_mode, MrMode::empty());
    assert!(!r.caps.intersects(rma_like) && !r.tx_attr.caps.intersects(rma_like));
    // Empty caps and mr_mode 0: everything but RMA.
    let r = narrow(&Info::default(), &o);
    assert!(satisfies(&Info::default(), &o));
    assert!(r.caps.contains(Caps::TAGGED) && !r.caps.intersects(rma_like));
    assert!(!r.rx_attr.caps.intersects(rma_like));
    // Empty caps and the bits accepted: the whole offer.
    let h = with(|h| h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR);
    assert_eq!(narrow(&h, &o), o);
    // Asking for RMA without accepting the bits: no match.
    let h = with(|h| h.caps = Caps::RMA);
    assert!(!satisfies(&h, &o));
    let h = with(|h| {
        h.caps = Caps::RMA | Caps::WRITE;
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR | MrMode::LOCAL;
    });
    assert!(satisfies(&h, &o));
    assert_eq!(narrow(&h, &o).domain_attr.mr_mode, o.domain_attr.mr_mode);
}

#[test]
fn limits_above_the_offer_are_no_match() {
    type Bump = fn(&mut Info, &Info);
    let bumps: [Bump; 20] = [
        |h, o| h.ep_attr.max_msg_size = o.ep_attr.max_msg_size + 1,
        |h, o| h.ep_attr.max_order_war_size = o.ep_attr.max_order_war_size + 1,
        |h, o| h.ep_attr.tx_ctx_cnt = o.ep_attr.tx_ctx_cnt + 1,
        |h, o| h.ep_attr.rx_ctx_cnt = o.ep_attr.rx_ctx_cnt + 1,
        |h, o| h.ep_attr.cm_data_size = o.ep_attr.cm_data_size + 1,
        |h, o| h.tx_attr.inject_size = o.tx_attr.inject_size + 1,
        |h, o| h.tx_attr.size = o.tx_attr.size + 1,
        |h, o| h.tx_attr.iov_limit = o.tx_attr.iov_limit + 1,
        |h, o| h.tx_attr.rma_iov_limit = o.tx_attr.rma_iov_limit + 1,
        |h, o| h.rx_attr.size = o.rx_attr.size + 1,
        |h, o| h.rx_attr.iov_limit = o.rx_attr.iov_limit + 1,
        |h, o| h.rx_attr.total_buffered_recv = o.rx_attr.total_buffered_recv + 1,
        |h, o| h.domain_attr.mr_key_size = o.domain_attr.mr_key_size + 1,
        |h, o| h.domain_attr.cq_data_size = o.domain_attr.cq_data_size + 1,
        |h, o| h.domain_attr.cq_cnt = o.domain_attr.cq_cnt + 1,
        |h, o| h.domain_attr.ep_cnt = o.domain_attr.ep_cnt + 1,
        |h, o| h.domain_attr.tx_ctx_cnt = o.domain_attr.tx_ctx_cnt + 1,
        |h, o| h.domain_attr.max_ep_tx_ctx = o.domain_attr.max_ep_tx_ctx + 1,
        |h, o| h.domain_attr.max_ep_rx_ctx = o.domain_attr.max_ep_rx_ctx + 1,
        |h, o| h.domain_attr.mr_iov_limit = o.domain_attr.mr_iov_limit + 1,
    ];
    let o = offer();
    for (i, bump) in bumps.iter().enumerate() {
        let mut h = Info::default();
        bump(&mut h, &o);
        assert!(!satisfies(&h, &o), "limit #{i} above the offer matched");
    }
    // usize::MAX ("any size") satisfies any request.
    assert!(matches(
        &with(|h| h.ep_attr.max_order_raw_size = usize::MAX)
    ));
}

/// A scalable endpoint's context counts go up to the domain's
/// `max_ep_*_ctx`, not the offer's default count, and come back as asked.
#[test]
fn context_counts_reach_the_scalable_maxima() {
    let mut o = offer();
    o.domain_attr.max_ep_tx_ctx = 8;
    o.domain_attr.max_ep_rx_ctx = 4;
    let mut h = Info::default();
    h.ep_attr.tx_ctx_cnt = 8;
    h.ep_attr.rx_ctx_cnt = 4;
    assert!(satisfies(&h, &o));
    let r = narrow(&h, &o);
    assert_eq!((r.ep_attr.tx_ctx_cnt, r.ep_attr.rx_ctx_cnt), (8, 4));
    h.ep_attr.rx_ctx_cnt = 5;
    assert!(!satisfies(&h, &o), "more receive contexts than offered");
    h.ep_attr.rx_ctx_cnt = 4;
    h.ep_attr.tx_ctx_cnt = 9;
    assert!(!satisfies(&h, &o), "more transmit contexts than offered");
}

#[test]
fn sizes_narrow_to_the_request() {
    let h = with(|h| {
        h.tx_attr.size = 128;
        h.rx_attr.size = 256;
        h.tx_attr.inject_size = 16;
        h.ep_attr.max_msg_size = 4096;
        h.tx_attr.tclass = 0x20;
    });
    let r = narrow(&h, &offer());
    assert_eq!(
        (
            r.tx_attr.size,
            r.rx_attr.size,
            r.tx_attr.inject_size,
            r.ep_attr.max_msg_size
        ),
        (128, 256, 16, 4096)
    );
    assert_eq!(r.tx_attr.iov_limit, offer().tx_attr.iov_limit);
    assert_eq!(r.tx_attr.tclass, 0x20);
}

#[test]
fn ordering_requests_must_be_offered() {
    let h = with(|h| h.tx_attr.msg_order = MsgOrder::SAS);
    assert!(matches(&h));
    assert_eq!(narrow(&h, &offer()).tx_attr.msg_order, MsgOrder::SAS);
    assert_eq!(
        narrow(&h, &offer()).rx_attr.msg_order,
        offer().rx_attr.msg_order
    );
    assert!(!matches(&with(|h| h.rx_attr.msg_order = MsgOrder::WAR)));
    assert!(!matches(
        &with(|h| h.tx_attr.comp_order = CompOrder::STRICT)
    ));
    let mut o = offer();
    o.rx_attr.comp_order = CompOrder::STRICT;
    let h = with(|h| h.rx_attr.comp_order = CompOrder::STRICT);
    assert!(satisfies(&h, &o));
    assert!(!satisfies(
        &with(|h| h.rx_attr.comp_order = CompOrder::DATA),
        &o
    ));
}

#[test]
fn tag_format_is_compared_by_width() {
    let h = with(|h| h.ep_attr.mem_tag_format = 0x30ff);
    assert!(matches(&h));
    assert_eq!(narrow(&h, &offer()).ep_attr.mem_tag_format, 0x30ff);
    let mut o = offer();
    o.ep_attr.mem_tag_format = 0xffff;
    assert!(!satisfies(
        &with(|h| h.ep_attr.mem_tag_format = 1 << 40),
        &o
    ));
}

#[test]
fn op_flags_and_addresses_pass_through() {
    let h = with(|h| {
        h.tx_attr.op_flags = OpFlags::COMPLETION | OpFlags::DELIVERY_COMPLETE;
        h.rx_attr.op_flags = OpFlags::COMPLETION;
        h.dest_addr = Some(vec![7; 16]);
    });
    let r = getinfo(Some(&h), &[offer()]).unwrap().remove(0);
    assert_eq!(r.tx_attr.op_flags, h.tx_attr.op_flags);
    assert_eq!(r.rx_attr.op_flags, OpFlags::COMPLETION);
    assert_eq!(r.dest_addr, h.dest_addr);
    // No src_addr in the hints: the provider's own address stays.
    assert_eq!(r.src_addr, offer().src_addr);
    let h = with(|h| h.src_addr = Some(vec![9; 16]));
    assert_eq!(narrow(&h, &offer()).src_addr, Some(vec![9; 16]));
}

#[test]
fn provider_selection_strings() {
    assert!(provider_selected("tcp", "tcp"));
    assert!(provider_selected("TCP", "tcp"));
    assert!(provider_selected("tcp", "TCP"));
    assert!(!provider_selected("^tcp", "tcp"));
    assert!(provider_selected("^tcp", "udp"));
    assert!(!provider_selected("^shm,tcp", "tcp"));
    assert!(provider_selected("udp,tcp", "tcp"));
    assert!(provider_selected(" udp , tcp ", "tcp"));
    assert!(!provider_selected("udp,shm", "tcp"));
    assert!(provider_selected("tcp;ofi_rxm", "tcp"));
    assert!(!provider_selected("udp;ofi_rxd", "tcp"));
    assert!(provider_selected("tcp", "tcp;ofi_rxm"));
    assert!(!provider_selected("^ofi_rxm", "tcp;ofi_rxm"));
    assert!(provider_selected("", "tcp"));
    assert!(provider_selected("^", "tcp"));
    assert!(!provider_selected("tcp", ""));
    assert!(!provider_selected("tc", "tcp"));
}

#[test]
fn op_flags_the_offer_would_ignore_match_nothing() {
    for (tx, rx) in [
        (OpFlags::FENCE, OpFlags::empty()),
        (OpFlags::MULTICAST, OpFlags::empty()),
        (OpFlags::COMMIT_COMPLETE, OpFlags::empty()),
        (OpFlags::MATCH_COMPLETE, OpFlags::empty()),
        (OpFlags::empty(), OpFlags::MULTI_RECV),
    ] {
        let h = with(|h| {
            h.tx_attr.op_flags = tx;
            h.rx_attr.op_flags = rx;
        });
        assert!(!satisfies(&h, &offer()), "{tx:?} / {rx:?} matched");
    }
    let h = with(|h| h.tx_attr.op_flags = OpFlags::INJECT_COMPLETE | OpFlags::COMPLETION);
    assert!(satisfies(&h, &offer()));
}

#[test]
fn auth_keys_need_an_offer_that_takes_them_and_pass_through() {
    let mut keyed = offer();
    keyed.domain_attr.max_ep_auth_key = 1;
    let h = with(|h| h.ep_attr.auth_key = Some(b"job-a".to_vec()));
    assert!(!satisfies(&h, &offer()), "an offer without keys");
    assert!(satisfies(&h, &keyed));
    let r = narrow(&h, &keyed);
    assert_eq!(r.ep_attr.auth_key.as_deref(), Some(&b"job-a"[..]));
    assert_eq!(r.domain_attr.auth_key, None);
    let h = with(|h| h.domain_attr.auth_key = Some(b"job-b".to_vec()));
    assert!(!satisfies(&h, &offer()));
    assert_eq!(
        narrow(&h, &keyed).domain_attr.auth_key.as_deref(),
        Some(&b"job-b"[..])
    );
    // Sizes the provider does not take match nothing.
    for bad in [Vec::new(), vec![0; crate::auth::MAX_KEY_LEN + 1]] {
        assert!(!satisfies(
            &with(|h| h.ep_attr.auth_key = Some(bad.clone())),
            &keyed
        ));
        assert!(!satisfies(
            &with(|h| h.domain_attr.auth_key = Some(bad.clone())),
            &keyed
        ));
    }
    // No key asked for: offers with and without keys both match, and the
    // result carries none.
    assert!(matches(&Info::default()));
    assert_eq!(narrow(&Info::default(), &keyed).ep_attr.auth_key, None);
    assert!(!satisfies(
        &with(|h| h.domain_attr.max_ep_auth_key = 2),
        &keyed
    ));
    let text = format_info(
        &narrow(
            &with(|h| h.ep_attr.auth_key = Some(b"secret".to_vec())),
            &keyed,
        ),
        true,
    );
    assert!(text.contains("auth_key_size: 6"), "{text}");
    assert!(!text.contains("secret"));
}

#[test]
fn tls_needs_an_offer_that_runs_it_and_passes_through() {
    let mut capable = offer();
    capable.domain_attr.tls_capable = true;
    let files = crate::tls::TlsFiles::new("c.pem", "k.pem", "ca.pem");
    let h = with(|h| h.domain_attr.tls = Some(files.clone()));
    assert!(!satisfies(&h, &offer()), "an offer without TLS");
    assert!(satisfies(&h, &capable));
    assert_eq!(narrow(&h, &capable).domain_attr.tls, Some(files.clone()));
    let asks = with(|h| h.domain_attr.tls_capable = true);
    assert!(!satisfies(&asks, &offer()));
    assert!(satisfies(&asks, &capable));
    // Not asked for: both match, and the result names no files.
    assert!(satisfies(&Info::default(), &capable));
    assert_eq!(narrow(&Info::default(), &capable).domain_attr.tls, None);
    let text = format_info(&narrow(&h, &capable), true);
    assert!(text.contains("tls_capable: 1"), "{text}");
    assert!(text.contains("cert=c.pem key=k.pem ca=ca.pem"), "{text}");
}

#[test]
fn rma_events_and_their_mr_modes_come_on_request() {
    let mut o = offer();
    o.caps |= Caps::RMA_EVENT;
    o.rx_attr.caps |= Caps::RMA_EVENT;
    let both = MrMode::RMA_EVENT | MrMode::ENDPOINT;
    // Not asked for: no cap, and no mode bit required of anyone.
    for h in [Info::default(), with(|h| h.caps = Caps::MSG | Caps::RMA)] {
        assert!(satisfies(&h, &o));
        let r = narrow(&h, &o);
        assert!(!r.caps.contains(Caps::RMA_EVENT), "{:?}", h.caps);
        assert!(!r.rx_attr.caps.contains(Caps::RMA_EVENT));
        assert_eq!(r.domain_attr.mr_mode, MrMode::empty());
    }
    // Asked for: in the info and the receive side (the only side that
    // offers it), and still no mode unless the hints name one.
    let h = with(|h| h.caps = Caps::MSG | Caps::RMA | Caps::RMA_EVENT);
    let r = narrow(&h, &o);
    assert!(r.caps.contains(Caps::RMA_EVENT) && r.rx_attr.caps.contains(Caps::RMA_EVENT));
    assert!(!r.tx_attr.caps.contains(Caps::RMA_EVENT));
    assert_eq!(r.domain_attr.mr_mode, MrMode::empty());
    // Modes the hints accept are granted; FI_MR_RMA_EVENT only with the cap.
    let h = with(|h| {
        h.caps = Caps::RMA | Caps::RMA_EVENT;
        h.domain_attr.mr_mode = both | MrMode::PROV_KEY;
    });
    assert_eq!(narrow(&h, &o).domain_attr.mr_mode, both);
    let h = with(|h| {
        h.caps = Caps::RMA;
        h.domain_attr.mr_mode = both;
    });
    assert_eq!(narrow(&h, &o).domain_attr.mr_mode, MrMode::ENDPOINT);
    // Without RMA in the result, regions are of no use: no mode.
    let h = with(|h| {
        h.caps = Caps::TAGGED;
        h.domain_attr.mr_mode = both;
    });
    assert_eq!(narrow(&h, &o).domain_attr.mr_mode, MrMode::empty());
    // An offer that cannot see remote accesses: the cap matches nothing
    // and the modes are never granted.
    let plain = offer();
    assert!(!satisfies(
        &with(|h| h.caps = Caps::RMA | Caps::RMA_EVENT),
        &plain
    ));
    let h = with(|h| {
        h.caps = Caps::RMA;
        h.domain_attr.mr_mode = both;
    });
    assert!(satisfies(&h, &plain));
    assert_eq!(narrow(&h, &plain).domain_attr.mr_mode, MrMode::empty());
}

#[test]
fn caps_granted_on_request_follow_the_info_into_the_attributes() {
    let mut o = offer();
    o.caps |= Caps::SOURCE | Caps::SOURCE_ERR;
    o.rx_attr.caps |= Caps::SOURCE | Caps::SOURCE_ERR;
    let h = with(|h| h.caps = Caps::TAGGED | Caps::SOURCE | Caps::SOURCE_ERR);
    let r = narrow(&h, &o);
    assert!(r.caps.contains(Caps::SOURCE_ERR));
    assert!(r.rx_attr.caps.contains(Caps::SOURCE_ERR));
    assert!(
        !r.tx_attr.caps.contains(Caps::SOURCE_ERR),
        "not offered there"
    );
    let r = narrow(&with(|h| h.caps = Caps::TAGGED), &o);
    assert!(!r.caps.contains(Caps::SOURCE_ERR) && !r.rx_attr.caps.contains(Caps::SOURCE_ERR));
}
