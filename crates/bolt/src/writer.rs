//! The writer: [`Writer`], which lays out a fresh, compact bbolt file from sorted input.
//!
//! It owns the bottom-up construction of each bucket's B+tree as keys stream in: a leaf page
//! is written as soon as the next key would not fit, and only one pending page per tree level
//! (first key and page id of each child) stays in memory, so memory is bounded by the tree's
//! height, not by the data. It is not a storage engine: no updates, no freelist reuse, no
//! nested buckets. Pages are written in id order except the two meta pages, which are written
//! last over placeholders, so a file cut short by a crash has no valid meta and bbolt refuses
//! it.
//!
//! Layout: pages 0 and 1 are the metas, then each bucket's leaf and branch pages in input
//! order, then the root bucket's pages, then an empty freelist page. A bucket whose keys fit
//! in a quarter page is stored inline in its header, as bbolt does.

use std::io::{Seek, SeekFrom, Write};

use crate::error::{Error, Result, escape};
use crate::page::{
    BRANCH_ELEMENT_SIZE, BRANCH_PAGE_FLAG, BUCKET_HEADER_SIZE, BUCKET_LEAF_FLAG,
    FREELIST_PAGE_FLAG, LEAF_ELEMENT_SIZE, LEAF_PAGE_FLAG, MAGIC, MAX_KEY_SIZE, MAX_VALUE_SIZE,
    META_PAGE_FLAG, Meta, PAGE_HEADER_SIZE, PageHeader, VERSION,
};

/// etcd's page size on x86_64 Linux (bbolt uses `os.Getpagesize()`).
const PAGE_SIZE: usize = 4096;
/// Pages are filled up to this many bytes before the next one starts: 100%, as the input is
/// already sorted and a compact file is the point (etcd's defrag fills to 90%).
const FILL_BYTES: usize = PAGE_SIZE;
/// bbolt inlines a bucket whose single leaf page is at most a quarter page.
const MAX_INLINE_BUCKET_SIZE: usize = PAGE_SIZE / 4;
/// A page's element count is a u16.
const MAX_ELEMENTS: usize = 0xFFFE;
/// The txids of the two metas: page 0 holds the newer, page 1 the older; both describe the
/// same tree. bbolt keeps meta `txid` on page `txid % 2`, and its next write goes to page 1.
const TXID_PAGE0: u64 = 2;
const TXID_PAGE1: u64 = 1;

/// Writes a fresh compact bbolt file: buckets in ascending name order, keys ascending within
/// each bucket (byte order, as Go's `bytes.Compare`). Out-of-order input is an error.
///
/// Call [`Writer::bucket`] to begin each top-level bucket, [`Writer::put`] for its keys,
/// then [`Writer::finish`]. The output is written as it goes; wrap a file in a
/// `BufWriter` to batch the page writes.
pub struct Writer<W: Write + Seek> {
    out: W,
    /// The next page id to allocate: every page below it has been written.
    next_pgid: u64,
    /// Finished buckets: name and bucket value (header, plus the page if inline).
    buckets: Vec<(Vec<u8>, Vec<u8>)>,
    /// The bucket being written, if any.
    current: Option<OpenBucket>,
    /// A zeroed buffer pages are encoded into.
    page_buf: Vec<u8>,
}

/// The bucket being written: its name, last key and tree.
struct OpenBucket {
    name: Vec<u8>,
    last_key: Option<Vec<u8>>,
    tree: TreeBuilder,
}

/// A B+tree built bottom-up from ascending keys.
#[derive(Default)]
struct TreeBuilder {
    leaf: PendingLeaf,
    leaves_written: u64,
    /// `levels[0]` holds the children of the lowest branch pages, and so on up.
    levels: Vec<PendingBranch>,
}

/// The leaf page being filled: element headers and their keys and values, in order.
#[derive(Default)]
struct PendingLeaf {
    /// Per element: flags, key length, value length.
    elements: Vec<(u32, u32, u32)>,
    data: Vec<u8>,
}

impl PendingLeaf {
    fn size(&self) -> usize {
        PAGE_HEADER_SIZE + self.elements.len() * LEAF_ELEMENT_SIZE + self.data.len()
    }

    fn first_key(&self) -> Vec<u8> {
        let key_len = self
            .elements
            .first()
            .map_or(0, |(_, ksize, _)| *ksize as usize);
        self.data[..key_len].to_vec()
    }

