//! `weft info`: fi_info for Weft's providers.

use std::io::Write;

use crate::args::InfoArgs;
use crate::fail::{Context, Failure, Res};
use crate::info_json;

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

fn hints(a: &InfoArgs) -> weft::Info {
    let mut h = weft::Info::default();
    h.fabric_attr.prov_name.clone_from(&a.prov);
    if let Some(e) = a.ep_type {
        h.ep_attr.ep_type = e;
    }
    h
}

fn no_match(a: &InfoArgs) -> Failure {
    let why = weft::explain_no_match(&hints(a));
    let avail = if why.offering.is_empty() {
        "none".to_string()
    } else {
        why.offering.join(", ")
    };
    let mut what = format!("no provider matches {} (available: {avail}", asked(a));
    if let Some(f) = &why.fi_provider {
        what.push_str(&format!("; FI_PROVIDER={f}"));
    }
    what.push(')');
    if let (Some(p), Some(reason)) = (&a.prov, &why.unavailable) {
        what.push_str(&format!("; {p}: {reason}"));
    }
    Failure::new(what, weft::Error::NoData)
}

/// Provider names in the order given, without repeats.
fn names(infos: Vec<weft::Info>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for i in infos {
        let n = i.fabric_attr.prov_name.unwrap_or_default();
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen
}

pub fn run(a: &InfoArgs) -> Res<()> {
    let mut out = std::io::stdout().lock();
    let hints = (a.prov.is_some() || a.ep_type.is_some()).then(|| hints(a));
    let infos = if a.list && hints.is_none() {
        // The names as FI_PROVIDER leaves them, whatever getinfo would
        // narrow.
        let all = weft::all_offers();
        if all.is_empty() {
            return Err(no_match(a));
        }
        all
    } else {
        match weft::getinfo(hints.as_ref()) {
            Ok(v) => v,
            Err(weft::Error::NoData) => return Err(no_match(a)),
            Err(e) => return Err(Failure::new("getinfo", e)),
        }
    };
    if a.json {
        let doc = if a.list {
            info_json::providers(&names(infos))
        } else {
            info_json::offers(&infos, a.verbose)
        };
        serde_json::to_writer_pretty(&mut out, &doc).ctx("write JSON")?;
        return writeln!(out).ctx("write");
    }
    if a.list {
        for n in names(infos) {
            writeln!(out, "{n}").ctx("write")?;
        }
        return Ok(());
    }
    for i in &infos {
        out.write_all(weft::format_info(i, a.verbose).as_bytes())
            .ctx("write")?;
    }
    Ok(())
}
