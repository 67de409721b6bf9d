use super::*;

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// The long help of a subcommand, as `weft <sub> --help` prints it.
fn help(sub: &str) -> String {
    match parse([sub, "--help"]) {
        Err(s) if s.is_help() => s.msg,
        other => unreachable!("{sub} --help: {other:?}"),
    }
}

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn sizes() {
    assert_eq!(parse_sizes("64").unwrap(), vec![64]);
    assert_eq!(parse_sizes("4k").unwrap(), vec![4096]);
    assert_eq!(parse_sizes("1M").unwrap(), vec![1 << 20]);
    assert_eq!(parse_sizes("all").unwrap(), ALL_SIZES.to_vec());
    assert!(parse_sizes("0").is_err());
    assert!(parse_sizes("2g").is_err());
    assert!(parse_sizes("x").is_err());
}

#[test]
fn pingpong_options() {
    let c = parse(argv(
        "pingpong -e msg -S 1k -I 5 -P 9000 --mode busy-poll --api async --verify 10.0.0.1",
    ))
    .unwrap();
    let Command::Pingpong(a) = c else {
        unreachable!()
    };
    assert_eq!(a.ep_type, EpType::Msg);
    assert_eq!(a.sizes, vec![1024]);
    assert_eq!(a.iters, 5);
    assert_eq!(a.dst_port, Some(9000));
    assert_eq!(a.mode, WaitMode::BusyPoll);
    assert_eq!(a.api, Api::Async);
    assert!(a.verify);
    assert_eq!(a.dest.as_deref(), Some("10.0.0.1"));
}

#[test]
fn defaults_match_perf_args_default() {
    assert_eq!(perf("pingpong"), PerfArgs::default());
    assert_eq!(perf("bw"), PerfArgs::default());
    // As before clap: a repeated option takes the last value.
    assert_eq!(perf("pingpong -I 5 -I 6").iters, 6);
    assert!(perf("pingpong -c").verify);
    assert!(perf("bw --json --self").json);
}

#[test]
fn dgram() {
    let Command::Pingpong(a) = parse(argv("pingpong -p verbs -e dgram -S 1k 10.66.0.1")).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(a.ep_type, EpType::Dgram);
    assert_eq!((a.sizes.clone(), a.all_sizes), (vec![1024], false));
    let Command::Bw(a) = parse(argv("bw -e DGRAM -S all -W 8")).unwrap() else {
        unreachable!()
    };
    assert_eq!((a.ep_type, a.all_sizes, a.window), (EpType::Dgram, true, 8));
    let Command::Info(i) = parse(argv("info -p verbs -e dgram")).unwrap() else {
        unreachable!()
    };
    assert_eq!(i.ep_type, Some(EpType::Dgram));
    assert_eq!(i.prov.as_deref(), Some("verbs"));
    let e = parse(argv("pingpong -e sock_dgram")).unwrap_err();
    assert!(e.msg.contains("rdm, msg or dgram"), "{e:?}");
    assert!(help("pingpong").contains("rdm|msg|dgram"));
}

#[test]
fn rma() {
    let Command::Pingpong(a) =
        parse(argv("pingpong -p verbs -e msg --rma write 10.66.0.1")).unwrap()
    else {
        unreachable!()
    };
    assert_eq!(a.rma, Some(Rma::Write));
    let Command::Pingpong(a) = parse(argv("pingpong --rma read")).unwrap() else {
        unreachable!()
    };
    assert_eq!(a.rma, Some(Rma::Read));
    assert_eq!(PerfArgs::default().rma, None);
    let e = parse(argv("pingpong --rma atomic")).unwrap_err();
    assert!(e.msg.contains("write or read"), "{e:?}");
    assert!(parse(argv("pingpong --rma")).is_err());
    let e = parse(argv("bw --rma write")).unwrap_err();
    assert!(e.msg.contains("pingpong option"), "{e:?}");
    let e = parse(argv("bw --rma")).unwrap_err();
    assert!(e.msg.contains("pingpong option"), "{e:?}");
}

