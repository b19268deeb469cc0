//! Logging setup: text or JSON by `--logging-format`, verbosity by `-v` as klog levels map.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// `--logging-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// `RUST_LOG`, when set, overrides the `-v` mapping.
pub fn init(format: LoggingFormat, verbosity: u8) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        // No colours in JSON: the spans' fields are read back from their formatted text.
        LoggingFormat::Json => builder.with_ansi(false).event_format(KlogJson).try_init(),
        LoggingFormat::Text => builder.try_init(),
    };
}

/// kube-controller-manager's `--logging-format=json` (component-base's zap encoder), so a log
/// pipeline built for it reads ours: one object per line with `ts` (Unix seconds, fractional),
/// `caller`, `msg`, `v` (the klog verbosity of an info line; absent on errors, which carry `err`
/// when the event has an `error` field), then the spans' fields (controller, object key) and the
/// event's, as key/value pairs. Warnings are info lines at `v` 0, as klog has no warning level
/// in structured logs.
struct KlogJson;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for KlogJson
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // In klog's order: ts, caller, msg, v (or err), then the fields.
        let mut line: Vec<(String, serde_json::Value)> = Vec::new();
        // component-base's zap encoder writes epoch milliseconds (fractional).
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or_default();
        line.push(("ts".into(), ts.into()));
        // klog's `dir/file.go:line`: the file and the directory holding it.
        let caller = match (meta.file(), meta.line()) {
            (Some(f), Some(l)) => {
                let mut parts: Vec<&str> = f.rsplit('/').take(2).collect();
                parts.reverse();
                format!("{}:{l}", parts.join("/"))
            }
            _ => meta.target().to_string(),
        };
        line.push(("caller".into(), caller.into()));
        line.push((
            "msg".into(),
            fields.message.take().unwrap_or_default().into(),
        ));
        let level = *meta.level();
        if level == tracing::Level::ERROR {
            if let Some(e) = fields.values.remove("error") {
                line.push(("err".into(), e));
            }
        } else {
            line.push(("v".into(), klog_v(level).into()));
        }
        let mut rest = serde_json::Map::new();
        // The event's own fields first: a span field of the same name does not hide them.
        for (k, v) in std::mem::take(&mut fields.values) {
            rest.insert(k, v);
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<tracing_subscriber::fmt::FormattedFields<N>>() {
                    // The default field formatter writes `key=value` pairs; the span's fields
                    // are read back from that text.
                    for (k, v) in parse_pairs(f.as_str()) {
                        rest.entry(k).or_insert(v);
                    }
                }
            }
        }
        line.extend(
            rest.into_iter()
                .filter(|(k, _)| !["ts", "caller", "msg", "v", "err"].contains(&k.as_str())),
        );
        let mut out = String::from("{");
        for (i, (k, v)) in line.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::Value::String(k.clone()).to_string());
            out.push(':');
            out.push_str(&v.to_string());
        }
        out.push('}');
        writeln!(writer, "{out}")
    }
}

/// The klog verbosity an event of `level` is logged at (the inverse of [`directives`]).
fn klog_v(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::TRACE => 5,
        tracing::Level::DEBUG => 3,
        _ => 0,
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    values: serde_json::Map<String, serde_json::Value>,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.values.insert(field.name().into(), text.into());
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.into());
        } else {
            self.values.insert(field.name().into(), value.into());
        }
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.values.insert(field.name().into(), value.into());
    }
    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        self.values
            .insert(field.name().into(), value.to_string().into());
    }
}

/// The `key=value` pairs tracing's default field formatter writes for a span (values may be
/// quoted Debug strings, which keep their quotes' content).
fn parse_pairs(text: &str) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().to_string();
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            // Up to the closing quote that is not escaped.
            let mut end = None;
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = Some(i);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            let end = end.unwrap_or(quoted.len());
            let raw = &quoted[..end];
            let value = serde_json::from_str::<String>(&format!("\"{raw}\""))
                .unwrap_or_else(|_| raw.to_string());
            (value, quoted.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        if !key.is_empty() {
            out.push((key, value.into()));
        }
        rest = next.trim_start();
    }
    out
}

/// Log targets are crate (library) names: the runtime, the binary and each controller crate's
/// `[lib] name` (a test keeps this list complete).
const OUR_TARGETS: &[&str] = &[
    "shared",
    "pilothouse",
    "job",
    "cronjob",
    "statefulset",
    "endpointslice",
    "endpointslice_mirroring",
    "node_lifecycle",
    "taint_eviction",
    "node_maintenance",
];

/// klog levels mapped onto our crates, as Kubernetes uses them: 0-2 info (2 is the usual
/// production level: steady-state information), 3-4 debug (per-sync lines with the object key),
/// 5+ trace (and the kube client's debug lines).
fn directives(verbosity: u8) -> String {
    let level = match verbosity {
        0..=2 => return "info".to_string(),
        3 | 4 => "debug",
        _ => "trace",
    };
    let mut d = String::from("info");
    for t in OUR_TARGETS {
        d.push_str(&format!(",{t}={level}"));
    }
    if verbosity >= 5 {
        d.push_str(",kube=debug");
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON lines carry klog's keys: `ts`, `caller`, `msg`, `v` on info lines, `err` on
    /// errors, and the spans' and event's fields as key/value pairs.
    #[test]
    fn json_lines_read_as_kube_controller_managers() {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                crate::lock(&self.0).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new("trace"))
            .with_writer(move || out.clone())
            .with_ansi(false)
            .event_format(KlogJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("sync", controller = "job-controller", key = "ns/a b");
            let _in = span.enter();
            tracing::info!(pods = 3, "synced");
            tracing::debug!("a detail");
            tracing::error!(error = "boom", "writing status failed");
        });
        let text = String::from_utf8(crate::lock(&buf.0).clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        let info = &lines[0];
        assert!(info["ts"].as_f64().is_some_and(|t| t > 1.0e9), "{info}");
        assert!(
            info["caller"]
                .as_str()
                .is_some_and(|c| c.contains("logging.rs:")),
            "{info}"
        );
        assert_eq!(info["msg"], "synced");
        assert_eq!(info["v"], 0);
        assert_eq!(info["pods"], 3);
        assert_eq!(info["controller"], "job-controller");
        assert_eq!(info["key"], "ns/a b");
        assert_eq!(lines[1]["v"], 3);
        let error = &lines[2];
        assert_eq!(error["err"], "boom");
        assert!(error.get("v").is_none(), "{error}");
        assert_eq!(error["msg"], "writing status failed");
    }

    /// Every controller crate's library name is a target `-v` raises (a new crate must be added).
    #[test]
    fn verbosity_covers_every_controller_crate() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../controllers");
        for entry in std::fs::read_dir(dir).expect("controllers/") {
            let manifest = entry.expect("entry").path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let lib = text
                .split("[lib]")
                .nth(1)
                .and_then(|s| s.lines().find_map(|l| l.trim().strip_prefix("name = ")))
                .map(|n| n.trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{} has no [lib] name", manifest.display()));
            assert!(
                OUR_TARGETS.contains(&lib.as_str()),
                "{lib} missing from OUR_TARGETS"
            );
            assert!(directives(3).contains(&format!(",{lib}=debug")));
        }
        assert_eq!(directives(0), "info");
        assert_eq!(
            directives(2),
            "info",
            "-v=2 is production's level: no per-sync lines"
        );
        assert!(!directives(4).contains("kube=debug"));
        assert!(directives(5).ends_with(",kube=debug"));
    }
}
