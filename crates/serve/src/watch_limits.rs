//! The bound on watchers per watch stream, shared by the member's Watch service and the gRPC
//! proxy's: etcd has none, so one client stream could hold a member's memory hostage with
//! creates. A create past the bound is refused like etcd refuses any create it cannot serve:
//! a `created` + `canceled` response with the reason.

/// Watchers one watch stream may hold.
pub const WATCHERS_PER_STREAM: usize = 100_000;

/// The cancel reason of a create refused by [`WATCHERS_PER_STREAM`].
pub fn too_many_watchers() -> String {
    format!("too many watchers on one stream (limit {WATCHERS_PER_STREAM})")
}
