//! The command line itself: unknown providers, bad arguments, `--help` of
//! every subcommand, shell completions.

use super::{text, weft};

#[test]
fn unknown_provider_fails() {
    let o = weft(&["info", "-p", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("weft info: no provider matches -p nope"),
        "{err}"
    );
    assert!(err.contains("tcp"), "{err}");

    let o = weft(&["pingpong", "--self", "-p", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("weft pingpong: "));
}

#[test]
fn bad_args_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["pingpong", "-I"],
        &["pingpong", "-S", "huge"],
        &["info", "--bogus"],
        &[],
        &["pingpong", "-I", "18446744073709551615"],
        &["pingpong", "-S", "0"],
        &["pingpong", "-P", "0", "127.0.0.1"],
        &["pingpong", "-B", "65536"],
        &["bw", "-W", "0"],
        &["bw", "-S", "1g"],
        &["pingpong", "--timeout", "0"],
    ] {
        let o = weft(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(text(&o.stderr).contains("Usage:"), "{args:?}");
    }
}

/// `--help` of every subcommand: exit 0, on stdout, naming its key flags.
#[test]
fn every_subcommand_has_help() {
    let cases: [(&str, &[&str]); 5] = [
        (
            "info",
            &["-p <prov>", "-e <ep_type>", "--verbose", "--list", "--json"],
        ),
        (
            "pingpong",
            &[
                "-S <size>",
                "-I <iters>",
                "-B <port>",
                "-P <port>",
                "--timeout <s>",
                "--mode",
                "--api",
                "--verify",
                "--rma <op>",
                "--self",
                "--json",
                "[DEST]",
            ],
        ),
        (
            "bw",
            &[
                "-W <window>",
                "-S <size>",
                "-I <iters>",
                "--self",
                "--json",
                "[DEST]",
            ],
        ),
        ("completions", &["bash", "zsh", "fish"]),
        ("help", &["info", "pingpong", "bw", "completions"]),
    ];
    for (sub, flags) in cases {
        for help in ["--help", "-h"] {
            let args: &[&str] = if sub == "help" { &[sub] } else { &[sub, help] };
            let o = weft(args);
            assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
            let out = text(&o.stdout);
            assert!(out.contains("Usage: weft"), "{args:?}: {out}");
            for f in flags {
                assert!(out.contains(f), "{args:?} does not name {f}: {out}");
            }
        }
    }
    // Each option's own text, and the defaults, are in the long help.
    let out = text(&weft(&["pingpong", "--help"]).stdout);
    assert!(
        out.contains("WEFT_INLINE_SPIN_US") && out.contains("[default: 47592]"),
        "{out}"
    );
    let out = text(&weft(&["bw", "--help"]).stdout);
    assert!(
        !out.contains("--rma"),
        "bw's help offers pingpong's --rma: {out}"
    );
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let o = weft(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", text(&o.stderr));
        let script = text(&o.stdout);
        assert!(
            script.contains("pingpong") && script.contains("timeout"),
            "{shell}"
        );
    }
    // Each benchmark is offered its own options only.
    let bash = text(&weft(&["completions", "bash"]).stdout);
    let opts = |sub: &str| {
        let at = bash.find(&format!("weft__{sub})")).unwrap_or_default();
        bash[at..].lines().nth(1).unwrap_or_default().to_string()
    };
    assert!(
        opts("bw").contains(" -W ") && !opts("bw").contains("--rma"),
        "{}",
        opts("bw")
    );
    assert!(opts("pingpong").contains("--rma") && !opts("pingpong").contains(" -W "));
    let o = weft(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
}
