//! Per-provider instantiation of the conformance tests (the rustls-test
//! pattern): each module writes `async fn name(p: Provider)` once and lists
//! it in `provider_tests! { ... }`, which generates one `#[tokio::test]`
//! per provider, in a module named after it.

/// Providers the macro instantiates tests for; must equal
/// `weft_integration::providers()` (checked by a test).
pub const INSTANTIATED: &[&str] = &["tcp", "verbs", "udp", "shm"];

/// Generates, for every provider, a module holding one multi-threaded
/// `#[tokio::test]` per listed test function. Attributes written before a
/// name (e.g. `#[ignore = "BUG: ..."]`) are applied to every instance.
/// A list that starts with `verbs_ignore = "why";` is of behaviours verbs
/// cannot have: its verbs instances are reported as ignored, with `why`
/// (the refusals verbs gives instead are checked elsewhere).
macro_rules! provider_tests {
    (verbs_ignore = $why:literal; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        provider_tests!(@provider tcp, "tcp"; $($(#[$attr])* $name),*);
        provider_tests!(@provider verbs, "verbs"; $(#[ignore = $why] $(#[$attr])* $name),*);
    };
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        provider_tests!(@provider tcp, "tcp"; $($(#[$attr])* $name),*);
        provider_tests!(@provider verbs, "verbs";
            $(
                #[cfg_attr(
                    not(feature = "verbs"),
                    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
                )]
                $(#[$attr])* $name
            ),*);
    };
    (@provider $module:ident, $prov:literal; $($(#[$attr:meta])* $name:ident),*) => {
        mod $module {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let p = weft_integration::Provider::named($prov);
                    if p.usable() {
                        super::$name(p).await;
                    }
                }
            )*
        }
    };
}

/// Instantiates, for udp, tests already listed in [`provider_tests!`]
/// that apply to its `FI_EP_DGRAM` endpoints (they take their harness
/// from `Harness::connless`, which is RDM for the other providers).
macro_rules! udp_tests {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        provider_tests!(@provider udp, "udp"; $($(#[$attr])* $name),*);
    };
}

/// Instantiates, for shm, tests already listed in [`provider_tests!`]
/// that apply to its `FI_EP_RDM` endpoints (no MSG endpoints or RMA
/// events there yet).
macro_rules! shm_tests {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        provider_tests!(@provider shm, "shm"; $($(#[$attr])* $name),*);
    };
}