#[test]
fn errors() {
    assert!(parse(argv("")).is_err());
    assert!(parse(argv("frob")).is_err());
    assert!(parse(argv("pingpong -I")).is_err());
    assert!(parse(argv("pingpong -I 0")).is_err());
    assert!(parse(argv("pingpong -W 4")).is_err());
    assert!(parse(argv("pingpong --self 1.2.3.4")).is_err());
    assert!(parse(argv("info -x")).is_err());
    assert!(matches!(parse(argv("bw -W 4")), Ok(Command::Bw(a)) if a.window == 4));
    assert!(parse(argv("pingpong -h")).is_err_and(|s| s.is_help()));
    // Mistakes are not help, and exit 2.
    assert!(parse(argv("")).is_err_and(|s| !s.is_help()));
    assert!(parse(argv("pingpong -I 0")).is_err_and(|s| !s.is_help()));
    assert_eq!(
        err("pingpong --self 1.2.3.4"),
        "--self runs both sides locally: give no destination"
    );
    assert!(err("pingpong -W 4").contains("a bw option"));
    assert_eq!(
        err("pingpong --mode lazy"),
        "--mode lazy: use interrupt, busy-poll or inline"
    );
    assert_eq!(
        err("pingpong --api sync"),
        "--api sync: use post, async or pool"
    );
    assert!(
        matches!(parse(argv("pingpong --api pool")), Ok(Command::Pingpong(a)) if a.api == Api::Pool)
    );
    assert!(err("pingpong --api pool --rma write").contains("messages only"));
    assert!(err("pingpong --rma read --api pool").contains("messages only"));
    assert!(matches!(parse(argv("bw --api pool")), Ok(Command::Bw(a)) if a.api == Api::Pool));
    assert_eq!(err("pingpong -I"), "option -I needs a value");
    assert_eq!(err("info -p"), "option -p needs a value");
}

/// The message of the usage error `line` gives.
fn err(line: &str) -> String {
    match parse(argv(line)) {
        Err(s) if !s.is_help() => s.msg,
        other => unreachable!("{line}: accepted as {other:?}"),
    }
}

fn perf(line: &str) -> PerfArgs {
    match parse(argv(line)) {
        Ok(Command::Pingpong(a) | Command::Bw(a)) => a,
        other => unreachable!("{line}: {other:?}"),
    }
}

#[test]
fn iteration_counts_are_bounded() {
    assert_eq!(
        err("pingpong -I 18446744073709551615"),
        "-I 18446744073709551615: expected an integer from 1 to 1000000000"
    );
    assert_eq!(
        err("pingpong -I 1000000001"),
        "-I 1000000001: expected an integer from 1 to 1000000000"
    );
    assert_eq!(
        err("pingpong -I 0"),
        "-I 0: expected an integer from 1 to 1000000000"
    );
    assert_eq!(
        err("pingpong -I -5"),
        "-I -5: expected an integer from 1 to 1000000000"
    );
    assert_eq!(
        err("pingpong -I 1e3"),
        "-I 1e3: expected an integer from 1 to 1000000000"
    );
    assert_eq!(perf("pingpong -I 1000000000").iters, MAX_ITERS);
    // The largest count still leaves room for the warm-up on top.
    let p = crate::negotiate::Params::from_args(
        crate::negotiate::Kind::Pingpong,
        &perf("pingpong -I 1000000000"),
    );
    assert_eq!(p.total().ok(), Some(1_100_000_000));
}

