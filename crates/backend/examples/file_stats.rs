//! Where the database file's bytes go after a load like bench-compare's scale load
//! (`put --key-size 16 --val-size 1024 --sequential-keys`, one revision a put): loads `keys`
//! key-values through the backend as the applier writes them (batches of 100 puts, each
//! commit without an fsync, a durable one every 10,000 puts), closes it, and prints redb's
//! page statistics beside the file's size and an estimate of bbolt's pages for the same pairs.
//!
//! `cargo run --release -p etcdrs-backend --example file_stats -- [keys] [value bytes]`
//!
//! At 1,000,000 values of 1 KiB (redb 4.6) it gives a 1,320 MiB file: 335,000 leaf pages
//! (three pairs a page, as in bbolt, and one page in six runs left two-thirds full where the
//! cursor that appends a run balances its last two leaves) and 2,993 branch pages (11 MiB)
//! against bbolt's estimated 2,711 (10 MiB). A redb branch keeps a 16-byte checksum beside
//! each child's page number and key; runs appended through a cursor fill the branch pages
//! (`WriteTx::insert_all`), where one insert at a time left them about 55% full (5,951 branch
//! pages, a 1,325 MiB file). A member flushes a tenth of a second of puts at a time, longer
//! runs than these: after etcd's benchmark loads the same keys, its file is 1,314 MiB, etcd
//! 3.4's 1,314 MiB.

use std::os::unix::fs::MetadataExt;

use etcdrs_backend::{Backend, Bucket};
use redb::{ReadableDatabase, TableDefinition};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let value_size: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1024);
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("db");
    // A stored mvccpb.KeyValue: key (16), create and mod revision, version, value: the
    // protobuf's tags and lengths make about 34 bytes more than key and value.
    let stored_len = 16 + value_size + 34;
    let mut pairs_bytes = 0u64;
    {
        let backend = Backend::open(&path)?;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut value = vec![0u8; stored_len];
        let mut main = 1u64;
        while main <= keys {
            let tx = backend.write()?;
            for _ in 0..100 {
                if main > keys {
                    break;
                }
                main += 1;
                for byte in value.iter_mut() {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    *byte = seed as u8;
                }
                let mut key = main.to_be_bytes().to_vec();
                key.push(b'_');
                key.extend_from_slice(&0u64.to_be_bytes());
                tx.put(Bucket::KEY, &key, &value)?;
                pairs_bytes += (key.len() + value.len()) as u64;
            }
            tx.commit(main % 10_000 < 100)?;
        }
        backend.write()?.commit(true)?;
        println!(
            "backend: size {} MiB, size in use {} MiB",
            backend.size() >> 20,
            backend.size_in_use() >> 20
        );
    }
    let meta = std::fs::metadata(&path)?;
    println!(
        "file: length {} MiB, on disk {} MiB; pairs {} MiB",
        meta.len() >> 20,
        (meta.blocks() * 512) >> 20,
        pairs_bytes >> 20
    );
    let db = redb::Database::open(&path)?;
    let write = db.begin_write()?;
    let stats = write.stats()?;
    let page = stats.page_size() as u64;
    println!(
        "redb: page {} B, tree height {}, allocated pages {} ({} MiB), leaf pages {} ({} MiB), \
         branch pages {} ({} MiB), stored leaf bytes {} MiB, metadata {} MiB, fragmented {} MiB",
        page,
        stats.tree_height(),
        stats.allocated_pages(),
        (stats.allocated_pages() * page) >> 20,
        stats.leaf_pages(),
        (stats.leaf_pages() * page) >> 20,
        stats.branch_pages(),
        (stats.branch_pages() * page) >> 20,
        stats.stored_bytes() >> 20,
        stats.metadata_bytes() >> 20,
        stats.fragmented_bytes() >> 20,
    );
    drop(write);
    let read = db.begin_read()?;
    let table = read.open_table(TableDefinition::<&[u8], &[u8]>::new("key"))?;
    let tstats = redb::ReadableTableMetadata::stats(&table)?;
    println!(
        "key table: height {}, leaf pages {} ({} MiB), branch pages {} ({} MiB), stored {} MiB, \
         metadata {} MiB, fragmented {} MiB",
        tstats.tree_height(),
        tstats.leaf_pages(),
        (tstats.leaf_pages() * page) >> 20,
        tstats.branch_pages(),
        (tstats.branch_pages() * page) >> 20,
        tstats.stored_bytes() >> 20,
        tstats.metadata_bytes() >> 20,
        tstats.fragmented_bytes() >> 20,
    );
    // bbolt: a 16-byte page header, a 16-byte element header a pair; a leaf splits past
    // its page (etcd's key bucket fills to 90% when written in order), so whole pairs a page.
    let element = 16 + 17 + stored_len as u64;
    let per_leaf = (4096 - 16) / element;
    let leaves = keys.div_ceil(per_leaf);
    let branch_element = 16 + 17;
    let per_branch = (4096 - 16) / branch_element;
    let branches = leaves.div_ceil(per_branch);
    println!(
        "bbolt estimate: {per_leaf} pairs a leaf, {leaves} leaves ({} MiB), {branches} branch \
         pages ({} MiB)",
        (leaves * 4096) >> 20,
        (branches * 4096) >> 20
    );
    Ok(())
}
