//! `weft info --json`. The document is read off the very text `weft info`
//! prints (`weft::format_info`, fi_info's layout: `key: value` lines,
//! nested by indentation), so the two always show the same attributes
//! with the same values, and one added to the text appears here too.
//!
//! Values become JSON by their look: `[ A | B ]` an array of names,
//! `(null)` null, a decimal integer a number (names excepted: a domain
//! called `0` stays a string), anything else the string as printed.

use serde_json::{Map, Value};

/// Attributes that are names, whatever they look like.
const NAMES: &[&str] = &["provider", "fabric", "domain", "name", "prov_name"];

/// `{"providers": [...]}` for `--list`.
pub fn providers(names: &[String]) -> Value {
    let mut doc = Map::new();
    doc.insert("providers".into(), names.iter().cloned().collect());
    Value::Object(doc)
}

/// `{"offers": [...]}`: each offer as `format_info(_, verbose)` shows it.
pub fn offers(infos: &[weft::Info], verbose: bool) -> Value {
    let list = infos
        .iter()
        .map(|i| parse(&weft::format_info(i, verbose)))
        .collect();
    let mut doc = Map::new();
    doc.insert("offers".into(), Value::Array(list));
    Value::Object(doc)
}

/// One block of fi_info text as an object; the verbose dump's outer
/// `fi_info:` level is dropped, since every block has it.
fn parse(text: &str) -> Value {
    // Open objects, innermost last: the indentation level of their
    // members, the key they go under in their parent, and the members.
    let mut open: Vec<(usize, String, Map<String, Value>)> = vec![(0, String::new(), Map::new())];
    for line in text.lines() {
        let body = line.trim_start_matches(' ');
        if body.is_empty() || body == "---" {
            continue;
        }
        let level = (line.len() - body.len()) / 4;
        let (key, value) = match body.split_once(':') {
            Some((k, v)) => (k.to_string(), v.trim()),
            None => (body.to_string(), ""),
        };
        while open.len() > 1 && open.last().is_some_and(|o| o.0 > level) {
            close(&mut open);
        }
        if value.is_empty() {
            open.push((level + 1, key, Map::new()));
        } else if let Some(top) = open.last_mut() {
            let v = typed(&key, value);
            top.2.insert(key, v);
        }
    }
    while open.len() > 1 {
        close(&mut open);
    }
    let mut root = open.pop().map(|o| o.2).unwrap_or_default();
    match root.remove("fi_info") {
        Some(inner) if root.is_empty() => inner,
        Some(inner) => {
            root.insert("fi_info".into(), inner);
            Value::Object(root)
        }
        None => Value::Object(root),
    }
}

/// Moves the innermost open object into its parent.
fn close(open: &mut Vec<(usize, String, Map<String, Value>)>) {
    if let Some((_, key, members)) = open.pop() {
        if let Some(parent) = open.last_mut() {
            parent.2.insert(key, Value::Object(members));
        }
    }
}

fn typed(key: &str, value: &str) -> Value {
    if let Some(inner) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        return inner
            .split('|')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| Value::String(s.to_string()))
            .collect();
    }
    if value == "(null)" {
        return Value::Null;
    }
    if !NAMES.contains(&key) && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse::<u64>() {
            return Value::from(n);
        }
    }
    Value::String(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_block() {
        let v = parse(
            "provider: tcp\n    fabric: 127.0.0.0/8\n    domain: 0\n    version: 0.1\n    \
             type: FI_EP_RDM\n    protocol: FI_PROTO_SOCK_TCP\n",
        );
        assert_eq!(v["provider"], "tcp");
        assert_eq!(v["fabric"], "127.0.0.0/8");
        assert_eq!(v["domain"], "0");
        assert_eq!(v["version"], "0.1");
        assert_eq!(v["type"], "FI_EP_RDM");
        assert_eq!(v.as_object().map(Map::len), Some(6));
    }

    #[test]
    fn verbose_dump_nests_by_indentation() {
        let v = parse(
            "---\nfi_info:\n    caps: [ FI_MSG | FI_TAGGED ]\n    mode: [  ]\n    \
             src_addr: (null)\n    fi_tx_attr:\n        inject_size: 64\n        \
             tclass: 0x0\n    fi_ep_attr:\n        max_msg_size: 18446744073709551615\n    \
             fi_fabric_attr:\n        name: 127.0.0.0/8\n        prov_name: tcp\n",
        );
        assert_eq!(v["caps"], serde_json::json!(["FI_MSG", "FI_TAGGED"]));
        assert_eq!(v["mode"], serde_json::json!([]));
        assert_eq!(v["src_addr"], Value::Null);
        assert_eq!(v["fi_tx_attr"]["inject_size"], 64);
        assert_eq!(v["fi_tx_attr"]["tclass"], "0x0");
        assert_eq!(v["fi_ep_attr"]["max_msg_size"], u64::MAX);
        assert_eq!(v["fi_fabric_attr"]["prov_name"], "tcp");
    }

    #[test]
    fn every_offer_converts_whole() {
        let infos = weft::all_offers();
        let doc = offers(&infos, true);
        let list = doc["offers"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), infos.len());
        for (o, i) in list.iter().zip(&infos) {
            assert_eq!(o["fi_ep_attr"]["type"], i.ep_attr.ep_type.fi_name());
            assert_eq!(
                o["fi_ep_attr"]["max_msg_size"],
                i.ep_attr.max_msg_size as u64
            );
            assert!(o["fi_domain_attr"].is_object() && o["fi_rx_attr"].is_object());
        }
        assert_eq!(
            providers(&["tcp".into()]),
            serde_json::json!({ "providers": ["tcp"] })
        );
    }
}