    /// Encodes the page into `buf` (already zeroed and long enough).
    fn encode(&self, header: PageHeader, buf: &mut [u8]) {
        header.encode(buf);
        let mut data_at = PAGE_HEADER_SIZE + self.elements.len() * LEAF_ELEMENT_SIZE;
        let mut source_at = 0;
        for (index, &(flags, ksize, vsize)) in self.elements.iter().enumerate() {
            let element_at = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
            let pos = (data_at - element_at) as u32;
            buf[element_at..element_at + 4].copy_from_slice(&flags.to_le_bytes());
            buf[element_at + 4..element_at + 8].copy_from_slice(&pos.to_le_bytes());
            buf[element_at + 8..element_at + 12].copy_from_slice(&ksize.to_le_bytes());
            buf[element_at + 12..element_at + 16].copy_from_slice(&vsize.to_le_bytes());
            let len = (ksize + vsize) as usize;
            buf[data_at..data_at + len].copy_from_slice(&self.data[source_at..source_at + len]);
            data_at += len;
            source_at += len;
        }
    }

    fn clear(&mut self) {
        self.elements.clear();
        self.data.clear();
    }
}

/// The branch page being filled at one level: first key and page id of each child.
#[derive(Default)]
struct PendingBranch {
    children: Vec<(Vec<u8>, u64)>,
    size: usize,
    pages_written: u64,
}

impl PendingBranch {
    fn push(&mut self, key: Vec<u8>, pgid: u64) {
        if self.children.is_empty() {
            self.size = PAGE_HEADER_SIZE;
        }
        self.size += BRANCH_ELEMENT_SIZE + key.len();
        self.children.push((key, pgid));
    }

    fn is_full_for(&self, key_len: usize) -> bool {
        !self.children.is_empty()
            && (self.size + BRANCH_ELEMENT_SIZE + key_len > FILL_BYTES
                || self.children.len() >= MAX_ELEMENTS)
    }
}

/// Where a finished tree's root is.
enum TreeRoot {
    Page(u64),
    /// The encoded leaf page, to store inline in the bucket header.
    Inline(Vec<u8>),
}

impl<W: Write + Seek> Writer<W> {
    /// Starts a file at offset 0 of `out`, with 4096-byte pages, by writing placeholders for
    /// the two meta pages, which `finish` fills in.
    pub fn new(mut out: W) -> Result<Self> {
        out.seek(SeekFrom::Start(0)).map_err(Error::Write)?;
        out.write_all(&[0u8; 2 * PAGE_SIZE]).map_err(Error::Write)?;
        Ok(Writer {
            out,
            next_pgid: 2,
            buckets: Vec::new(),
            current: None,
            page_buf: Vec::new(),
        })
    }

    /// Ends the current bucket, if any, and begins the top-level bucket `name`, which must
    /// sort after the previous one. A bucket with no keys is legal.
    pub fn bucket(&mut self, name: &[u8]) -> Result<()> {
        if name.is_empty() {
            return Err(Error::Required("bucket name"));
        }
        if name.len() > MAX_KEY_SIZE {
            return Err(Error::KeyTooLarge { len: name.len() });
        }
        let previous = self
            .current
            .as_ref()
            .map(|open| open.name.as_slice())
            .or_else(|| self.buckets.last().map(|(name, _)| name.as_slice()));
        if let Some(previous) = previous
            && name <= previous
        {
            return Err(Error::OutOfOrder {
                what: "bucket",
                previous: escape(previous),
                current: escape(name),
            });
        }
        self.end_bucket()?;
        self.current = Some(OpenBucket {
            name: name.to_vec(),
            last_key: None,
            tree: TreeBuilder::default(),
        });
        Ok(())
    }

