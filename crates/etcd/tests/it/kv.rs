//! KV service over `etcd-client`: put/range/delete/compact semantics, revisions and options.

use etcd_client::{
    Client, CompactionOptions, DeleteOptions, GetOptions, GetResponse, PutOptions, SortOrder,
    SortTarget,
};
use etcdrs_testkit::{Code, assert_grpc_error};

use crate::{keys, pairs, revision, start};

async fn put(client: &mut Client, k: &str, v: &str) -> i64 {
    client
        .put(k, v, None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision()
}

async fn get(client: &mut Client, k: &str, opts: GetOptions) -> GetResponse {
    client.get(k, Some(opts)).await.expect("get")
}

/// (key, create_revision, mod_revision, version, lease) of every kv.
fn meta(resp: &GetResponse) -> Vec<(String, i64, i64, i64, i64)> {
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect()
}

#[tokio::test]
async fn put_get_revisions_and_versions() {
    let (_m, mut c) = start().await;
    // A fresh store is at revision 1.
    assert_eq!(revision(&mut c).await, 1);

    assert_eq!(put(&mut c, "a", "1").await, 2);
    let r = get(&mut c, "a", GetOptions::new()).await;
    assert_eq!(pairs(r.kvs()), [("a".into(), "1".into())]);
    assert_eq!(meta(&r), [("a".into(), 2, 2, 1, 0)]);
    assert_eq!((r.count(), r.more()), (1, false));
    assert_eq!(r.header().unwrap().revision(), 2);

    // Overwrite (even with the same value) bumps mod_revision and version, keeps create_revision.
    assert_eq!(put(&mut c, "a", "1").await, 3);
    assert_eq!(put(&mut c, "a", "2").await, 4);
    let r = get(&mut c, "a", GetOptions::new()).await;
    assert_eq!(meta(&r), [("a".into(), 2, 4, 3, 0)]);
    assert_eq!(pairs(r.kvs()), [("a".into(), "2".into())]);

    // Delete makes a new revision; the key is gone.
    let d = c.delete("a", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (1, 5));
    let r = get(&mut c, "a", GetOptions::new()).await;
    assert!(r.kvs().is_empty());
    assert_eq!(
        (r.count(), r.more(), r.header().unwrap().revision()),
        (0, false, 5)
    );

    // Deleting a missing key does not create a revision.
    let d = c.delete("a", None).await.unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 5));

    // Re-put starts a new generation: create_revision = mod_revision, version 1.
    assert_eq!(put(&mut c, "a", "3").await, 6);
    let r = get(&mut c, "a", GetOptions::new()).await;
    assert_eq!(meta(&r), [("a".into(), 6, 6, 1, 0)]);

    // Other keys get their own create revisions; binary keys and values round-trip.
    c.put(vec![0u8, 255, 10], vec![1u8, 0, 2], None)
        .await
        .unwrap();
    let r = c.get(vec![0u8, 255, 10], None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), [1u8, 0, 2]);
    assert_eq!((r.kvs()[0].create_revision(), r.kvs()[0].version()), (7, 1));
    // Empty value is allowed.
    assert_eq!(put(&mut c, "empty", "").await, 8);
    let r = get(&mut c, "empty", GetOptions::new()).await;
    assert_eq!(pairs(r.kvs()), [("empty".into(), String::new())]);
}

#[tokio::test]
async fn response_header_fields() {
    let (_m, mut c) = start().await;
    let p = c.put("k", "v", None).await.unwrap();
    let h = p.header().unwrap();
    assert_ne!(h.cluster_id(), 0);
    assert_ne!(h.member_id(), 0);
    assert!(h.raft_term() >= 1);
    assert_eq!(h.revision(), 2);
    let status = c.status().await.unwrap();
    assert_eq!(
        status.leader(),
        h.member_id(),
        "single member is its own leader"
    );
    let g = c.get("k", None).await.unwrap();
    let gh = g.header().unwrap();
    assert_eq!(
        (gh.cluster_id(), gh.member_id(), gh.revision()),
        (h.cluster_id(), h.member_id(), 2)
    );
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    assert_eq!(members.members()[0].id(), h.member_id());
}

async fn seed_range_keys(c: &mut Client) {
    for k in ["a", "b", "c", "d", "foo", "foo1", "foo2", "fop", "z"] {
        put(c, k, &format!("v-{k}")).await;
    }
}

