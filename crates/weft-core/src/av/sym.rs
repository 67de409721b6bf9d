//! `fi_av_insertsym`: expanding a (node, nodecnt, service, svccnt) range
//! into the host/service pairs to resolve.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// Expands an `fi_av_insertsym` request into `nodecnt * svccnt`
/// `(node, service)` pairs, all services of a node before the next node, as
/// in fi_av(3)'s example.
///
/// Nodes count up from `node`: a numeric IPv4 (or IPv6) address as a number,
/// so `10.0.0.255` is followed by `10.0.1.0`; a host name by its trailing
/// decimal suffix, keeping its width as a minimum (`host09`, `host10`). A
/// name without a numeric suffix is only valid with `nodecnt == 1`. Services
/// must be decimal ports and may not run past 65535. Zero counts, empty
/// strings and address overflow are `Inval`. The first pair always carries
/// `node` and `service` exactly as given.
pub fn expand_insertsym(
    node: &str,
    nodecnt: usize,
    service: &str,
    svccnt: usize,
) -> Result<Vec<(String, String)>> {
    if nodecnt == 0 || svccnt == 0 || node.is_empty() {
        return Err(Error::Inval);
    }
    let services = expand_services(service, svccnt)?;
    let nodes = NodeRange::parse(node, nodecnt)?;
    let total = nodecnt.checked_mul(svccnt).ok_or(Error::Inval)?;
    // Bounded so that a huge (but valid) range fails on allocation lazily
    // instead of on an up-front capacity computation.
    let mut out = Vec::with_capacity(total.min(1 << 16));
    for k in 0..nodecnt {
        let host = if k == 0 {
            node.to_owned()
        } else {
            nodes.nth(k)
        };
        for svc in &services {
            out.push((host.clone(), svc.clone()));
        }
    }
    Ok(out)
}

fn expand_services(service: &str, svccnt: usize) -> Result<Vec<String>> {
    let first = parse_decimal(service).ok_or(Error::Inval)?;
    let last = u64::try_from(svccnt - 1)
        .ok()
        .and_then(|n| first.checked_add(n))
        .filter(|&last| last <= u64::from(u16::MAX))
        .ok_or(Error::Inval)?;
    Ok((first..=last)
        .map(|port| {
            if port == first {
                service.to_owned()
            } else {
                port.to_string()
            }
        })
        .collect())
}

/// Decimal digits only: `str::parse` would also take a leading `+`.
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A validated range of nodes; every `nth(k)` for `k < nodecnt` is in range.
enum NodeRange<'a> {
    V4(u32),
    V6(u128),
    Suffixed {
        prefix: &'a str,
        first: u64,
        width: usize,
    },
    Single,
}

