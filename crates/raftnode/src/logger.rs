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

/// A `slog::Logger` that writes to `tracing`.
pub fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}
