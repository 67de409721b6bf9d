//! Runs the built `weft` binary end to end.

use std::process::{Command, Output};

mod args;
mod control_port;
mod info;
mod output;
mod runs;
mod verbs_vm;

fn weft(args: &[&str]) -> Output {
    match Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env_remove("FI_PROVIDER")
        .output()
    {
        Ok(o) => o,
        Err(e) => unreachable!("cannot run weft: {e}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
