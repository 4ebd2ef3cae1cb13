//! raft-rs logs through `slog`; this drain forwards its records to `tracing`.

use slog::{Drain, Level, OwnedKVList, Record};

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, _values: &OwnedKVList) -> Result<(), slog::Never> {
        let message = record.msg();
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{message}"),
            Level::Warning => tracing::warn!(target: "raft", "{message}"),
            Level::Info => tracing::info!(target: "raft", "{message}"),
            Level::Debug | Level::Trace => tracing::debug!(target: "raft", "{message}"),
        }
        Ok(())
    }
}

/// A `slog::Logger` that writes to `tracing`. raft-rs logs at debug level on its hot paths
/// (every append and commit); those records are dropped here, before they are built, unless
/// tracing has debug enabled for raft.
pub fn logger() -> slog::Logger {
    let level = if tracing::enabled!(target: "raft", tracing::Level::DEBUG) {
        Level::Debug
    } else {
        Level::Info
    };
    slog::Logger::root(TracingDrain.filter_level(level).fuse(), slog::o!())
}
