//! Where the library's diagnostics go, and which: `RUST_LOG` as any
//! tracing program takes it; without it libfabric's `FI_LOG_LEVEL`, so
//! that what a libfabric user already sets works here too; without
//! either, errors only. Always on stderr: stdout is the table's (or the
//! JSON document's).

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; a second call (or another subscriber) is
/// left as it was.
pub fn init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter(
            std::env::var("RUST_LOG").ok().as_deref(),
            std::env::var("FI_LOG_LEVEL").ok().as_deref(),
        ))
        .with_writer(std::io::stderr)
        .try_init();
}

/// The filter for these two variables' values. An empty `RUST_LOG` counts
/// as unset, as `EnvFilter` itself treats it.
fn filter(rust_log: Option<&str>, fi_log_level: Option<&str>) -> EnvFilter {
    let rust_log = rust_log.filter(|v| !v.trim().is_empty());
    let directives = match (rust_log, fi_log_level.and_then(weft::fi_log_directives)) {
        (Some(r), _) => r.to_owned(),
        (None, Some(fi)) => fi,
        (None, None) => String::new(),
    };
    EnvFilter::builder()
        .with_default_directive(tracing::Level::ERROR.into())
        .parse_lossy(directives)
}

#[cfg(test)]
mod tests {
    use super::filter;

    fn shown(f: &tracing_subscriber::EnvFilter) -> String {
        f.to_string()
    }

    #[test]
    fn rust_log_wins_over_fi_log_level() {
        assert_eq!(
            shown(&filter(Some("weft_tcp=trace"), Some("debug"))),
            "weft_tcp=trace"
        );
        let fi = shown(&filter(None, Some("debug")));
        assert!(
            fi.contains("weft=debug") && fi.contains("weft_tcp=debug"),
            "{fi}"
        );
        let fi = shown(&filter(Some(" "), Some("info")));
        assert!(fi.contains("weft_core=info"), "{fi}");
        // Neither, or a value libfabric would not take: errors only.
        assert_eq!(shown(&filter(None, None)), "error");
        assert_eq!(shown(&filter(None, Some("loud"))), "error");
    }
}
