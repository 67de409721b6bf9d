//! Choosing the provider's offer for `-p -e -d` (and `--rma`), and saying
//! in the user's own flags why none fits.

use weft::{Caps, EpType, Info};

use crate::args::{ep_name, PerfArgs, Rma};
use crate::fail::Failure;

/// The hints for `a`; with `rma`, asking for RMA with remote CQ data too,
/// and accepting what an RMA target must do (the region's own key and
/// virtual address, regions from the domain).
pub(super) fn hints(a: &PerfArgs, rma: bool) -> Info {
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some(a.prov.clone());
    hints.ep_attr.ep_type = a.ep_type;
    hints.domain_attr.name.clone_from(&a.domain);
    hints.caps = match a.ep_type {
        // DGRAM has no tagged messages.
        EpType::Msg | EpType::Dgram => Caps::MSG,
        _ => Caps::TAGGED,
    };
    if rma {
        hints.caps |= Caps::RMA | Caps::REMOTE_CQ_DATA;
        hints.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::ALLOCATED;
        // The write pingpong's remote CQ data takes a posted receive on
        // MSG; the CLI posts them.
        hints.mode |= weft::Mode::RX_CQ_DATA;
    }
    hints
}

/// Why nothing matches `-p -e -d` as given.
pub(super) fn no_match(a: &PerfArgs) -> String {
    let why = weft::explain_no_match(&hints(a, false));
    let mut m = format!(
        "no provider matches -p {} -e {}{} (available: {})",
        a.prov,
        a.ep_type.fi_name(),
        a.domain
            .as_deref()
            .map(|d| format!(" -d {d}"))
            .unwrap_or_default(),
        weft::providers().join(", ")
    );
    if !why.ep_types.is_empty() {
        let offered: Vec<&str> = why.ep_types.iter().map(|t| t.fi_name()).collect();
        m.push_str(&format!(
            "; -p {} offers {} only",
            a.prov,
            offered.join(", ")
        ));
    }
    if let Some(why) = why.unavailable {
        m.push_str(&format!("; {}: {why}", a.prov));
    }
    m
}

/// Whether `info` does what `--rma` needs: RMA (read and write, which
/// bare `FI_RMA` stands for) and remote CQ data.
pub fn has_rma(info: &Info) -> bool {
    let rw = Caps::READ | Caps::WRITE;
    info.caps.contains(Caps::RMA | Caps::REMOTE_CQ_DATA)
        && (!info.caps.intersects(rw) || info.caps.contains(rw))
}

/// The failure of `--rma` where the provider and endpoint type have none.
pub(super) fn no_rma(a: &PerfArgs, op: Rma) -> Failure {
    let with = weft::ep_types_offered(&a.prov, a.domain.as_deref(), Caps::RMA);
    let hint = if with.is_empty() {
        format!("-p {} has no RMA at all", a.prov)
    } else {
        let eps: Vec<String> = with.iter().map(|&t| format!("-e {}", ep_name(t))).collect();
        format!("-p {} has it with {}", a.prov, eps.join(", "))
    };
    Failure::new(
        format!("--rma {}", op.name()),
        format!(
            "-p {} -e {} has no RMA with remote CQ data (FI_RMA, FI_REMOTE_CQ_DATA); {hint}",
            a.prov,
            ep_name(a.ep_type),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_use_the_users_flags() {
        if std::env::var_os("FI_PROVIDER").is_some() {
            return;
        }
        let a = PerfArgs {
            prov: "tcp".into(),
            ep_type: EpType::Dgram,
            ..PerfArgs::default()
        };
        let m = no_match(&a);
        assert!(
            m.starts_with("no provider matches -p tcp -e FI_EP_DGRAM (available: tcp"),
            "{m}"
        );
        assert!(m.contains("; -p tcp offers FI_EP_"), "{m}");
        let dgram = PerfArgs {
            ep_type: EpType::Dgram,
            ..PerfArgs::default()
        };
        let f = no_rma(&dgram, Rma::Write).to_string();
        assert!(
            f.starts_with(
                "--rma write: -p tcp -e dgram has no RMA with remote CQ data \
                 (FI_RMA, FI_REMOTE_CQ_DATA); -p tcp has it with -e "
            ),
            "{f}"
        );
    }

    #[test]
    fn rma_needs_read_and_write() {
        let mut i = Info {
            caps: Caps::RMA | Caps::REMOTE_CQ_DATA,
            ..Info::default()
        };
        assert!(has_rma(&i));
        i.caps |= Caps::READ;
        assert!(!has_rma(&i));
        i.caps |= Caps::WRITE;
        assert!(has_rma(&i));
        i.caps = Caps::RMA;
        assert!(!has_rma(&i));
    }
}