    /// Adds `key`/`value` to the current bucket; `key` must sort after the previous key.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let Some(open) = self.current.as_mut() else {
            return Err(Error::NoBucket);
        };
        if key.is_empty() {
            return Err(Error::Required("key"));
        }
        if key.len() > MAX_KEY_SIZE {
            return Err(Error::KeyTooLarge { len: key.len() });
        }
        if value.len() > MAX_VALUE_SIZE {
            return Err(Error::ValueTooLarge { len: value.len() });
        }
        match &mut open.last_key {
            Some(last) if key <= last.as_slice() => {
                return Err(Error::OutOfOrder {
                    what: "key",
                    previous: escape(last),
                    current: escape(key),
                });
            }
            Some(last) => {
                last.clear();
                last.extend_from_slice(key);
            }
            None => open.last_key = Some(key.to_vec()),
        }
        let mut tree = std::mem::take(&mut open.tree);
        let result = self.push_leaf_element(&mut tree, 0, key, value);
        if let Some(open) = self.current.as_mut() {
            open.tree = tree;
        }
        result
    }

    /// Ends the last bucket and writes the root bucket, an empty freelist page and both meta
    /// pages. Returns the output, positioned at its end, and the file length (high-water
    /// mark times page size).
    pub fn finish(mut self) -> Result<(W, u64)> {
        self.end_bucket()?;
        let buckets = std::mem::take(&mut self.buckets);
        let mut root_tree = TreeBuilder::default();
        for (name, value) in &buckets {
            self.push_leaf_element(&mut root_tree, BUCKET_LEAF_FLAG, name, value)?;
        }
        let root = match self.finish_tree(root_tree, false)? {
            TreeRoot::Page(pgid) => pgid,
            TreeRoot::Inline(_) => unreachable!("the root bucket is never inline"),
        };

        let freelist = self.next_pgid;
        self.write_page(
            PageHeader {
                id: freelist,
                flags: FREELIST_PAGE_FLAG,
                count: 0,
                overflow: 0,
            },
            |_| {},
        )?;
        let high_water = self.next_pgid;

        for (page_id, txid) in [(0u64, TXID_PAGE0), (1, TXID_PAGE1)] {
            let meta = Meta {
                magic: MAGIC,
                version: VERSION,
                page_size: PAGE_SIZE as u32,
                flags: 0,
                root,
                root_sequence: 0,
                freelist,
                pgid: high_water,
                txid,
                checksum: 0,
            };
            let mut page = [0u8; PAGE_SIZE];
            PageHeader {
                id: page_id,
                flags: META_PAGE_FLAG,
                count: 0,
                overflow: 0,
            }
            .encode(&mut page);
            let encoded = meta.encode();
            page[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + encoded.len()].copy_from_slice(&encoded);
            self.out
                .seek(SeekFrom::Start(page_id * PAGE_SIZE as u64))
                .map_err(Error::Write)?;
            self.out.write_all(&page).map_err(Error::Write)?;
        }
        let file_len = high_water * PAGE_SIZE as u64;
        self.out
            .seek(SeekFrom::Start(file_len))
            .map_err(Error::Write)?;
        self.out.flush().map_err(Error::Write)?;
        Ok((self.out, file_len))
    }

    /// Finishes the open bucket's tree and records its header.
    fn end_bucket(&mut self) -> Result<()> {
        let Some(open) = self.current.take() else {
            return Ok(());
        };
        let mut value = vec![0u8; BUCKET_HEADER_SIZE];
        match self.finish_tree(open.tree, true)? {
            TreeRoot::Page(pgid) => value[..8].copy_from_slice(&pgid.to_le_bytes()),
            TreeRoot::Inline(page) => value.extend_from_slice(&page),
        }
        self.buckets.push((open.name, value));
        Ok(())
    }

    /// Appends an element to the tree's pending leaf, writing the leaf out first if the
    /// element would not fit in it.
    fn push_leaf_element(
        &mut self,
        tree: &mut TreeBuilder,
        flags: u32,
        key: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let element_size = LEAF_ELEMENT_SIZE + key.len() + value.len();
        let leaf = &tree.leaf;
        if !leaf.elements.is_empty()
            && (leaf.size() + element_size > FILL_BYTES || leaf.elements.len() >= MAX_ELEMENTS)
        {
            self.flush_leaf(tree)?;
        }
        tree.leaf
            .elements
            .push((flags, key.len() as u32, value.len() as u32));
        tree.leaf.data.extend_from_slice(key);
        tree.leaf.data.extend_from_slice(value);
        Ok(())
    }

    /// Writes the pending leaf (one page plus overflow pages if it is larger) and adds it
    /// to the lowest branch level.
    fn flush_leaf(&mut self, tree: &mut TreeBuilder) -> Result<()> {
        let pgid = self.next_pgid;
        let size = tree.leaf.size();
        let header = PageHeader {
            id: pgid,
            flags: LEAF_PAGE_FLAG,
            count: tree.leaf.elements.len() as u16,
            overflow: overflow_for(size)?,
        };
        let leaf = &tree.leaf;
        self.write_page(header, |buf| leaf.encode(header, buf))?;
        let first_key = tree.leaf.first_key();
        tree.leaf.clear();
        tree.leaves_written += 1;
        self.push_branch_child(tree, 0, first_key, pgid)
    }

    /// Adds a child to branch level `level`, writing that level's page out first if full.
    fn push_branch_child(
        &mut self,
        tree: &mut TreeBuilder,
        level: usize,
        key: Vec<u8>,
        pgid: u64,
    ) -> Result<()> {
        if tree.levels.len() == level {
            tree.levels.push(PendingBranch::default());
        }
        if tree.levels[level].is_full_for(key.len()) {
            self.flush_branch(tree, level)?;
        }
        tree.levels[level].push(key, pgid);
        Ok(())
    }

    /// Writes level `level`'s pending branch page and adds it to the level above.
    fn flush_branch(&mut self, tree: &mut TreeBuilder, level: usize) -> Result<()> {
        let pending = std::mem::take(&mut tree.levels[level].children);
        tree.levels[level].size = 0;
        tree.levels[level].pages_written += 1;
        let pgid = self.next_pgid;
        let size = PAGE_HEADER_SIZE
            + pending
                .iter()
                .map(|(key, _)| BRANCH_ELEMENT_SIZE + key.len())
                .sum::<usize>();
        let header = PageHeader {
            id: pgid,
            flags: BRANCH_PAGE_FLAG,
            count: pending.len() as u16,
            overflow: overflow_for(size)?,
        };
        self.write_page(header, |buf| {
            header.encode(buf);
            let mut data_at = PAGE_HEADER_SIZE + pending.len() * BRANCH_ELEMENT_SIZE;
            for (index, (key, child)) in pending.iter().enumerate() {
                let element_at = PAGE_HEADER_SIZE + index * BRANCH_ELEMENT_SIZE;
                let pos = (data_at - element_at) as u32;
                buf[element_at..element_at + 4].copy_from_slice(&pos.to_le_bytes());
                buf[element_at + 4..element_at + 8]
                    .copy_from_slice(&(key.len() as u32).to_le_bytes());
                buf[element_at + 8..element_at + 16].copy_from_slice(&child.to_le_bytes());
                buf[data_at..data_at + key.len()].copy_from_slice(key);
                data_at += key.len();
            }
        })?;
        let mut pending = pending;
        let first_key = std::mem::take(&mut pending[0].0);
        self.push_branch_child(tree, level + 1, first_key, pgid)
    }

    /// Writes what is pending in `tree`, bottom-up, and returns its root.
    fn finish_tree(&mut self, mut tree: TreeBuilder, allow_inline: bool) -> Result<TreeRoot> {
        if tree.leaves_written == 0 {
            if allow_inline && tree.leaf.size() <= MAX_INLINE_BUCKET_SIZE {
                let mut page = vec![0u8; tree.leaf.size()];
                let header = PageHeader {
                    id: 0,
                    flags: LEAF_PAGE_FLAG,
                    count: tree.leaf.elements.len() as u16,
                    overflow: 0,
                };
                tree.leaf.encode(header, &mut page);
                return Ok(TreeRoot::Inline(page));
            }
            // A lone leaf, possibly empty, is the root.
            let pgid = self.next_pgid;
            self.flush_leaf(&mut tree)?;
            return Ok(TreeRoot::Page(pgid));
        }
        if !tree.leaf.elements.is_empty() {
            self.flush_leaf(&mut tree)?;
        }
        let mut level = 0;
        loop {
            let is_top = level + 1 == tree.levels.len();
            let pending = &tree.levels[level];
            if is_top && pending.pages_written == 0 && pending.children.len() == 1 {
                return Ok(TreeRoot::Page(pending.children[0].1));
            }
            if !pending.children.is_empty() {
                self.flush_branch(&mut tree, level)?;
            }
            level += 1;
        }
    }

    /// Writes one page (and its overflow pages) at `header.id`, which must be the next id.
    fn write_page(&mut self, header: PageHeader, fill: impl FnOnce(&mut [u8])) -> Result<()> {
        debug_assert_eq!(header.id, self.next_pgid, "pages are written in id order");
        let n_pages = header.overflow as usize + 1;
        self.page_buf.clear();
        self.page_buf.resize(n_pages * PAGE_SIZE, 0);
        header.encode(&mut self.page_buf);
        fill(&mut self.page_buf);
        self.out.write_all(&self.page_buf).map_err(Error::Write)?;
        self.next_pgid += n_pages as u64;
        Ok(())
    }
}

/// The number of overflow pages a node of `size` bytes needs beyond its first page.
fn overflow_for(size: usize) -> Result<u32> {
    let n_pages = size.div_ceil(PAGE_SIZE).max(1);
    u32::try_from(n_pages - 1).map_err(|_| Error::ValueTooLarge { len: size })
}
