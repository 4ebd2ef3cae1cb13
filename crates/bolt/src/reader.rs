//! The reader: [`Db`], a bbolt file opened read-only and walked with positioned reads.
//!
//! It owns meta selection (bbolt's `db.meta()`: the valid meta with the higher txid), page
//! bounds checks, and the in-order walk of a bucket's B+tree (bbolt's cursor, without the
//! node cache). Only pages the walk reaches are read, one at a time, so a multi-GB file costs
//! no more memory than its deepest path. It is not a storage engine: no writes, no freelist,
//! no transactions; it trusts that nothing writes the file while it is open, as bbolt's own
//! read-only open does not either when no writer runs.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{CorruptReason, Error, Result, escape};
use crate::page::{
    BRANCH_ELEMENT_SIZE, BRANCH_PAGE_FLAG, BUCKET_HEADER_SIZE, BUCKET_LEAF_FLAG, LEAF_ELEMENT_SIZE,
    LEAF_PAGE_FLAG, META_SIZE, Meta, MetaError, PAGE_HEADER_SIZE, PageHeader, u32_at, u64_at,
};

/// bbolt reads the first 4 KiB to find the page size; a file whose first meta is damaged is
/// assumed to use the OS page size, which is 4096 where etcd runs.
const DEFAULT_PAGE_SIZE: u32 = 4096;
/// Larger page sizes than this are taken as corruption (bbolt uses the OS page size: 4 KiB,
/// 16 KiB or 64 KiB).
const MAX_PAGE_SIZE: u32 = 1 << 20;
/// Far deeper than any real tree (a 4 KiB-page tree of depth 16 holds more than 2^64 keys),
/// so a deeper one has a loop.
const MAX_DEPTH: usize = 32;

/// A bbolt file opened read-only.
///
/// Pages are read with positioned reads (`pread`), so the file is never read whole into
/// memory and a `Db` can be shared between threads. Bytes after the last page (etcd's
/// 32-byte SHA-256 trailer on snapshot files) are ignored, as bbolt ignores them.
#[derive(Debug)]
pub struct Db {
    file: File,
    path: PathBuf,
    meta: Meta,
    file_size: u64,
}

/// Where a bucket's tree starts: a page, or a page stored inline in the bucket's value.
enum BucketRoot {
    Page(u64),
    Inline(Vec<u8>),
}

/// One element of a leaf page.
struct LeafElement<'a> {
    flags: u32,
    key: &'a [u8],
    value: &'a [u8],
}

/// One element of a branch page.
struct BranchElement<'a> {
    key: &'a [u8],
    child: u64,
}

