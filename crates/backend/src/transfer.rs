//! A backend's pairs as one byte stream, and such a stream written into a fresh backend: what
//! an etcd-rs leader sends an etcd-rs member that joins through a snapshot, in place of etcd's
//! bbolt image (which the leader would first have to write out whole and the member read back
//! into redb).
//!
//! The stream is written as a read transaction is walked and read as it arrives, so neither
//! side keeps more than a buffer of it: the leader's walk, the network and the member's writes
//! overlap, where the bbolt image costs a file written, then sent, then converted.
//!
//! ```text
//! magic   "etcd-rs pairs 1\n"                        16 bytes
//! bucket  0x01, name length (u8), name                one per bucket, before its pairs
//! pair    0x02, key length (u32 LE), value length (u32 LE), key, value
//! end     0x03, pairs (u64 LE), CRC-32C (u32 LE) of every byte before the CRC
//! ```
//!
//! **Invariant:** a stream is taken only whole: [`receive`] fails on anything after the end
//! record, before it, or a checksum that does not match, and the caller then drops the
//! backend it wrote into (it is a fresh file that nothing else uses).

use std::io::{Read, Write};

use crate::{Backend, Bucket, Error, ReadTx, Result};

/// What a stream starts with.
pub const MAGIC: &[u8; 16] = b"etcd-rs pairs 1\n";
const BUCKET: u8 = 1;
const PAIR: u8 = 2;
const END: u8 = 3;
/// Bytes [`receive`] writes before it commits (not durably) and begins the next transaction.
const COMMIT_BYTES: u64 = 16 << 20;

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("snapshot pair stream: {what}"),
    ))
}

/// `out`, checksummed as it is written.
struct Summed<W> {
    out: W,
    crc: crate::crc32c::Crc32c,
}

impl<W: Write> Summed<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.crc.update(bytes);
        self.out.write_all(bytes).map_err(Error::Io)
    }
}

/// Write every pair `read` sees, bucket by bucket, to `out`; returns the pairs written.
pub fn send(read: &ReadTx, out: impl Write) -> Result<u64> {
    let mut out = Summed {
        out,
        crc: crate::crc32c::Crc32c::new(),
    };
    out.put(MAGIC)?;
    let mut pairs = 0u64;
    for bucket in Bucket::ALL {
        let name = bucket.name().as_bytes();
        out.put(&[BUCKET, name.len() as u8])?;
        out.put(name)?;
        read.try_for_each_in(bucket, &[], None, |key, value| {
            let (Ok(key_len), Ok(value_len)) =
                (u32::try_from(key.len()), u32::try_from(value.len()))
            else {
                return Err(bad("a pair longer than 4 GiB"));
            };
            let mut head = [0u8; 9];
            head[0] = PAIR;
            head[1..5].copy_from_slice(&key_len.to_le_bytes());
            head[5..9].copy_from_slice(&value_len.to_le_bytes());
            out.put(&head)?;
            out.put(key)?;
            out.put(value)?;
            pairs += 1;
            Ok::<_, Error>(true)
        })?;
    }
    out.put(&[END])?;
    out.put(&pairs.to_le_bytes())?;
    let sum = out.crc.sum();
    out.out.write_all(&sum.to_le_bytes()).map_err(Error::Io)?;
    out.out.flush().map_err(Error::Io)?;
    Ok(pairs)
}

/// Pairs of one bucket read from a stream, end to end in one buffer: what [`receive`] hands
/// its caller after writing them (the server's indexer takes the `key` bucket's as they are).
#[derive(Debug)]
pub struct Batch {
    /// The bucket they belong to.
    pub bucket: Bucket,
    pub(crate) bytes: Vec<u8>,
    /// Length of each key and of its value, in order.
    pub(crate) lens: Vec<(usize, usize)>,
}

impl Batch {
    /// An empty batch of `bucket`.
    pub fn new(bucket: Bucket) -> Batch {
        Batch {
            bucket,
            bytes: Vec::new(),
            lens: Vec::new(),
        }
    }

    /// Add a pair.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.lens.push((key.len(), value.len()));
    }

    /// Pairs in it.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether it holds no pair.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Bytes of its keys and values.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Its pairs, in the order they came.
    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut at = 0;
        self.lens.iter().map(move |&(key_len, value_len)| {
            let key = &self.bytes[at..at + key_len];
            let value = &self.bytes[at + key_len..at + key_len + value_len];
            at += key_len + value_len;
            (key, value)
        })
    }
}

/// Bytes of keys and values per [`Batch`] the reading thread hands over.
const BATCH_BYTES: usize = 1 << 20;
/// Batches read ahead of the writer.
const BATCHES_AHEAD: usize = 8;

/// `input`, checksummed as it is read.
struct Checked<R> {
    input: R,
    crc: crate::crc32c::Crc32c,
}

impl<R: Read> Checked<R> {
    fn exact<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut bytes = [0u8; N];
        self.input
            .read_exact(&mut bytes)
            .map_err(|e| bad(format!("cut short ({e})")))?;
        self.crc.update(&bytes);
        Ok(bytes)
    }

    /// The next `len` bytes, appended to `buf` (grown as they arrive, not ahead of them).
    fn append(&mut self, len: usize, buf: &mut Vec<u8>) -> Result<()> {
        let at = buf.len();
        let got = (&mut self.input)
            .take(len as u64)
            .read_to_end(buf)
            .map_err(|e| bad(format!("cut short ({e})")))?;
        if got != len {
            return Err(bad("cut short"));
        }
        self.crc.update(&buf[at..]);
        Ok(())
    }
}

