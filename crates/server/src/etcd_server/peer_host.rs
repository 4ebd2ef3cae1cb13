//! The member as the peer transport sees it (etcd's `EtcdServer` as a `rafthttp.Raft`): raft
//! for what peers send, the removed members' ids, the store's snapshots and the inbox of
//! received ones; and the transport's setup (its client with the peer TLS, its
//! configuration).
//!
//! This is where the transport meets the storage formats: a snapshot a link sends is the v2
//! store's JSON (`v2snap`) and the database in bbolt's form (`etcd_db`); the transport itself
//! knows neither.

use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use etcdrs_mvcc::KvStore;
use etcdrs_rafthttp::{PeerClient, SnapshotImage, Stopped};
use etcdrs_raftnode::RaftNodeHandle;
use etcdrs_raftnode::eraftpb::Message;
use tokio_util::sync::CancellationToken;

use super::Inner;
use crate::config::ServerConfig;
use crate::tls::TlsClient;

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

    fn snapshot_image(&self, index: u64, pairs: bool) -> Result<SnapshotImage, String> {
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| "the member has stopped".to_owned())?;
        if pairs {
            snapshot_pairs(&inner.store, index)
        } else {
            snapshot_image(&inner.store, index)
        }
    }

    fn snapshot_inbox(&self, index: u64) -> PathBuf {
        match self.inner.upgrade() {
            Some(inner) => inner.snapshot_receive_path(index),
            None => PathBuf::new(),
        }
    }

    fn snapshot_streamed(&self, index: u64, body: &mut (dyn Read + Send)) -> Result<(), String> {
        match self.inner.upgrade() {
            Some(inner) => inner.snapshot_streamed(index, body),
            None => Err("the member has stopped".to_owned()),
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

/// The transport this member's raft sends through.
pub type PeerTransport = etcdrs_rafthttp::Transport<PeerHost>;

/// The peer client for `config`: the peer TLS (`--peer-cert-file`, ...) for `https` URLs.
pub fn peer_client(config: &ServerConfig) -> Result<PeerClient, crate::ServerError> {
    let tls = match &config.peer_tls {
        Some(info) => {
            let tls: Arc<dyn etcdrs_rafthttp::PeerTls> = TlsClient::new(info.clone())?;
            Some(tls)
        }
        None => None,
    };
    Ok(PeerClient::new(tls))
}

/// The transport's configuration for member `member_id` of `cluster_id`.
pub(crate) fn transport_config(
    config: &ServerConfig,
    member_id: u64,
    cluster_id: u64,
    client: PeerClient,
) -> etcdrs_rafthttp::Config {
    etcdrs_rafthttp::Config {
        id: member_id,
        cluster_id,
        urls: config
            .initial_advertise_peer_urls
            .iter()
            .map(crate::url_string)
            .collect(),
        server_version: etcdrs_schema::version::SERVER_VERSION,
        // A leader's database stays within its quota (the NOSPACE alarm stops writes at it),
        // so an image over twice the quota is not one.
        snapshot_limit: config.quota_bytes().saturating_mul(2),
        client,
    }
}

/// A database image being sent, kept until it is read (dropping it removes its file).
struct ImageReader {
    _image: etcdrs_backend::Snapshot,
    file: std::fs::File,
}

impl Read for ImageReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }
}

/// The snapshot at raft index `index` as a link sends it, in etcd's form, which an etcd member
/// installs and so do we: the v2 store's JSON as the snapshot's data, and the database in
/// bbolt's format.
pub(crate) fn snapshot_image(store: &KvStore, index: u64) -> Result<SnapshotImage, String> {
    let started = std::time::Instant::now();
    let data = etcdrs_schema::v2snap::from_store(store, index).map_err(|e| e.to_string())?;
    let image = etcdrs_schema::etcd_db::snapshot(store.backend()).map_err(|e| e.to_string())?;
    let file = image.open().map_err(|e| e.to_string())?;
    tracing::info!(
        index,
        size_bytes = image.size(),
        took = ?started.elapsed(),
        "wrote database snapshot image in etcd's layout"
    );
    Ok(SnapshotImage {
        data,
        body: Box::new(ImageReader {
            _image: image,
            file,
        }),
        pairs: false,
    })
}

/// Bytes of a stream of pairs per chunk handed to the link.
const PAIRS_CHUNK: usize = 1 << 20;
/// Chunks written ahead of the link.
const PAIRS_AHEAD: usize = 4;

/// The snapshot at raft index `index` for an etcd-rs member: the v2 store's JSON as the
/// snapshot's data, and the database as a stream of pairs (`etcdrs_backend::transfer`),
/// walked by a thread of its own (`snapshot-pairs`) over one read transaction begun here, a
/// few chunks ahead of the link; it stops when the link drops the image.
pub(crate) fn snapshot_pairs(store: &KvStore, index: u64) -> Result<SnapshotImage, String> {
    let data = etcdrs_schema::v2snap::from_store(store, index).map_err(|e| e.to_string())?;
    let read = store.backend().read().map_err(|e| e.to_string())?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(PAIRS_AHEAD);
    std::thread::Builder::new()
        .name("snapshot-pairs".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let mut out = std::io::BufWriter::with_capacity(PAIRS_CHUNK, ChunkWriter(tx.clone()));
            match etcdrs_backend::transfer::send(&read, &mut out) {
                Ok(pairs) => {
                    tracing::debug!(index, pairs, took = ?started.elapsed(), "walked the database for a snapshot stream");
                }
                Err(e) => {
                    // The link learns the stream failed rather than seeing it end.
                    let _ = tx.send(Err(std::io::Error::other(e.to_string())));
                }
            }
        })
        .map_err(|e| format!("start the snapshot stream's thread: {e}"))?;
    Ok(SnapshotImage {
        data,
        body: Box::new(ChunkReader {
            rx,
            chunk: Vec::new(),
            at: 0,
        }),
        pairs: true,
    })
}

/// Hands what is written to the link's reader, a chunk at a time (the `BufWriter` over it
/// makes the chunks); fails once the reader is gone.
struct ChunkWriter(std::sync::mpsc::SyncSender<std::io::Result<Vec<u8>>>);

impl std::io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .send(Ok(buf.to_vec()))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The chunks [`ChunkWriter`] hands over, as a reader; the end of the queue is the end.
struct ChunkReader {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