/// A parsed page: a leaf's key/values or a branch's children.
enum Node<'a> {
    Leaf(Vec<LeafElement<'a>>),
    Branch(Vec<BranchElement<'a>>),
}

impl Db {
    /// Opens `path` read-only and validates its meta pages: magic `0xED0CDAED`, version 2,
    /// FNV-1a checksum. Of the valid metas, the one with the higher txid is used. The file
    /// must hold every page below the meta's high-water mark.
    pub fn open(path: &Path) -> Result<Db> {
        let io_error = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_error)?;
        let file_size = file.metadata().map_err(io_error)?.len();
        let min_size = 2 * u64::from(DEFAULT_PAGE_SIZE);
        let too_small = |needed| Error::FileTooSmall {
            path: path.to_path_buf(),
            size: file_size,
            needed,
        };
        if file_size < (PAGE_HEADER_SIZE + META_SIZE) as u64 {
            return Err(too_small(min_size));
        }

        let read_meta = |offset: u64| -> Result<(Meta, [u8; META_SIZE])> {
            let mut raw = [0u8; META_SIZE];
            file.read_exact_at(&mut raw, offset + PAGE_HEADER_SIZE as u64)
                .map_err(io_error)?;
            let meta = Meta::parse(&raw).expect("a meta buffer is META_SIZE bytes");
            Ok((meta, raw))
        };
        let (meta0, raw0) = read_meta(0)?;
        let valid0 = meta0.validate(&raw0);
        let page_size = match valid0 {
            Ok(()) => meta0.page_size,
            Err(_) => DEFAULT_PAGE_SIZE,
        };
        if !page_size.is_power_of_two() || !(512..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(Error::InvalidPageSize {
                path: path.to_path_buf(),
                page_size,
            });
        }
        if file_size < 2 * u64::from(page_size) {
            return Err(too_small(2 * u64::from(page_size)));
        }
        let (meta1, raw1) = read_meta(u64::from(page_size))?;
        let valid1 = meta1.validate(&raw1);

        let chosen = match (valid0, valid1) {
            (Ok(()), Ok(())) if meta1.txid > meta0.txid => meta1,
            (Ok(()), _) => meta0,
            (Err(_), Ok(())) => meta1,
            (Err(error), Err(_)) => return Err(meta_error(path, error)),
        };
        if chosen.page_size != page_size {
            return Err(Error::InvalidPageSize {
                path: path.to_path_buf(),
                page_size: chosen.page_size,
            });
        }
        let needed = chosen.pgid.saturating_mul(u64::from(page_size));
        if chosen.pgid < 2 || file_size < needed {
            return Err(too_small(needed.max(min_size)));
        }
        let db = Db {
            file,
            path: path.to_path_buf(),
            meta: chosen,
            file_size,
        };
        if chosen.root >= chosen.pgid {
            return Err(db.corrupt(chosen.root, db.out_of_bounds()));
        }
        Ok(db)
    }

    /// The page size the file was written with.
    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    /// The txid of the meta in use.
    pub fn tx_id(&self) -> u64 {
        self.meta.txid
    }

    /// The file's length in bytes, trailing bytes after the last page included.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// The database size as bbolt's `Tx.Size` reports it: high-water mark times page size.
    pub fn size(&self) -> u64 {
        self.meta.pgid * u64::from(self.meta.page_size)
    }

    /// The names of the top-level buckets, in key order.
    pub fn bucket_names(&self) -> Result<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        self.walk(
            &BucketRoot::Page(self.meta.root),
            0,
            &mut |flags, key, _value| -> Result<()> {
                if flags & BUCKET_LEAF_FLAG == 0 {
                    return Err(Error::NotABucket {
                        path: self.path.clone(),
                        key: escape(key),
                    });
                }
                names.push(key.to_vec());
                Ok(())
            },
        )?;
        Ok(names)
    }

    /// Calls `f` with every key/value of the top-level bucket `bucket`, in key order.
    ///
    /// Inline buckets and values spanning overflow pages are read like any other. A nested
    /// bucket inside `bucket` is an error ([`Error::NestedBucket`]) rather than skipped, so
    /// that an import never silently loses data; etcd's buckets have none. The first error
    /// `f` returns stops the walk and is returned.
    pub fn for_each<E: From<Error>>(
        &self,
        bucket: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let root = self.bucket_root(bucket)?;
        self.walk(&root, 0, &mut |flags, key, value| {
            if flags & BUCKET_LEAF_FLAG != 0 {
                return Err(E::from(self.nested(bucket, key)));
            }
            f(key, value)
        })
    }

    /// The value of `key` in the top-level bucket `bucket`, if there is one.
    pub fn get(&self, bucket: &[u8], key: &[u8]) -> Result<Option<Vec<u8>>> {
        let root = self.bucket_root(bucket)?;
        match self.seek(&root, key)? {
            Some((flags, _)) if flags & BUCKET_LEAF_FLAG != 0 => Err(self.nested(bucket, key)),
            Some((_, value)) => Ok(Some(value)),
            None => Ok(None),
        }
    }

    /// The number of keys in the top-level bucket `bucket`.
    pub fn len(&self, bucket: &[u8]) -> Result<u64> {
        let mut n_keys = 0u64;
        self.for_each(bucket, |_, _| -> Result<()> {
            n_keys += 1;
            Ok(())
        })?;
        Ok(n_keys)
    }

    /// Finds a top-level bucket's root.
    fn bucket_root(&self, name: &[u8]) -> Result<BucketRoot> {
        let Some((flags, value)) = self.seek(&BucketRoot::Page(self.meta.root), name)? else {
            return Err(Error::BucketNotFound {
                path: self.path.clone(),
                bucket: escape(name),
            });
        };
        if flags & BUCKET_LEAF_FLAG == 0 {
            return Err(Error::NotABucket {
                path: self.path.clone(),
                key: escape(name),
            });
        }
        let Some(root) = u64_at(&value, 0).filter(|_| value.len() >= BUCKET_HEADER_SIZE) else {
            return Err(self.corrupt(
                self.meta.root,
                CorruptReason::ShortBucketHeader {
                    key: escape(name),
                    len: value.len(),
                },
            ));
        };
        if root == 0 {
            Ok(BucketRoot::Inline(value[BUCKET_HEADER_SIZE..].to_vec()))
        } else {
            Ok(BucketRoot::Page(root))
        }
    }

    /// Visits every leaf element under `root` in key order.
    fn walk<E: From<Error>>(
        &self,
        root: &BucketRoot,
        depth: usize,
        f: &mut impl FnMut(u32, &[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        match root {
            BucketRoot::Inline(page) => self.walk_buffer(0, page, depth, f),
            BucketRoot::Page(id) => {
                let page = self.read_page(*id)?;
                self.walk_buffer(*id, &page, depth, f)
            }
        }
    }

    fn walk_buffer<E: From<Error>>(
        &self,
        id: u64,
        page: &[u8],
        depth: usize,
        f: &mut impl FnMut(u32, &[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        if depth > MAX_DEPTH {
            return Err(E::from(
                self.corrupt(id, CorruptReason::TooDeep { max: MAX_DEPTH }),
            ));
        }
        match self.parse_node(id, page)? {
            Node::Leaf(elements) => {
                for element in elements {
                    f(element.flags, element.key, element.value)?;
                }
            }
            Node::Branch(elements) => {
                for element in elements {
                    self.walk(&BucketRoot::Page(element.child), depth + 1, f)?;
                }
            }
        }
        Ok(())
    }

    /// Looks `key` up under `root`: its flags and value, if present.
    fn seek(&self, root: &BucketRoot, key: &[u8]) -> Result<Option<(u32, Vec<u8>)>> {
        let mut owned: Vec<u8>;
        let (mut id, mut page): (u64, &[u8]) = match root {
            BucketRoot::Inline(page) => (0, page),
            BucketRoot::Page(id) => {
                owned = self.read_page(*id)?;
                (*id, &owned)
            }
        };
        for _ in 0..=MAX_DEPTH {
            match self.parse_node(id, page)? {
                Node::Leaf(elements) => {
                    let found = elements
                        .binary_search_by(|element| element.key.cmp(key))
                        .ok()
                        .map(|index| (elements[index].flags, elements[index].value.to_vec()));
                    return Ok(found);
                }
                Node::Branch(elements) => {
                    // The child whose first key is the last one <= key; a key below every
                    // first key can only be in the first child (bbolt's `searchPage`).
                    let after = elements.partition_point(|element| element.key <= key);
                    let Some(child) = elements.get(after.saturating_sub(1)) else {
                        return Ok(None);
                    };
                    id = child.child;
                    owned = self.read_page(id)?;
                    page = &owned;
                }
            }
        }
        Err(self.corrupt(id, CorruptReason::TooDeep { max: MAX_DEPTH }))
    }

    /// Reads page `id` with its overflow pages.
    fn read_page(&self, id: u64) -> Result<Vec<u8>> {
        if id < 2 {
            return Err(self.corrupt(id, CorruptReason::MetaPageReference));
        }
        if id >= self.meta.pgid {
            return Err(self.corrupt(id, self.out_of_bounds()));
        }
        let page_size = u64::from(self.meta.page_size);
        let mut page = vec![0u8; self.meta.page_size as usize];
        self.read_at(&mut page, id * page_size)?;
        let header = PageHeader::parse(&page).expect("a page is longer than its header");
        if header.id != id {
            return Err(self.corrupt(id, CorruptReason::WrongId { found: header.id }));
        }
        if header.overflow > 0 {
            let last = id.saturating_add(u64::from(header.overflow));
            if last >= self.meta.pgid {
                return Err(self.corrupt(id, self.out_of_bounds()));
            }
            let first_len = page.len();
            page.resize((u64::from(header.overflow) + 1) as usize * first_len, 0);
            self.read_at(&mut page[first_len..], (id + 1) * page_size)?;
        }
        Ok(page)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Parses a leaf or branch page (`id` is used in errors only; 0 for inline pages).
    fn parse_node<'a>(&self, id: u64, page: &'a [u8]) -> Result<Node<'a>> {
        let Some(header) = PageHeader::parse(page) else {
            return Err(self.corrupt(id, CorruptReason::ElementOutOfPage { index: 0 }));
        };
        let count = usize::from(header.count);
        if header.flags & LEAF_PAGE_FLAG != 0 {
            let mut elements = Vec::with_capacity(count);
            for index in 0..count {
                let at = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
                let fields = (
                    u32_at(page, at),
                    u32_at(page, at + 4),
                    u32_at(page, at + 8),
                    u32_at(page, at + 12),
                );
                let (Some(flags), Some(pos), Some(ksize), Some(vsize)) = fields else {
                    return Err(self.corrupt(id, CorruptReason::ElementOutOfPage { index }));
                };
                let key_start = at + pos as usize;
                let key_end = key_start + ksize as usize;
                let value_end = key_end + vsize as usize;
                if value_end > page.len() {
                    return Err(self.corrupt(id, CorruptReason::ElementOutOfPage { index }));
                }
                if ksize == 0 {
                    return Err(self.corrupt(id, CorruptReason::EmptyKey { index }));
                }
                elements.push(LeafElement {
                    flags,
                    key: &page[key_start..key_end],
                    value: &page[key_end..value_end],
                });
            }
            Ok(Node::Leaf(elements))
        } else if header.flags & BRANCH_PAGE_FLAG != 0 {
            let mut elements = Vec::with_capacity(count);
            for index in 0..count {
                let at = PAGE_HEADER_SIZE + index * BRANCH_ELEMENT_SIZE;
                let fields = (u32_at(page, at), u32_at(page, at + 4), u64_at(page, at + 8));
                let (Some(pos), Some(ksize), Some(child)) = fields else {
                    return Err(self.corrupt(id, CorruptReason::ElementOutOfPage { index }));
                };
                let key_start = at + pos as usize;
                let key_end = key_start + ksize as usize;
                if key_end > page.len() {
                    return Err(self.corrupt(id, CorruptReason::ElementOutOfPage { index }));
                }
                if ksize == 0 {
                    return Err(self.corrupt(id, CorruptReason::EmptyKey { index }));
                }
                elements.push(BranchElement {
                    key: &page[key_start..key_end],
                    child,
                });
            }
            Ok(Node::Branch(elements))
        } else {
            Err(self.corrupt(
                id,
                CorruptReason::WrongType {
                    flags: header.flags,
                },
            ))
        }
    }

    fn out_of_bounds(&self) -> CorruptReason {
        CorruptReason::OutOfBounds {
            high_water: self.meta.pgid,
        }
    }

    fn corrupt(&self, page: u64, reason: CorruptReason) -> Error {
        Error::CorruptPage {
            path: self.path.clone(),
            page,
            reason,
        }
    }

    fn nested(&self, bucket: &[u8], key: &[u8]) -> Error {
        Error::NestedBucket {
            path: self.path.clone(),
            bucket: escape(bucket),
            key: escape(key),
        }
    }
}

/// The error for a meta page that fails validation.
fn meta_error(path: &Path, error: MetaError) -> Error {
    let path = path.to_path_buf();
    match error {
        MetaError::Magic => Error::InvalidDatabase { path },
        MetaError::Version(found) => Error::VersionMismatch { path, found },
        MetaError::Checksum => Error::Checksum { path, page: 0 },
    }
}