#[tokio::test]
async fn ranges_prefix_and_from_key() {
    let (_m, mut c) = start().await;
    seed_range_keys(&mut c).await;

    // [key, range_end)
    let r = get(&mut c, "a", GetOptions::new().with_range("c")).await;
    assert_eq!(keys(r.kvs()), ["a", "b"]);
    assert_eq!(r.count(), 2);
    let r = get(&mut c, "b", GetOptions::new().with_range("foo1")).await;
    assert_eq!(keys(r.kvs()), ["b", "c", "d", "foo"]);
    // range_end <= key selects nothing.
    let r = get(&mut c, "c", GetOptions::new().with_range("a")).await;
    assert_eq!((r.kvs().len(), r.count()), (0, 0));
    let r = get(&mut c, "c", GetOptions::new().with_range("c")).await;
    assert_eq!((r.kvs().len(), r.count()), (0, 0));

    // prefix: range_end = key with last byte + 1
    let r = get(&mut c, "foo", GetOptions::new().with_prefix()).await;
    assert_eq!(keys(r.kvs()), ["foo", "foo1", "foo2"]);
    assert_eq!(pairs(&r.kvs()[..1]), [("foo".into(), "v-foo".into())]);

    // range_end "\0": every key >= key.
    let r = get(&mut c, "foo1", GetOptions::new().with_from_key()).await;
    assert_eq!(keys(r.kvs()), ["foo1", "foo2", "fop", "z"]);
    let r = get(&mut c, "zz", GetOptions::new().with_from_key()).await;
    assert_eq!(r.count(), 0);
    // key "\0" + range_end "\0": the whole keyspace.
    let r = get(&mut c, "", GetOptions::new().with_all_keys()).await;
    assert_eq!(
        keys(r.kvs()),
        ["a", "b", "c", "d", "foo", "foo1", "foo2", "fop", "z"]
    );
    // A range spelled out explicitly with range_end "\0".
    let r = get(&mut c, "d", GetOptions::new().with_range("\0")).await;
    assert_eq!(keys(r.kvs()), ["d", "foo", "foo1", "foo2", "fop", "z"]);

    // A missing single key.
    let r = get(&mut c, "nope", GetOptions::new()).await;
    assert_eq!((r.kvs().len(), r.count(), r.more()), (0, 0, false));
}

#[tokio::test]
async fn limit_more_count_keys_only_count_only_serializable() {
    let (_m, mut c) = start().await;
    for i in 0..5 {
        put(&mut c, &format!("k{i}"), &format!("v{i}")).await;
    }
    put(&mut c, "other", "x").await;

    let r = get(&mut c, "k", GetOptions::new().with_prefix().with_limit(2)).await;
    assert_eq!(keys(r.kvs()), ["k0", "k1"]);
    assert_eq!((r.more(), r.count()), (true, 5));
    let r = get(&mut c, "k", GetOptions::new().with_prefix().with_limit(4)).await;
    assert_eq!((r.kvs().len(), r.more(), r.count()), (4, true, 5));
    let r = get(&mut c, "k", GetOptions::new().with_prefix().with_limit(5)).await;
    assert_eq!((r.kvs().len(), r.more(), r.count()), (5, false, 5));
    let r = get(&mut c, "k", GetOptions::new().with_prefix().with_limit(50)).await;
    assert_eq!((r.kvs().len(), r.more(), r.count()), (5, false, 5));
    let r = get(&mut c, "k", GetOptions::new().with_prefix().with_limit(0)).await;
    assert_eq!((r.kvs().len(), r.more(), r.count()), (5, false, 5));

    // keys_only: values stripped, metadata kept.
    let r = get(
        &mut c,
        "k",
        GetOptions::new().with_prefix().with_keys_only(),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["k0", "k1", "k2", "k3", "k4"]);
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));
    assert_eq!(meta(&r)[0], ("k0".into(), 2, 2, 1, 0));

    // count_only: no kvs, full count, more=false even with a limit.
    let r = get(
        &mut c,
        "k",
        GetOptions::new().with_prefix().with_count_only(),
    )
    .await;
    assert_eq!((r.kvs().len(), r.count(), r.more()), (0, 5, false));
    let r = get(
        &mut c,
        "k",
        GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_limit(2),
    )
    .await;
    assert_eq!((r.kvs().len(), r.count(), r.more()), (0, 5, false));

    // Serializable reads see the same data on a single member.
    let r = get(
        &mut c,
        "k",
        GetOptions::new().with_prefix().with_serializable(),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["k0", "k1", "k2", "k3", "k4"]);
    assert_eq!(r.header().unwrap().revision(), 7);
}

