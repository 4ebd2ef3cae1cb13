//! The member as the peer transport sees it (etcd's `EtcdServer` as a `rafthttp.Raft`): raft
//! for what peers send, the removed members' ids, the store's snapshots and the inbox of
//! received ones.

use std::path::PathBuf;
use std::sync::Weak;

use etcdrs_rafthttp::{SnapshotImage, Stopped};
use etcdrs_raftnode::RaftNodeHandle;
use etcdrs_raftnode::eraftpb::Message;
use tokio_util::sync::CancellationToken;

use super::Inner;

/// What the transport delivers to. It holds the member's state weakly: the state holds the
/// transport, and the transport its host.
pub struct PeerHost {
    pub(super) inner: Weak<Inner>,
    pub(super) raft: RaftNodeHandle,
    /// Cancelled when a peer says this member was removed.
    pub(super) removed: CancellationToken,
}

impl etcdrs_rafthttp::Raft for PeerHost {
    async fn step(&self, message: Message) -> Result<(), Stopped> {
        self.raft.step(message).await.map_err(|_| Stopped)
    }

    async fn report_snapshot(&self, to: u64, ok: bool) {
        let _ = self.raft.report_snapshot(to, ok).await;
    }

    fn is_removed(&self, id: u64) -> bool {
        self.inner
            .upgrade()
            .is_some_and(|inner| inner.removed_members.read().contains(&id))
    }

    fn is_member(&self, id: u64) -> bool {
        self.inner
            .upgrade()
            .is_some_and(|inner| inner.members.read().contains_key(&id))
    }

    fn removed(&self) {
        self.removed.cancel();
    }

    fn snapshot_image(&self, index: u64) -> Result<SnapshotImage, String> {
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| "the member has stopped".to_owned())?;
        crate::peer::snapshot_image(&inner.store, index)
    }

    fn snapshot_inbox(&self, index: u64) -> PathBuf {
        match self.inner.upgrade() {
            Some(inner) => inner.snapshot_receive_path(index),
            None => PathBuf::new(),
        }
    }

    fn snapshot_received(&self, index: u64, path: PathBuf) {
        match self.inner.upgrade() {
            Some(inner) => inner.snapshot_received(index, path),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}