impl<'a> NodeRange<'a> {
    fn parse(node: &'a str, nodecnt: usize) -> Result<NodeRange<'a>> {
        let span = u128::try_from(nodecnt - 1).map_err(|_| Error::Inval)?;
        if let Ok(ip) = node.parse::<Ipv4Addr>() {
            let first = u32::from(ip);
            let fits = u128::from(first)
                .checked_add(span)
                .is_some_and(|l| l <= u128::from(u32::MAX));
            return if fits {
                Ok(NodeRange::V4(first))
            } else {
                Err(Error::Inval)
            };
        }
        if let Ok(ip) = node.parse::<Ipv6Addr>() {
            let first = u128::from(ip);
            return first
                .checked_add(span)
                .map(|_| NodeRange::V6(first))
                .ok_or(Error::Inval);
        }
        if nodecnt == 1 {
            return Ok(NodeRange::Single);
        }
        let digits = node.bytes().rev().take_while(u8::is_ascii_digit).count();
        let (prefix, suffix) = node.split_at(node.len() - digits);
        let first = parse_decimal(suffix).ok_or(Error::Inval)?;
        let span = u64::try_from(span).map_err(|_| Error::Inval)?;
        first.checked_add(span).ok_or(Error::Inval)?;
        Ok(NodeRange::Suffixed {
            prefix,
            first,
            width: digits,
        })
    }

    /// The `k`-th node; `parse` already checked that it does not overflow.
    fn nth(&self, k: usize) -> String {
        let k = k as u64;
        match *self {
            NodeRange::V4(first) => {
                let n = u32::try_from(u64::from(first) + k).unwrap_or(u32::MAX);
                Ipv4Addr::from(n).to_string()
            }
            NodeRange::V6(first) => Ipv6Addr::from(first.saturating_add(u128::from(k))).to_string(),
            NodeRange::Suffixed {
                prefix,
                first,
                width,
            } => {
                format!("{prefix}{:0width$}", first.saturating_add(k))
            }
            NodeRange::Single => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|&(h, s)| (h.to_owned(), s.to_owned()))
            .collect()
    }

    #[test]
    fn spec_example_ipv4() {
        let got = expand_insertsym("10.1.1.1", 2, "5000", 2).unwrap();
        let want = pairs(&[
            ("10.1.1.1", "5000"),
            ("10.1.1.1", "5001"),
            ("10.1.1.2", "5000"),
            ("10.1.1.2", "5001"),
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn spec_example_hostname() {
        let got = expand_insertsym("host10", 2, "5000", 2).unwrap();
        let want = pairs(&[
            ("host10", "5000"),
            ("host10", "5001"),
            ("host11", "5000"),
            ("host11", "5001"),
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn ipv4_carries_into_higher_octets() {
        let got = expand_insertsym("10.0.0.254", 3, "7", 1).unwrap();
        assert_eq!(
            got,
            pairs(&[("10.0.0.254", "7"), ("10.0.0.255", "7"), ("10.0.1.0", "7")])
        );
        let got = expand_insertsym("10.255.255.255", 2, "7", 1).unwrap();
        assert_eq!(got[1].0, "11.0.0.0");
        assert_eq!(
            expand_insertsym("255.255.255.255", 1, "1", 1)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            expand_insertsym("255.255.255.254", 3, "1", 1),
            Err(Error::Inval)
        );
    }

    #[test]
    fn ipv6_counts_too() {
        let got = expand_insertsym("fe80::ff", 2, "9", 1).unwrap();
        assert_eq!(got[1].0, "fe80::100");
        assert_eq!(
            expand_insertsym("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 2, "9", 1),
            Err(Error::Inval)
        );
    }

    #[test]
    fn hostname_suffix_keeps_width() {
        let got = expand_insertsym("host09", 2, "1", 1).unwrap();
        assert_eq!(got, pairs(&[("host09", "1"), ("host10", "1")]));
        let got = expand_insertsym("n098", 3, "1", 1).unwrap();
        let hosts: Vec<_> = got.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(hosts, ["n098", "n099", "n100"]);
        // The width is a minimum: the suffix may grow.
        let got = expand_insertsym("host99", 2, "1", 1).unwrap();
        assert_eq!(got[1].0, "host100");
        let got = expand_insertsym("node-001", 2, "1", 1).unwrap();
        assert_eq!(got[1].0, "node-002");
    }

    #[test]
    fn names_without_suffix() {
        assert_eq!(
            expand_insertsym("host", 1, "5000", 2).unwrap(),
            pairs(&[("host", "5000"), ("host", "5001")])
        );
        assert_eq!(expand_insertsym("host", 2, "5000", 1), Err(Error::Inval));
        assert_eq!(
            expand_insertsym("host1.example", 2, "5000", 1),
            Err(Error::Inval)
        );
        assert_eq!(
            expand_insertsym("18446744073709551615", 2, "1", 1),
            Err(Error::Inval)
        );
    }

    #[test]
    fn services() {
        let got = expand_insertsym("h", 1, "65534", 2).unwrap();
        assert_eq!(got, pairs(&[("h", "65534"), ("h", "65535")]));
        assert_eq!(expand_insertsym("h", 1, "65535", 2), Err(Error::Inval));
        assert_eq!(expand_insertsym("h", 1, "65536", 1), Err(Error::Inval));
        assert_eq!(expand_insertsym("h", 1, "http", 1), Err(Error::Inval));
        assert_eq!(expand_insertsym("h", 1, "+80", 1), Err(Error::Inval));
        assert_eq!(expand_insertsym("h", 1, "", 1), Err(Error::Inval));
    }

    #[test]
    fn zero_counts_and_empty_node() {
        assert_eq!(expand_insertsym("h1", 0, "1", 1), Err(Error::Inval));
        assert_eq!(expand_insertsym("h1", 1, "1", 0), Err(Error::Inval));
        assert_eq!(expand_insertsym("", 1, "1", 1), Err(Error::Inval));
    }

    #[test]
    fn counts_multiply_node_major() {
        let got = expand_insertsym("192.168.0.1", 3, "100", 4).unwrap();
        assert_eq!(got.len(), 12);
        for (i, (host, svc)) in got.iter().enumerate() {
            assert_eq!(host, &format!("192.168.0.{}", 1 + i / 4));
            assert_eq!(svc, &(100 + i % 4).to_string());
        }
    }
}
