//! Logging setup: text or JSON by `--logging-format`, verbosity by `-v` as klog levels map.

use crate::flags::LoggingFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// `RUST_LOG`, when set, overrides the `-v` mapping.
pub fn init(format: LoggingFormat, verbosity: u8) {
    let default = match verbosity {
        0 | 1 => "info",
        2 | 3 => "info,shared=debug,pilothouse=debug,controllers=debug",
        _ => "info,shared=trace,pilothouse=trace,controllers=trace,kube=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LoggingFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LoggingFormat::Text => builder.try_init(),
    };
}
