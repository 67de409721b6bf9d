//! `weft info`: fi_info for Weft's providers.

use std::io::Write;

use crate::args::InfoArgs;
use crate::fail::{Context, Failure, Res};

/// Provider names in offer order, without repeats, as `FI_PROVIDER` leaves
/// them.
fn available() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for i in weft::all_offers() {
        let n = i.fabric_attr.prov_name.unwrap_or_default();
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

/// What the user asked for, in their own words, for error messages.
fn asked(a: &InfoArgs) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &a.prov {
        parts.push(format!("-p {p}"));
    }
    if let Some(e) = a.ep_type {
        parts.push(format!("-e {}", e.fi_name()));
    }
    if parts.is_empty() {
        "the request".into()
    } else {
        parts.join(" ")
    }
}

fn no_match(a: &InfoArgs) -> Failure {
    let avail = available();
    let avail = if avail.is_empty() {
        "none".to_string()
    } else {
        avail.join(", ")
    };
    let mut what = format!("no provider matches {} (available: {avail}", asked(a));
    if let Ok(f) = std::env::var("FI_PROVIDER") {
        what.push_str(&format!("; FI_PROVIDER={f}"));
    }
    what.push(')');
    if let Some(reason) = a.prov.as_deref().and_then(weft::provider_unavailable) {
        what.push_str(&format!(
            "; {}: {reason}",
            a.prov.as_deref().unwrap_or_default()
        ));
    }
    Failure::new(what, weft::Error::NoData)
}

pub fn run(a: &InfoArgs) -> Res<()> {
    let mut out = std::io::stdout().lock();
    if a.list && a.prov.is_none() && a.ep_type.is_none() {
        let names = available();
        if names.is_empty() {
            return Err(no_match(a));
        }
        for n in names {
            writeln!(out, "{n}").ctx("write")?;
        }
        return Ok(());
    }

    let hints = (a.prov.is_some() || a.ep_type.is_some()).then(|| {
        let mut h = weft::Info::default();
        h.fabric_attr.prov_name.clone_from(&a.prov);
        if let Some(e) = a.ep_type {
            h.ep_attr.ep_type = e;
        }
        h
    });
    let infos = match weft::getinfo(hints.as_ref()) {
        Ok(v) => v,
        Err(weft::Error::NoData) => return Err(no_match(a)),
        Err(e) => return Err(Failure::new("getinfo", e)),
    };
    if a.list {
        let mut seen: Vec<String> = Vec::new();
        for i in infos {
            let n = i.fabric_attr.prov_name.unwrap_or_default();
            if !seen.contains(&n) {
                writeln!(out, "{n}").ctx("write")?;
                seen.push(n);
            }
        }
        return Ok(());
    }
    for i in &infos {
        out.write_all(weft::format_info(i, a.verbose).as_bytes())
            .ctx("write")?;
    }
    Ok(())
}