/// Read and check a stream that [`send`] wrote, handing its pairs to `each` in batches of one
/// bucket; returns the pairs read. Fails, having handed over what came before, on a stream
/// that is not whole (the caller drops what it made of them).
fn parse(input: impl Read, mut each: impl FnMut(Batch) -> Result<()>) -> Result<u64> {
    let mut input = Checked {
        input,
        crc: crate::crc32c::Crc32c::new(),
    };
    if &input.exact::<16>()? != MAGIC {
        return Err(bad("not a stream of pairs"));
    }
    let mut name = Vec::new();
    let mut batch: Option<Batch> = None;
    let mut pairs = 0u64;
    loop {
        let [kind] = input.exact::<1>()?;
        match kind {
            BUCKET => {
                let [len] = input.exact::<1>()?;
                name.clear();
                input.append(len as usize, &mut name)?;
                let bucket = Bucket::ALL
                    .into_iter()
                    .find(|b| b.name().as_bytes() == name.as_slice())
                    .ok_or_else(|| {
                        bad(format!(
                            "unknown bucket {:?}",
                            String::from_utf8_lossy(&name)
                        ))
                    })?;
                if let Some(full) = batch.replace(Batch::new(bucket))
                    && !full.is_empty()
                {
                    each(full)?;
                }
            }
            PAIR => {
                let Some(current) = batch.as_mut() else {
                    return Err(bad("a pair before any bucket"));
                };
                let head = input.exact::<8>()?;
                let key_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
                let value_len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
                input.append(key_len as usize, &mut current.bytes)?;
                input.append(value_len as usize, &mut current.bytes)?;
                current.lens.push((key_len as usize, value_len as usize));
                pairs += 1;
                if current.bytes.len() >= BATCH_BYTES {
                    let bucket = current.bucket;
                    if let Some(full) = batch.replace(Batch::new(bucket)) {
                        each(full)?;
                    }
                }
            }
            END => {
                let count = u64::from_le_bytes(input.exact::<8>()?);
                let sum = input.crc.sum();
                let mut stored = [0u8; 4];
                input
                    .input
                    .read_exact(&mut stored)
                    .map_err(|e| bad(format!("cut short ({e})")))?;
                if u32::from_le_bytes(stored) != sum {
                    return Err(bad("checksum mismatch"));
                }
                if count != pairs {
                    return Err(bad(format!("{pairs} pairs where the end says {count}")));
                }
                let mut rest = [0u8; 1];
                if input.input.read(&mut rest).map_err(Error::Io)? != 0 {
                    return Err(bad("bytes after the end"));
                }
                if let Some(last) = batch.take()
                    && !last.is_empty()
                {
                    each(last)?;
                }
                return Ok(pairs);
            }
            other => return Err(bad(format!("unknown record {other}"))),
        }
    }
}

/// Read a stream that [`send`] wrote from `input` into `backend` (a fresh one nothing else
/// uses), handing each batch of pairs to `on_batch` once it is written; the last commit is
/// durable, and made only once the stream proved whole. Returns the pairs read.
///
/// A thread of its own (`snapshot-parse`) reads and checks the stream a few batches ahead,
/// so the caller's thread only writes.
pub fn receive(
    input: &mut (dyn Read + Send),
    backend: &Backend,
    mut on_batch: impl FnMut(Batch),
) -> Result<u64> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(BATCHES_AHEAD);
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("snapshot-parse".into())
            .spawn_scoped(scope, move || {
                parse(input, |batch| {
                    tx.send(batch)
                        .map_err(|_| bad("the writer stopped reading"))
                })
            })
            .map_err(Error::Io)?;
        let written = write_batches(rx, backend, &mut on_batch);
        let parsed = reader
            .join()
            .map_err(|_| bad("the reading thread panicked"))?;
        // The writer's error first: a reader that failed ended the writer's batches without
        // one, while a writer that failed made the reader fail too.
        written?;
        let pairs = parsed?;
        backend.write()?.commit(true)?;
        Ok(pairs)
    })
}

/// Write every batch from `rx` into `backend`, committing (not durably) every
/// [`COMMIT_BYTES`]; each batch goes to `on_batch` once written.
fn write_batches(
    rx: std::sync::mpsc::Receiver<Batch>,
    backend: &Backend,
    on_batch: &mut impl FnMut(Batch),
) -> Result<()> {
    let mut pending = 0u64;
    let mut tx = None;
    for batch in rx {
        let write = match &tx {
            Some(write) => write,
            None => tx.insert(backend.write()?),
        };
        write.put_batch(&batch)?;
        pending += batch.bytes() as u64;
        if pending >= COMMIT_BYTES {
            pending = 0;
            if let Some(write) = tx.take() {
                write.commit(false)?;
            }
        }
        on_batch(batch);
    }
    if let Some(write) = tx.take() {
        write.commit(false)?;
    }
    Ok(())
}
