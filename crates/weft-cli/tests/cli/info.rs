//! `weft info`: the providers' offers, as text and as JSON.

use super::{text, weft};

#[test]
fn info_lists_tcp() {
    let o = weft(&["info"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("provider: tcp"), "{out}");
    assert!(
        out.contains("FI_EP_RDM") && out.contains("FI_EP_MSG"),
        "{out}"
    );

    let o = weft(&["info", "--list"]);
    assert!(o.status.success());
    // tcp, udp and shm always; verbs too in a verbs build on a machine
    // with a device.
    let list = text(&o.stdout);
    let names: Vec<&str> = list.lines().collect();
    assert_eq!(names.first(), Some(&"tcp"), "{list}");
    assert!(names.contains(&"udp") && names.contains(&"shm"), "{list}");
    assert!(
        names
            .iter()
            .all(|n| ["tcp", "verbs", "udp", "shm"].contains(n)),
        "{list}"
    );
}

#[test]
fn info_json() {
    let o = weft(&["info", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let offers = doc["offers"].as_array().cloned().unwrap_or_default();
    // The same offers as the text, in the same order.
    let plain = text(&weft(&["info"]).stdout);
    let types: Vec<&str> = plain
        .lines()
        .filter_map(|l| l.trim().strip_prefix("type: "))
        .collect();
    assert_eq!(offers.len(), types.len(), "{doc}");
    for (o, t) in offers.iter().zip(&types) {
        assert_eq!(o["type"], *t);
        assert!(
            o["provider"].is_string() && o["protocol"].is_string(),
            "{o}"
        );
    }
    assert!(offers.iter().any(|o| o["provider"] == "tcp"));

    let o = weft(&["info", "-v", "-p", "tcp", "-e", "msg", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let first = &doc["offers"][0];
    assert_eq!(first["fi_ep_attr"]["type"], "FI_EP_MSG");
    assert_eq!(first["fi_fabric_attr"]["prov_name"], "tcp");
    assert!(first["caps"]
        .as_array()
        .is_some_and(|c| c.iter().any(|x| x == "FI_MSG")));
    assert!(first["fi_ep_attr"]["max_msg_size"].is_u64());

    let o = weft(&["info", "--list", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(doc["providers"][0], "tcp");
}