#[tokio::test]
async fn historical_reads_by_revision() {
    let (_m, mut c) = start().await;
    assert_eq!(put(&mut c, "k", "v1").await, 2);
    assert_eq!(put(&mut c, "k", "v2").await, 3);
    assert_eq!(put(&mut c, "other", "o").await, 4);
    c.delete("k", None).await.unwrap(); // rev 5
    assert_eq!(put(&mut c, "k", "v3").await, 6);

    let at = |rev| GetOptions::new().with_revision(rev);
    let r = get(&mut c, "k", at(1)).await;
    assert_eq!(r.count(), 0);
    let r = get(&mut c, "k", at(2)).await;
    assert_eq!(pairs(r.kvs()), [("k".into(), "v1".into())]);
    assert_eq!(meta(&r), [("k".into(), 2, 2, 1, 0)]);
    // The header carries the current revision, not the requested one.
    assert_eq!(r.header().unwrap().revision(), 6);
    let r = get(&mut c, "k", at(3)).await;
    assert_eq!(meta(&r), [("k".into(), 2, 3, 2, 0)]);
    let r = get(&mut c, "k", at(4)).await;
    assert_eq!(pairs(r.kvs()), [("k".into(), "v2".into())]);
    let r = get(&mut c, "k", at(5)).await;
    assert_eq!(r.count(), 0);
    let r = get(&mut c, "k", at(6)).await;
    assert_eq!(meta(&r), [("k".into(), 6, 6, 1, 0)]);
    // revision 0 (and negative) mean "latest".
    let r = get(&mut c, "k", at(0)).await;
    assert_eq!(pairs(r.kvs()), [("k".into(), "v3".into())]);

    // Ranges at a revision.
    let r = get(
        &mut c,
        "",
        GetOptions::new().with_all_keys().with_revision(4),
    )
    .await;
    assert_eq!(
        pairs(r.kvs()),
        [("k".into(), "v2".into()), ("other".into(), "o".into())]
    );
    let r = get(
        &mut c,
        "",
        GetOptions::new().with_all_keys().with_revision(5),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["other"]);

    // A future revision is an error.
    assert_grpc_error(
        c.get("k", Some(at(7))).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
    assert_grpc_error(
        c.get("k", Some(at(1000))).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );
}

/// Keys with distinct create/mod revisions, versions and values in different orders.
async fn seed_sort_keys(c: &mut Client) {
    put(c, "s/c", "3").await; // rev 2
    put(c, "s/a", "2").await; // rev 3
    put(c, "s/b", "1").await; // rev 4
    put(c, "s/a", "5").await; // rev 5
    put(c, "s/a", "4").await; // rev 6
    put(c, "s/c", "6").await; // rev 7
    // final: s/a v=4 create=3 mod=6 ver=3; s/b v=1 create=4 mod=4 ver=1; s/c v=6 create=2 mod=7 ver=2
}

#[tokio::test]
async fn sort_targets_and_orders() {
    let (_m, mut c) = start().await;
    seed_sort_keys(&mut c).await;
    let sorted = |t, o| GetOptions::new().with_prefix().with_sort(t, o);
    let cases = [
        (SortTarget::Key, SortOrder::Ascend, ["s/a", "s/b", "s/c"]),
        (SortTarget::Key, SortOrder::Descend, ["s/c", "s/b", "s/a"]),
        (SortTarget::Key, SortOrder::None, ["s/a", "s/b", "s/c"]),
        (
            SortTarget::Version,
            SortOrder::Ascend,
            ["s/b", "s/c", "s/a"],
        ),
        (
            SortTarget::Version,
            SortOrder::Descend,
            ["s/a", "s/c", "s/b"],
        ),
        (SortTarget::Create, SortOrder::Ascend, ["s/c", "s/a", "s/b"]),
        (
            SortTarget::Create,
            SortOrder::Descend,
            ["s/b", "s/a", "s/c"],
        ),
        (SortTarget::Mod, SortOrder::Ascend, ["s/b", "s/a", "s/c"]),
        (SortTarget::Mod, SortOrder::Descend, ["s/c", "s/a", "s/b"]),
        (SortTarget::Value, SortOrder::Ascend, ["s/b", "s/a", "s/c"]),
        (SortTarget::Value, SortOrder::Descend, ["s/c", "s/a", "s/b"]),
        // etcd rule: a target other than KEY with order NONE sorts ASCEND.
        (SortTarget::Version, SortOrder::None, ["s/b", "s/c", "s/a"]),
        (SortTarget::Create, SortOrder::None, ["s/c", "s/a", "s/b"]),
        (SortTarget::Mod, SortOrder::None, ["s/b", "s/a", "s/c"]),
        (SortTarget::Value, SortOrder::None, ["s/b", "s/a", "s/c"]),
    ];
    for (target, order, want) in cases {
        let r = get(&mut c, "s/", sorted(target, order)).await;
        assert_eq!(keys(r.kvs()), want, "sort {target:?} {order:?}");
        assert_eq!((r.count(), r.more()), (3, false));
    }
    // Note: etcd-client (like clientv3) rewrites KEY+ASCEND to KEY+NONE before sending, so the
    // server never sees KEY+ASCEND from these clients.

    // With an explicit order, the server sorts the whole range and then applies the limit.
    let r = get(
        &mut c,
        "s/",
        sorted(SortTarget::Mod, SortOrder::Descend).with_limit(1),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/c"]);
    assert_eq!((r.count(), r.more()), (3, true));
    let r = get(
        &mut c,
        "s/",
        sorted(SortTarget::Key, SortOrder::Descend).with_limit(2),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/c", "s/b"]);
    assert_eq!((r.count(), r.more()), (3, true));

    // etcd quirk: with order NONE (a non-KEY target is then sorted ASCEND by the rule above) the
    // limit is applied *before* sorting: etcd fetches limit+1 keys in key order, sorts those and
    // truncates to the limit. A full sort would give s/c here (create 2); etcd fetches s/a
    // (create 3) and s/b (create 4) and returns s/a.
    let r = get(
        &mut c,
        "s/",
        sorted(SortTarget::Create, SortOrder::None).with_limit(1),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/a"]);
    assert_eq!((r.count(), r.more()), (3, true));
}

#[tokio::test]
async fn mod_and_create_revision_filters() {
    let (_m, mut c) = start().await;
    seed_sort_keys(&mut c).await;
    // s/a create=3 mod=6; s/b create=4 mod=4; s/c create=2 mod=7
    let p = || GetOptions::new().with_prefix();
    let r = get(&mut c, "s/", p().with_min_mod_revision(5)).await;
    assert_eq!(keys(r.kvs()), ["s/a", "s/c"]);
    // count is the size of the range before filtering.
    assert_eq!((r.count(), r.more()), (3, false));
    let r = get(&mut c, "s/", p().with_max_mod_revision(6)).await;
    assert_eq!(keys(r.kvs()), ["s/a", "s/b"]);
    let r = get(
        &mut c,
        "s/",
        p().with_min_mod_revision(5).with_max_mod_revision(6),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/a"]);
    let r = get(&mut c, "s/", p().with_min_create_revision(3)).await;
    assert_eq!(keys(r.kvs()), ["s/a", "s/b"]);
    let r = get(&mut c, "s/", p().with_max_create_revision(3)).await;
    assert_eq!(keys(r.kvs()), ["s/a", "s/c"]);
    let r = get(
        &mut c,
        "s/",
        p().with_min_create_revision(3).with_max_create_revision(3),
    )
    .await;
    assert_eq!(keys(r.kvs()), ["s/a"]);
    let r = get(&mut c, "s/", p().with_min_mod_revision(100)).await;
    assert_eq!((r.kvs().len(), r.count()), (0, 3));
    // Filters are applied before the limit.
    let r = get(&mut c, "s/", p().with_min_mod_revision(5).with_limit(1)).await;
    assert_eq!(keys(r.kvs()), ["s/a"]);
    assert_eq!((r.count(), r.more()), (3, true));
    let r = get(&mut c, "s/", p().with_min_create_revision(4).with_limit(1)).await;
    assert_eq!(keys(r.kvs()), ["s/b"]);
    assert_eq!((r.count(), r.more()), (3, false));
}

#[tokio::test]
async fn put_prev_kv_ignore_value_ignore_lease_and_leases() {
    let (_m, mut c) = start().await;

    // prev_kv on a new key: none.
    let p = c
        .put("k", "v1", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert!(p.prev_key().is_none());
    assert_eq!(p.header().unwrap().revision(), 2);
    // prev_kv on overwrite: the old kv with its metadata.
    let p = c
        .put("k", "v2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    let prev = p.prev_key().expect("prev kv");
    assert_eq!(
        (
            prev.key(),
            prev.value(),
            prev.create_revision(),
            prev.mod_revision(),
            prev.version()
        ),
        (&b"k"[..], &b"v1"[..], 2, 2, 1)
    );
    // Without prev_kv nothing is returned.
    let p = c.put("k", "v3", None).await.unwrap();
    assert!(p.prev_key().is_none());
    let rev = p.header().unwrap().revision();
    assert_eq!(rev, 4);

    // ignore_value / ignore_lease on a missing key.
    assert_grpc_error(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_grpc_error(
        c.put("missing", "x", Some(PutOptions::new().with_ignore_lease()))
            .await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    // ignore_value with a value, ignore_lease with a lease: rejected before apply.
    assert_grpc_error(
        c.put("k", "x", Some(PutOptions::new().with_ignore_value()))
            .await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    assert_grpc_error(
        c.put(
            "k",
            "x",
            Some(PutOptions::new().with_ignore_lease().with_lease(5)),
        )
        .await,
        Code::InvalidArgument,
        "etcdserver: lease is provided",
    );
    // None of that changed the store.
    assert_eq!(revision(&mut c).await, rev);
    let r = c.get("missing", None).await.unwrap();
    assert_eq!(r.count(), 0);

    // A lease that does not exist.
    assert_grpc_error(
        c.put("k", "x", Some(PutOptions::new().with_lease(0x1234)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    assert_eq!(revision(&mut c).await, rev);

    // Attach a granted lease.
    let lease = c.lease_grant(60, None).await.unwrap();
    assert_eq!(lease.ttl(), 60);
    let id = lease.id();
    assert_ne!(id, 0);
    let p = c
        .put("leased", "l1", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    assert_eq!(p.header().unwrap().revision(), rev + 1);
    let r = c.get("leased", None).await.unwrap();
    assert_eq!(r.kvs()[0].lease(), id);

    // ignore_value keeps the value, ignore_lease keeps the lease; both bump version.
    c.put(
        "leased",
        "",
        Some(PutOptions::new().with_ignore_value().with_lease(id)),
    )
    .await
    .unwrap();
    let r = c.get("leased", None).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("leased".into(), "l1".into())]);
    assert_eq!((r.kvs()[0].version(), r.kvs()[0].lease()), (2, id));
    c.put("leased", "l2", Some(PutOptions::new().with_ignore_lease()))
        .await
        .unwrap();
    let r = c.get("leased", None).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("leased".into(), "l2".into())]);
    assert_eq!((r.kvs()[0].version(), r.kvs()[0].lease()), (3, id));
    // ignore_value without a lease on a leased key detaches the lease.
    c.put("leased", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap();
    let r = c.get("leased", None).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("leased".into(), "l2".into())]);
    assert_eq!((r.kvs()[0].version(), r.kvs()[0].lease()), (4, 0));
    // A plain put with the lease re-attaches; a plain put without one detaches.
    c.put("leased", "l3", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    assert_eq!(c.get("leased", None).await.unwrap().kvs()[0].lease(), id);
    c.put("leased", "l4", None).await.unwrap();
    assert_eq!(c.get("leased", None).await.unwrap().kvs()[0].lease(), 0);

    // Revoking the lease deletes the keys attached to it.
    c.put("leased2", "x", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    c.lease_revoke(id).await.unwrap();
    assert_eq!(c.get("leased2", None).await.unwrap().count(), 0);
    assert_eq!(c.get("leased", None).await.unwrap().count(), 1);
}

#[tokio::test]
async fn delete_ranges_with_prev_kv() {
    let (_m, mut c) = start().await;
    seed_range_keys(&mut c).await; // revs 2..=10
    assert_eq!(revision(&mut c).await, 10);

    // Prefix delete with prev_kv: all deleted kvs in key order, one revision for all.
    let d = c
        .delete(
            "foo",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(d.deleted(), 3);
    assert_eq!(d.header().unwrap().revision(), 11);
    assert_eq!(
        pairs(d.prev_kvs()),
        [
            ("foo".into(), "v-foo".into()),
            ("foo1".into(), "v-foo1".into()),
            ("foo2".into(), "v-foo2".into())
        ]
    );
    assert_eq!(
        (
            d.prev_kvs()[0].create_revision(),
            d.prev_kvs()[0].mod_revision()
        ),
        (6, 6)
    );
    // Deleted keys all carry the same mod revision in history: readable at 10, gone at 11.
    let r = c
        .get(
            "foo",
            Some(GetOptions::new().with_prefix().with_revision(10)),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), 3);

    // [key, range_end) without prev_kv: count only.
    let d = c
        .delete("a", Some(DeleteOptions::new().with_range("c")))
        .await
        .unwrap();
    assert_eq!((d.deleted(), d.prev_kvs().len()), (2, 0));
    assert_eq!(d.header().unwrap().revision(), 12);

    // range_end "\0": everything >= key.
    let d = c
        .delete(
            "fop",
            Some(DeleteOptions::new().with_from_key().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(keys(d.prev_kvs()), ["fop", "z"]);
    assert_eq!(d.header().unwrap().revision(), 13);

    // Nothing matched: no new revision.
    let d = c
        .delete(
            "x",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (0, 13));

    assert_eq!(
        crate::dump(&mut c).await,
        [("c".into(), "v-c".into()), ("d".into(), "v-d".into())]
    );
    // Delete everything.
    let d = c
        .delete("", Some(DeleteOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!((d.deleted(), d.header().unwrap().revision()), (2, 14));
    assert!(crate::dump(&mut c).await.is_empty());
}

#[tokio::test]
async fn compaction_and_compacted_reads() {
    let (_m, mut c) = start().await;
    for i in 1..=5 {
        put(&mut c, "k", &format!("v{i}")).await; // revs 2..=6
    }
    c.delete("k", None).await.unwrap(); // rev 7
    put(&mut c, "j", "x").await; // rev 8

    // Compaction does not create a revision.
    let resp = c.compact(4, None).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 8);
    assert_eq!(revision(&mut c).await, 8);

    let at = |rev| Some(GetOptions::new().with_revision(rev));
    for rev in [1, 2, 3] {
        assert_grpc_error(
            c.get("k", at(rev)).await,
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
    }
    // The compaction revision itself stays readable, and so does everything after it.
    let r = c.get("k", at(4)).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("k".into(), "v3".into())]);
    assert_eq!((r.kvs()[0].create_revision(), r.kvs()[0].version()), (2, 3));
    let r = c.get("k", at(6)).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("k".into(), "v5".into())]);
    assert_eq!(c.get("k", at(7)).await.unwrap().count(), 0);

    // Compacting at or below the current compaction revision, or in the future, fails.
    assert_grpc_error(
        c.compact(4, None).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_grpc_error(
        c.compact(3, None).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_grpc_error(
        c.compact(9, None).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );

    // Physical compaction up to the latest revision, which removes the deleted key's history.
    let resp = c
        .compact(8, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    assert_eq!(resp.header().unwrap().revision(), 8);
    assert_grpc_error(
        c.get("k", at(7)).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    let r = c
        .get("", Some(GetOptions::new().with_all_keys().with_revision(8)))
        .await
        .unwrap();
    assert_eq!(pairs(r.kvs()), [("j".into(), "x".into())]);
    // Writes continue from the same revision counter.
    assert_eq!(put(&mut c, "k", "again").await, 9);
    let r = c.get("k", None).await.unwrap();
    assert_eq!(meta(&r), [("k".into(), 9, 9, 1, 0)]);
}

/// What a raw gRPC call was answered: HTTP status, content type, gRPC status and message
/// (from the trailers, or the headers of a trailers-only answer), and the body's bytes.
#[derive(Debug, PartialEq)]
pub(crate) struct RawAnswer {
    pub(crate) http: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) grpc_status: Option<String>,
    pub(crate) grpc_message: Option<String>,
    pub(crate) body: Vec<u8>,
}

/// Sends `body` as the request of `path`, with `headers` added, over `channel`.
async fn raw_call(
    channel: &mut tonic::transport::Channel,
    path: &str,
    headers: &[(&'static str, &'static str)],
    body: Vec<u8>,
) -> RawAnswer {
    use http_body_util::BodyExt;
    use tonic::codegen::Service;
    use tonic::codegen::http;

    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from(body),
        )))
        .expect("a request");
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .expect("connection ready");
    let response = channel.call(request).await.expect("an answer");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the whole answer");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let field = |name: &str| {
        trailers
            .get(name)
            .or_else(|| parts.headers.get(name))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    RawAnswer {
        http: parts.status.as_u16(),
        content_type: parts
            .headers
            .get("content-type")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        grpc_status: field("grpc-status"),
        grpc_message: field("grpc-message"),
        body: collected.to_bytes().to_vec(),
    }
}

/// Sends the 5-byte prefix of a message claiming 4 GiB to `path` and leaves the request stream
/// open (no body, no end of stream): the answer, which must come before `within`.
pub(crate) async fn claim_4gib_and_wait(
    channel: &mut tonic::transport::Channel,
    path: &str,
    headers: &[(&'static str, &'static str)],
    within: std::time::Duration,
) -> RawAnswer {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use tonic::codegen::Service;
    use tonic::codegen::http;

    let prefix = bytes::Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]);
    let frames = futures::stream::once(async move {
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(prefix))
    })
    .chain(futures::stream::pending());
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(tonic::body::Body::new(http_body_util::StreamBody::new(
            frames,
        )))
        .expect("a request");
    let answered = tokio::time::timeout(within, async {
        futures::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .expect("connection ready");
        let response = channel.call(request).await.expect("an answer");
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.expect("the whole answer");
        (parts, collected)
    })
    .await;
    let Ok((parts, collected)) = answered else {
        panic!("{path}: no answer within {within:?} to a prefix claiming 4 GiB");
    };
    let trailers = collected.trailers().cloned().unwrap_or_default();
    // grpc-message is percent-encoded (tonic encodes spaces, grpc-go leaves them).
    let field = |name: &str| {
        trailers
            .get(name)
            .or_else(|| parts.headers.get(name))
            .map(|v| etcdrs_proto::rpctypes::decode_grpc_message(v.as_bytes()))
    };
    RawAnswer {
        http: parts.status.as_u16(),
        content_type: parts
            .headers
            .get("content-type")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        grpc_status: field("grpc-status"),
        grpc_message: field("grpc-message"),
        body: collected.to_bytes().to_vec(),
    }
}

/// issue 40: a prefix claiming 4 GiB on a stream left open is refused at once, from the
/// prefix alone, as etcd (grpc-go) refuses it: ResourceExhausted "grpc: received message
/// larger than max (4294967295 vs. 2097152)". The direct KV path read on, waiting for a body
/// that never came. Every way in: the direct KV path, a KV call through the router and tonic
/// (`hasleader`), a unary call of another service, and the Watch stream; against the server
/// under test and etcd 3.4.
#[tokio::test]
async fn a_prefix_claiming_4_gib_is_refused_before_its_body() {
    let members = [
        etcdrs_testkit::Member::start(crate::opts())
            .await
            .expect("member"),
        etcdrs_testkit::Member::start(etcdrs_testkit::MemberOpts::new(
            &etcdrs_testkit::EtcdBin::at("/usr/bin/etcd"),
        ))
        .await
        .expect("etcd 3.4 member"),
    ];
    for m in &members {
        let mut channel = tonic::transport::Endpoint::from_shared(m.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        for (path, headers) in [
            ("/etcdserverpb.KV/Put", vec![]),
            ("/etcdserverpb.KV/Range", vec![]),
            ("/etcdserverpb.KV/Range", vec![("hasleader", "true")]),
            ("/etcdserverpb.Lease/LeaseGrant", vec![]),
            ("/etcdserverpb.Watch/Watch", vec![]),
            ("/etcdserverpb.Lease/LeaseKeepAlive", vec![]),
        ] {
            let answer = claim_4gib_and_wait(
                &mut channel,
                path,
                &headers,
                std::time::Duration::from_secs(5),
            )
            .await;
            assert_eq!(
                (
                    answer.grpc_status.as_deref(),
                    answer.grpc_message.as_deref()
                ),
                (
                    Some("8"),
                    Some("grpc: received message larger than max (4294967295 vs. 2097152)")
                ),
                "{path} {headers:?} on {}: {answer:?}",
                m.endpoint()
            );
        }
    }
}

/// A gRPC message: the uncompressed flag, the length, the bytes.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend(message);
    out
}

/// A KV call takes the member's direct path unless it asks for a leader (`hasleader`), which
/// takes the router's and tonic's: both answer every request alike, the odd ones included
/// (compressed, cut short, two messages, undecodable, oversized, unknown method, a
/// compression the member does not take), and a good one with the same frames.
#[tokio::test]
async fn direct_kv_calls_are_answered_as_tonic_answers_them() {
    use prost::Message;

    let (m, _c) = crate::start_with(&["--max-request-bytes", "1024"]).await;
    let mut channel = tonic::transport::Endpoint::from_shared(m.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let range = etcdrs_proto::etcdserverpb::RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let put = etcdrs_proto::etcdserverpb::PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec().into(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut compressed = framed(&range);
    compressed[0] = 1;
    let mut two = framed(&range);
    two.extend(framed(&range));
    let short = framed(&range)[..4].to_vec();
    let long_prefix = {
        let mut out = framed(&range);
        out[4] += 3;
        out
    };
    let oversized = framed(
        &etcdrs_proto::etcdserverpb::PutRequest {
            key: b"k".to_vec(),
            value: vec![b'x'; 1024 + 512 * 1024 + 100].into(),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    // (what, method, headers, body, answered with a success): tonic takes the first of two
    // messages.
    type Case = (
        &'static str,
        &'static str,
        Vec<(&'static str, &'static str)>,
        Vec<u8>,
        bool,
    );
    let cases: Vec<Case> = vec![
        ("a range", "Range", vec![], framed(&range), true),
        ("compressed flag", "Range", vec![], compressed, false),
        ("two messages", "Range", vec![], two, true),
        ("cut short", "Range", vec![], short, false),
        ("length past the end", "Range", vec![], long_prefix, false),
        ("no message", "Range", vec![], Vec::new(), false),
        (
            "not a message",
            "Put",
            vec![],
            framed(&[0xff, 0xff, 0xff]),
            false,
        ),
        (
            "gzip",
            "Range",
            vec![("grpc-encoding", "gzip")],
            framed(&range),
            false,
        ),
        ("unknown method", "Nope", vec![], framed(&range), false),
        ("over the size limit", "Put", vec![], oversized, false),
    ];
    for (what, method, headers, body, ok) in cases {
        let path = format!("/etcdserverpb.KV/{method}");
        let direct = raw_call(&mut channel, &path, &headers, body.clone()).await;
        let mut via_router = headers.clone();
        via_router.push(("hasleader", "true"));
        let tonic = raw_call(&mut channel, &path, &via_router, body).await;
        assert_eq!(direct, tonic, "{what}");
        assert_eq!(
            direct.grpc_status.as_deref() == Some("0"),
            ok,
            "{what}: {direct:?}"
        );
    }
    // A put answers the same frames either way, the revision aside.
    let direct = raw_call(&mut channel, "/etcdserverpb.KV/Put", &[], framed(&put)).await;
    let tonic = raw_call(
        &mut channel,
        "/etcdserverpb.KV/Put",
        &[("hasleader", "true")],
        framed(&put),
    )
    .await;
    let revision = |answer: &RawAnswer| {
        let body = answer.body.get(5..).expect("one framed message");
        etcdrs_proto::etcdserverpb::PutResponse::decode(body)
            .expect("a put response")
            .header
            .expect("a header")
            .revision
    };
    assert_eq!(revision(&tonic), revision(&direct) + 1);
    assert_eq!(
        (&direct.content_type, &direct.grpc_status, direct.body.len()),
        (&tonic.content_type, &tonic.grpc_status, tonic.body.len())
    );
}

/// A plain range on the direct path is written from the key-values as stored, in chunks of a
/// MiB (held, or past 8 MiB written as the connection takes them); its answer is
/// byte for byte tonic's (through `hasleader`), for results of one and of several chunks,
/// with and without a limit, `more` and a count, and for the ranges that take the general
/// path (sorted, filtered, keys-only, count-only).
#[tokio::test]
async fn plain_ranges_read_as_stored_answer_as_tonic_answers_them() {
    use etcdrs_proto::etcdserverpb::RangeRequest;
    use prost::Message;

    let (m, mut c) = crate::start().await;
    // 3,000 keys, values of 0 to 2 KiB: about 3 MiB in all.
    for batch in 0..30 {
        let ops: Vec<_> = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                etcd_client::TxnOp::put(format!("p/{n:05}"), vec![b'v'; (n * 7) % 2048], None)
            })
            .collect();
        c.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
    }
    // 120 values of 100 KiB: past the 8 MiB an answer holds before it is produced a chunk
    // at a time as the connection takes it.
    for n in 0..120u32 {
        let value = vec![b'a' + (n % 26) as u8; 100 << 10];
        c.put(format!("q/{n:03}"), value, None).await.unwrap();
    }
    let mut channel = tonic::transport::Endpoint::from_shared(m.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let prefix = |limit: i64| RangeRequest {
        key: b"p/".to_vec(),
        range_end: b"p0".to_vec(),
        limit,
        ..Default::default()
    };
    let cases: Vec<(&str, RangeRequest)> = vec![
        ("every key", prefix(0)),
        ("a limit", prefix(10)),
        (
            "past the held bytes, produced",
            RangeRequest {
                key: b"q/".to_vec(),
                range_end: b"q0".to_vec(),
                ..Default::default()
            },
        ),
        (
            "produced, with more to come",
            RangeRequest {
                key: b"q/".to_vec(),
                range_end: b"q0".to_vec(),
                limit: 110,
                ..Default::default()
            },
        ),
        ("a limit past the count", prefix(5000)),
        (
            "from a key",
            RangeRequest {
                key: b"p/02990".to_vec(),
                range_end: vec![0],
                ..Default::default()
            },
        ),
        (
            "a missing key",
            RangeRequest {
                key: b"nope".to_vec(),
                ..Default::default()
            },
        ),
        (
            "ascending by key",
            RangeRequest {
                sort_order: 1,
                ..prefix(100)
            },
        ),
        (
            "descending",
            RangeRequest {
                sort_order: 2,
                ..prefix(100)
            },
        ),
        (
            "keys only",
            RangeRequest {
                keys_only: true,
                ..prefix(0)
            },
        ),
        (
            "count only",
            RangeRequest {
                count_only: true,
                ..prefix(0)
            },
        ),
        (
            "a filter",
            RangeRequest {
                min_mod_revision: 20,
                ..prefix(0)
            },
        ),
        (
            "at a revision",
            RangeRequest {
                revision: 10,
                ..prefix(0)
            },
        ),
    ];
    for (what, request) in cases {
        let body = framed(&request.encode_to_vec());
        let path = "/etcdserverpb.KV/Range";
        let direct = raw_call(&mut channel, path, &[], body.clone()).await;
        let tonic = raw_call(&mut channel, path, &[("hasleader", "true")], body).await;
        assert_eq!(
            direct.grpc_status.as_deref(),
            Some("0"),
            "{what}: {direct:?}"
        );
        assert_eq!(direct, tonic, "{what}");
    }
    // The whole result, decoded: every key in order with its value.
    let body = framed(&prefix(0).encode_to_vec());
    let answer = raw_call(&mut channel, "/etcdserverpb.KV/Range", &[], body).await;
    let resp = etcdrs_proto::etcdserverpb::RangeResponse::decode(&answer.body[5..])
        .expect("a range response");
    assert_eq!(resp.count, 3000);
    assert_eq!(resp.kvs.len(), 3000);
    for (n, kv) in resp.kvs.iter().enumerate() {
        assert_eq!(kv.key, format!("p/{n:05}").as_bytes());
        assert_eq!(kv.value.len(), (n * 7) % 2048);
    }
    let body = framed(
        &RangeRequest {
            key: b"q/".to_vec(),
            range_end: b"q0".to_vec(),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let answer = raw_call(&mut channel, "/etcdserverpb.KV/Range", &[], body).await;
    let resp = etcdrs_proto::etcdserverpb::RangeResponse::decode(&answer.body[5..])
        .expect("a produced range response");
    assert_eq!((resp.count, resp.kvs.len(), resp.more), (120, 120, false));
    for (n, kv) in resp.kvs.iter().enumerate() {
        assert_eq!(kv.key, format!("q/{n:03}").as_bytes());
        assert_eq!(kv.value, vec![b'a' + (n % 26) as u8; 100 << 10]);
    }
}

/// kube-apiserver's paginated LIST: page one at the current revision, the others pinned to
/// it, each from just after the last key. Each page is what a read at that moment gives: the
/// pinned revision's key-values whatever was written since, the header revision of the
/// moment the page is answered, and a refusal once the revision is compacted.
#[tokio::test]
async fn paginated_list_pages_answer_as_reads_at_their_time() {
    let (_m, mut c) = start().await;
    for n in 0..30 {
        put(&mut c, &format!("l/{n:02}"), &format!("v{n}")).await;
    }
    let page = |after: &str, rev: i64| {
        let opts = GetOptions::new().with_range("l0").with_limit(10);
        (format!("{after}\0"), opts.with_revision(rev))
    };
    let first = get(
        &mut c,
        "l/",
        GetOptions::new().with_range("l0").with_limit(10),
    )
    .await;
    let rev = first.header().expect("header").revision();
    assert!(first.more());
    assert_eq!(first.count(), 30);

    // Writes after page one: a key changed, one deleted, one added inside the next page.
    put(&mut c, "l/15", "changed").await;
    c.delete("l/16", None).await.expect("delete");
    let now = put(&mut c, "l/155", "new").await;

    let (key, opts) = page("l/09", rev);
    let second = get(&mut c, &key, opts.clone()).await;
    let want: Vec<String> = (10..20).map(|n| format!("l/{n:02}")).collect();
    assert_eq!(keys(second.kvs()), want);
    assert_eq!(
        second.kvs()[5].value(),
        b"v15",
        "the pinned revision's value"
    );
    assert_eq!(second.header().expect("header").revision(), now);
    assert!(second.more());
    assert_eq!(
        second.count(),
        20,
        "keys from l/09\\0 at the pinned revision"
    );
    // The same page asked again answers the same.
    let again = get(&mut c, &key, opts).await;
    assert_eq!(meta(&again), meta(&second));
    let values = |r: &GetResponse| {
        r.kvs()
            .iter()
            .map(|kv| kv.value().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(values(&again), values(&second));
    assert_eq!(
        (again.more(), again.count()),
        (second.more(), second.count())
    );

    // Page three's revision is compacted before it is asked for: it is refused.
    c.compact(now, None).await.expect("compact");
    let (key, opts) = page("l/19", rev);
    assert_grpc_error(
        c.get(key, Some(opts)).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    // At the current revision the last page holds what was written since.
    let (key, opts) = page("l/09", now);
    let current = get(&mut c, &key, opts).await;
    let mut want: Vec<String> = (10..20)
        .filter(|n| *n != 16)
        .map(|n| format!("l/{n:02}"))
        .collect();
    want.insert(6, "l/155".to_owned());
    assert_eq!(keys(current.kvs()), want);
}
