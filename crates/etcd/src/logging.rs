//! Logs in etcd's shape: one JSON object per line on stderr, as etcd's default zap logger
//! writes them (`{"level":"info","ts":"…","caller":"…","msg":"ready to serve client requests",…}`),
//! so that operators' scripts that read etcd's logs read ours.
//!
//! When stderr is a terminal, a person is reading: lines are then plain text,
//! `2026-11-29T21:00:00.000Z INFO ready to serve client requests key=value`. Anything that
//! captures stderr (a pipe, a file, a test harness, systemd) gets JSON as with etcd.
//! `ETCDRS_LOG_FORMAT=json|console` overrides the choice.

use std::fmt;
use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Install the global subscriber at etcd's `--log-level`.
pub fn init(log_level: &str, log_outputs: &[String]) {
    let level = match log_level {
        "debug" => "debug",
        "warn" => "warn",
        "error" | "panic" | "fatal" | "dpanic" => "error",
        _ => "info",
    };
    // raft-rs is chatty at info; etcd's raft logs the same milestones at info, so keep it.
    // ETCDRS_LOG (a tracing filter) overrides, for debugging etcd-rs itself.
    let directives = std::env::var("ETCDRS_LOG")
        .unwrap_or_else(|_| format!("{level},h2=warn,hyper=warn,tower=warn"));
    let filter = tracing_subscriber::EnvFilter::new(directives);
    let output = Output::from_flag(log_outputs);
    let format = match std::env::var("ETCDRS_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        Ok("console") => LogFormat::Console,
        _ if output.is_terminal() => LogFormat::Console,
        _ => LogFormat::Json,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(output)
        .event_format(format)
        .try_init();
}

/// Where logs go (etcd's `--log-outputs`: `default` and `stderr` are stderr, `stdout`, or a
/// file path, appended to).
#[derive(Clone)]
enum Output {
    Stderr,
    Stdout,
    File(std::sync::Arc<std::fs::File>),
}

impl Output {
    fn from_flag(outputs: &[String]) -> Output {
        match outputs.first().map(String::as_str) {
            None | Some("default") | Some("stderr") => Output::Stderr,
            Some("stdout") => Output::Stdout,
            Some(path) => match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                Ok(file) => Output::File(std::sync::Arc::new(file)),
                Err(e) => {
                    eprintln!("cannot open log output {path}: {e}; logging to stderr");
                    Output::Stderr
                }
            },
        }
    }

    fn is_terminal(&self) -> bool {
        match self {
            Output::Stderr => std::io::stderr().is_terminal(),
            Output::Stdout => std::io::stdout().is_terminal(),
            Output::File(_) => false,
        }
    }
}

/// One log line's destination.
enum OutputWriter {
    Stderr(std::io::Stderr),
    Stdout(std::io::Stdout),
    File(std::sync::Arc<std::fs::File>),
}

impl std::io::Write for OutputWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            OutputWriter::Stderr(w) => w.write(buf),
            OutputWriter::Stdout(w) => w.write(buf),
            OutputWriter::File(f) => (&**f).write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            OutputWriter::Stderr(w) => w.flush(),
            OutputWriter::Stdout(w) => w.flush(),
            OutputWriter::File(f) => (&**f).flush(),
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Output {
    type Writer = OutputWriter;

    fn make_writer(&'a self) -> Self::Writer {
        match self {
            Output::Stderr => OutputWriter::Stderr(std::io::stderr()),
            Output::Stdout => OutputWriter::Stdout(std::io::stdout()),
            Output::File(file) => OutputWriter::File(file.clone()),
        }
    }
}

