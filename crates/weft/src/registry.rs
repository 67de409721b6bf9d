//! The providers Weft knows: the one list of them. Adding a provider is
//! its crate (implementing `weft_core::provider::Provider`) and one line
//! here; nothing else in Weft compares provider names.

use weft_core::provider::Provider;

/// Every provider, the embedded default (tcp) first. A provider whose
/// support was not compiled in stays listed, so it can say why it offers
/// nothing (`Provider::unavailable_reason`).
static REGISTRY: &[&dyn Provider] = &[
    &weft_tcp::TcpProvider,
    &weft_verbs::VerbsProvider,
    &weft_udp::UdpProvider,
    &weft_shm::ShmProvider,
];

/// Every provider Weft knows.
pub(crate) fn all() -> &'static [&'static dyn Provider] {
    REGISTRY
}

/// The provider called `name`, if this build can open its objects.
pub(crate) fn find(name: &str) -> Option<&'static dyn Provider> {
    REGISTRY
        .iter()
        .copied()
        .find(|p| p.name() == name && p.built())
}

/// The provider called `name`, whatever was compiled in.
pub(crate) fn known(name: &str) -> Option<&'static dyn Provider> {
    REGISTRY.iter().copied().find(|p| p.name() == name)
}

/// The default provider (the first one).
pub(crate) fn default_name() -> &'static str {
    REGISTRY.first().map_or("tcp", |p| p.name())
}

/// Names of the providers this build can open objects of.
pub fn providers() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .filter(|p| p.built())
        .map(|p| p.name())
        .collect()
}