#[test]
fn ports_are_checked() {
    assert_eq!(
        err("pingpong -P 0 host"),
        "-P 0: expected a port number from 1 to 65535"
    );
    assert_eq!(
        err("pingpong -P 65536 host"),
        "-P 65536: expected a port number from 1 to 65535"
    );
    assert_eq!(
        err("pingpong -B 99999"),
        "-B 99999: expected a port number from 0 to 65535"
    );
    assert_eq!(
        err("bw -B http"),
        "-B http: expected a port number from 0 to 65535"
    );
    assert_eq!(
        err("pingpong -P -1 host"),
        "-P -1: expected a port number from 1 to 65535"
    );
    assert_eq!(perf("pingpong -B 0").src_port, Some(0));
    assert_eq!(perf("pingpong -P 65535 h").dst_port, Some(65535));
}

#[test]
fn sizes_are_checked() {
    assert_eq!(
        err("pingpong -S 0"),
        "-S 0: expected 'all' or a size from 1 to 1g (e.g. 64, 4k, 1m)"
    );
    for bad in ["18446744073709551615g", "1025m", "2g", "k", "-1", "4kk"] {
        assert!(err(&format!("pingpong -S {bad}")).starts_with(&format!("-S {bad}: ")));
    }
    assert_eq!(perf("pingpong -S 1g").sizes, vec![MAX_SIZE]);
}

#[test]
fn bw_windows_are_bounded() {
    assert_eq!(err("bw -W 0"), "-W 0: expected an integer from 1 to 65536");
    assert_eq!(
        err("bw -W 65537"),
        "-W 65537: expected an integer from 1 to 65536"
    );
    // 64 x 1 GiB receive buffers would be 64 GiB on the server.
    assert_eq!(
        err("bw -S 1g"),
        "-W 64 with -S 1073741824: bw would keep more than 1g in flight; \
         use -W 1 or less at that size"
    );
    assert_eq!(
        err("bw -S 1m -W 1025"),
        "-W 1025 with -S 1048576: bw would keep more than 1g in flight; \
         use -W 1024 or less at that size"
    );
    assert_eq!(perf("bw -S 1m -W 1024").window, 1024);
    assert_eq!(perf("bw -S 16m").window, 64);
    assert_eq!(perf("bw -S 1g -W 1").sizes, vec![MAX_SIZE]);
    // The window is bw's alone: a pingpong of 1 GiB is fine.
    assert_eq!(perf("pingpong -S 1g").sizes, vec![MAX_SIZE]);
    assert_eq!(bw_in_flight(1024, &[1 << 20]), Ok(()));
    assert_eq!(
        bw_in_flight(MAX_WINDOW, &[MAX_SIZE]),
        Err(
            "-W 65536 with -S 1073741824: bw would keep more than 1g in flight; \
             use -W 1 or less at that size"
                .into()
        )
    );
}

#[test]
fn timeouts_are_checked() {
    assert_eq!(PerfArgs::default().ctrl_timeout, Duration::from_secs(10));
    assert_eq!(
        perf("pingpong --timeout 2.5").ctrl_timeout,
        Duration::from_millis(2500)
    );
    assert_eq!(
        perf("bw --timeout 0.1 h").ctrl_timeout,
        Duration::from_millis(100)
    );
    assert_eq!(perf("bw --timeout 3600").ctrl_timeout, MAX_CTRL_TIMEOUT);
    for bad in ["0", "0.05", "-1", "3601", "nan", "inf", "1e400", "ten", ""] {
        assert_eq!(
            err(&format!("pingpong --timeout {bad}")),
            if bad.is_empty() {
                "option --timeout needs a value".to_string()
            } else {
                format!("--timeout {bad}: expected seconds from 0.1 to 3600 (e.g. 10, 2.5)")
            }
        );
    }
    assert!(help("pingpong").contains("--timeout <s>"));
}

#[test]
fn completions_name_every_subcommand() {
    let mut out = Vec::new();
    completions(Shell::Bash, &mut out);
    let script = String::from_utf8_lossy(&out);
    for sub in ["info", "pingpong", "bw", "completions"] {
        assert!(script.contains(sub), "{sub}");
    }
}