/// How each log line is written.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LogFormat {
    /// etcd's zap JSON: for programs.
    Json,
    /// Plain text with `key=value` fields: for people at a terminal.
    Console,
}

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(name(field), Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(name(field), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(name(field), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(name(field), Value::Bool(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(name(field), Value::String(format!("{value:?}")));
    }
}

/// etcd's fields are kebab-case (`local-member-id`); ours are snake_case in code.
fn name(field: &Field) -> String {
    field.name().replace('_', "-")
}

impl<S, N> FormatEvent<S, N> for LogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let msg = match fields.0.remove("message") {
            Some(Value::String(msg)) => msg,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let level = match *meta.level() {
            Level::ERROR => "error",
            Level::WARN => "warn",
            Level::INFO => "info",
            Level::DEBUG | Level::TRACE => "debug",
        };
        let line = match self {
            LogFormat::Json => {
                let caller = match (meta.file(), meta.line()) {
                    (Some(file), Some(line)) => format!("{}:{line}", short_path(file)),
                    _ => meta.target().to_string(),
                };
                json_line(&timestamp(), level, &caller, &msg, fields.0)
            }
            LogFormat::Console => console_line(&timestamp(), level, &msg, &fields.0),
        };
        writeln!(writer, "{line}")
    }
}

/// One zap JSON line: level, ts, caller and msg first, then the fields.
fn json_line(ts: &str, level: &str, caller: &str, msg: &str, fields: Map<String, Value>) -> String {
    let mut line = Map::new();
    line.insert("level".into(), Value::String(level.into()));
    line.insert("ts".into(), Value::String(ts.into()));
    line.insert("caller".into(), Value::String(caller.into()));
    line.insert("msg".into(), Value::String(msg.into()));
    line.extend(fields);
    Value::Object(line).to_string()
}

/// One console line: `<ts> <LEVEL> <msg> key=value ...`. A string value is quoted (with
/// escapes) only when it would otherwise be ambiguous: empty, or holding spaces, quotes, `=`
/// or control characters.
fn console_line(ts: &str, level: &str, msg: &str, fields: &Map<String, Value>) -> String {
    let mut line = format!("{ts} {} {msg}", level.to_ascii_uppercase());
    for (key, value) in fields {
        let text = match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let ambiguous = text.is_empty()
            || text
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=');
        if ambiguous {
            line.push_str(&format!(" {key}={text:?}"));
        } else {
            line.push_str(&format!(" {key}={text}"));
        }
    }
    line
}

fn short_path(file: &str) -> &str {
    let mut parts = file.rsplitn(3, '/');
    let last = parts.next().unwrap_or(file);
    match parts.next() {
        Some(dir) => &file[file.len() - last.len() - dir.len() - 1..],
        None => last,
    }
}

/// Now, as `2006-01-02T15:04:05.000Z`.
fn timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(short_path("crates/server/src/http.rs"), "src/http.rs");
    }

    fn fields(json: Value) -> Map<String, Value> {
        match json {
            Value::Object(map) => map,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn json_lines_are_zaps() {
        let line = json_line(
            "2026-11-29T21:00:00.000Z",
            "info",
            "src/run.rs:120",
            "ready to serve client requests",
            fields(serde_json::json!({ "local-member-id": "8e9e05c52164694d", "n": 3 })),
        );
        assert_eq!(
            line,
            r#"{"level":"info","ts":"2026-11-29T21:00:00.000Z","caller":"src/run.rs:120","msg":"ready to serve client requests","local-member-id":"8e9e05c52164694d","n":3}"#
        );
    }

    #[test]
    fn console_lines_are_readable() {
        let line = console_line(
            "2026-11-29T21:00:00.000Z",
            "info",
            "starting an etcd server",
            &fields(serde_json::json!({
                "name": "default",
                "data-dir": "/var/lib/etcd",
                "quota-backend-bytes": 0,
                "force-new-cluster": false,
                "urls": "[\"http://127.0.0.1:2379\"]",
                "error": "connection refused (os error 111)",
                "empty": "",
                "eq": "a=b",
            })),
        );
        assert_eq!(
            line,
            concat!(
                "2026-11-29T21:00:00.000Z INFO starting an etcd server name=default ",
                "data-dir=/var/lib/etcd quota-backend-bytes=0 force-new-cluster=false ",
                r#"urls="[\"http://127.0.0.1:2379\"]" error="connection refused (os error 111)" "#,
                r#"empty="" eq="a=b""#
            )
        );
        let line = console_line(
            "2026-11-29T21:00:00.000Z",
            "warn",
            "two\nlines",
            &Map::new(),
        );
        assert_eq!(line, "2026-11-29T21:00:00.000Z WARN two\nlines");
    }
}
