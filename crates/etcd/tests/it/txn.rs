//! Txn: compares, branches, nesting, one revision per txn, and request validation.

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use etcdrs_testkit::{Code, assert_grpc_error};

use crate::{dump, keys, pairs, revision, start, start_with};

const TOO_MANY: &str = "etcdserver: too many operations in txn request";
const DUPLICATE: &str = "etcdserver: duplicate key given in txn request";

/// Runs `when(cmp) then put(_result=yes) else put(_result=no)` and returns whether the compare
/// held. `_result` sorts before every key the compares look at.
async fn holds(c: &mut Client, cmp: Vec<Compare>) -> bool {
    let txn = Txn::new()
        .when(cmp)
        .and_then([TxnOp::put("_result", "yes", None)])
        .or_else([TxnOp::put("_result", "no", None)]);
    let resp = c.txn(txn).await.expect("txn");
    let stored = c.get("_result", None).await.expect("get").kvs()[0]
        .value()
        .to_vec();
    assert_eq!(
        stored,
        if resp.succeeded() {
            b"yes".to_vec()
        } else {
            b"no".to_vec()
        },
        "the branch that ran matches `succeeded`"
    );
    resp.succeeded()
}

#[tokio::test]
async fn compare_targets_and_operators_on_single_keys() {
    let (_m, mut c) = start().await;
    c.put("k", "b", None).await.unwrap(); // rev 2
    c.put("k", "b", None).await.unwrap(); // rev 3: version 2, create 2, mod 3
    let lease = c.lease_grant(60, None).await.unwrap().id();
    c.put("l", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap(); // rev 4

    use CompareOp::{Equal, Greater, Less, NotEqual};
    // (compare, expected)
    let cases = [
        (Compare::version("k", Equal, 2), true),
        (Compare::version("k", Equal, 1), false),
        (Compare::version("k", Greater, 1), true),
        (Compare::version("k", Greater, 2), false),
        (Compare::version("k", Less, 3), true),
        (Compare::version("k", Less, 2), false),
        (Compare::version("k", NotEqual, 1), true),
        (Compare::version("k", NotEqual, 2), false),
        (Compare::create_revision("k", Equal, 2), true),
        (Compare::create_revision("k", Greater, 2), false),
        (Compare::create_revision("k", Less, 3), true),
        (Compare::create_revision("k", NotEqual, 2), false),
        (Compare::mod_revision("k", Equal, 3), true),
        (Compare::mod_revision("k", Greater, 2), true),
        (Compare::mod_revision("k", Less, 3), false),
        (Compare::mod_revision("k", NotEqual, 3), false),
        (Compare::value("k", Equal, "b"), true),
        (Compare::value("k", Equal, "c"), false),
        (Compare::value("k", Greater, "a"), true),
        (Compare::value("k", Greater, "b"), false),
        (Compare::value("k", Less, "ba"), true),
        (Compare::value("k", Less, "b"), false),
        (Compare::value("k", NotEqual, "c"), true),
        (Compare::value("k", NotEqual, "b"), false),
        (Compare::lease("l", Equal, lease), true),
        (Compare::lease("l", NotEqual, lease), false),
        (Compare::lease("l", Greater, 0), true),
        (Compare::lease("l", Less, lease), false),
        (Compare::lease("k", Equal, 0), true),
        // A missing key compares as all-zero metadata...
        (Compare::version("missing", Equal, 0), true),
        (Compare::create_revision("missing", Equal, 0), true),
        (Compare::mod_revision("missing", Less, 1), true),
        (Compare::lease("missing", Equal, 0), true),
        (Compare::version("missing", Greater, 0), false),
        // ...but a value compare on a missing key is always false, whatever the operator.
        (Compare::value("missing", Equal, ""), false),
        (Compare::value("missing", NotEqual, "x"), false),
        (Compare::value("missing", Less, "zzz"), false),
        (Compare::value("missing", Greater, ""), false),
    ];
    for (cmp, want) in cases {
        let desc = format!("{cmp:?}");
        assert_eq!(holds(&mut c, vec![cmp]).await, want, "{desc}");
    }
    // Several compares are ANDed.
    assert!(
        holds(
            &mut c,
            vec![
                Compare::version("k", Equal, 2),
                Compare::value("k", Equal, "b")
            ]
        )
        .await
    );
    assert!(
        !holds(
            &mut c,
            vec![
                Compare::version("k", Equal, 2),
                Compare::value("k", Equal, "x")
            ]
        )
        .await
    );
    // No compares: success branch.
    assert!(holds(&mut c, vec![]).await);
}

#[tokio::test]
async fn compare_against_ranges() {
    let (_m, mut c) = start().await;
    c.put("r/a", "1", None).await.unwrap(); // rev 2
    c.put("r/b", "1", None).await.unwrap(); // rev 3
    c.put("r/c", "2", None).await.unwrap(); // rev 4
    use CompareOp::{Equal, Greater, Less, NotEqual};
    let range = |cmp: Compare| cmp.with_range("r/c");
    let cases = [
        // [r/a, r/c): r/a and r/b, every key must satisfy the compare.
        (range(Compare::value("r/a", Equal, "1")), true),
        (range(Compare::version("r/a", Equal, 1)), true),
        (range(Compare::mod_revision("r/a", Less, 4)), true),
        (range(Compare::mod_revision("r/a", Greater, 2)), false),
        (range(Compare::create_revision("r/a", NotEqual, 3)), false),
        // prefix r/: includes r/c
        (Compare::value("r/", Equal, "1").with_prefix(), false),
        (Compare::value("r/", NotEqual, "3").with_prefix(), true),
        (Compare::version("r/", Equal, 1).with_prefix(), true),
        (Compare::mod_revision("r/", Greater, 1).with_prefix(), true),
        (Compare::lease("r/", Equal, 0).with_prefix(), true),
        // Empty range: value compares fail, others compare against zero.
        (Compare::value("x/", Equal, "1").with_prefix(), false),
        (Compare::version("x/", Equal, 0).with_prefix(), true),
        // range_end "\0": every key >= r/b
        (Compare::value("r/b", Less, "3").with_range("\0"), true),
        (Compare::value("r/b", Equal, "1").with_range("\0"), false),
    ];
    for (cmp, want) in cases {
        let desc = format!("{cmp:?}");
        assert_eq!(holds(&mut c, vec![cmp]).await, want, "{desc}");
    }
}

#[tokio::test]
async fn branches_ops_and_one_revision_per_txn() {
    let (_m, mut c) = start().await;
    c.put("a", "1", None).await.unwrap(); // rev 2
    c.put("b", "2", None).await.unwrap(); // rev 3
    c.put("del/1", "x", None).await.unwrap(); // rev 4
    c.put("del/2", "y", None).await.unwrap(); // rev 5

    // Success branch with put (prev_kv), range, delete range (prev_kv): one new revision.
    let txn = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "1")])
        .and_then([
            TxnOp::put("a", "10", Some(PutOptions::new().with_prev_key())),
            TxnOp::put("c", "3", None),
            TxnOp::get("a", None),
            TxnOp::get(
                "",
                Some(GetOptions::new().with_all_keys().with_count_only()),
            ),
            TxnOp::delete(
                "del/",
                Some(DeleteOptions::new().with_prefix().with_prev_key()),
            ),
        ])
        .or_else([TxnOp::put("failed", "1", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert!(resp.succeeded());
    assert_eq!(resp.header().unwrap().revision(), 6);
    let ops = resp.op_responses();
    assert_eq!(ops.len(), 5);
    match &ops[0] {
        TxnOpResponse::Put(p) => {
            let prev = p.prev_key().expect("prev kv");
            assert_eq!((prev.value(), prev.mod_revision()), (&b"1"[..], 2));
            assert_eq!(p.header().unwrap().revision(), 6);
        }
        other => panic!("expected put response, got {other:?}"),
    }
    assert!(matches!(&ops[1], TxnOpResponse::Put(_)));
    match &ops[2] {
        // Reads inside the txn see its earlier writes.
        TxnOpResponse::Get(g) => {
            assert_eq!(pairs(g.kvs()), [("a".into(), "10".into())]);
            assert_eq!(g.kvs()[0].mod_revision(), 6);
            assert_eq!(g.kvs()[0].version(), 2);
            assert_eq!(g.header().unwrap().revision(), 6);
        }
        other => panic!("expected range response, got {other:?}"),
    }
    match &ops[3] {
        TxnOpResponse::Get(g) => assert_eq!((g.count(), g.kvs().len()), (5, 0)),
        other => panic!("expected range response, got {other:?}"),
    }
    match &ops[4] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted(), 2);
            assert_eq!(keys(d.prev_kvs()), ["del/1", "del/2"]);
            assert_eq!(d.header().unwrap().revision(), 6);
        }
        other => panic!("expected delete response, got {other:?}"),
    }
    // Every write of the txn carries the same mod revision.
    let r = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(
        r.kvs()
            .iter()
            .map(|kv| (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.mod_revision()
            ))
            .collect::<Vec<_>>(),
        [("a".into(), 6), ("b".into(), 3), ("c".into(), 6)]
    );
    assert_eq!(revision(&mut c).await, 6);

    // Failure branch runs when a compare fails; the success ops do not.
    let txn = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "nope")])
        .and_then([TxnOp::put("success", "1", None)])
        .or_else([TxnOp::put("b", "20", None), TxnOp::delete("c", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert!(!resp.succeeded());
    assert_eq!(resp.header().unwrap().revision(), 7);
    assert_eq!(resp.op_responses().len(), 2);
    assert_eq!(
        dump(&mut c).await,
        [("a".into(), "10".into()), ("b".into(), "20".into())]
    );

    // A read-only txn, or one whose chosen branch is empty, creates no revision.
    let txn = Txn::new().and_then([TxnOp::get("a", None), TxnOp::get("b", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 7);
    let txn = Txn::new()
        .when([Compare::version("a", CompareOp::Equal, 100)])
        .and_then([TxnOp::put("x", "1", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert!(!resp.succeeded());
    assert!(resp.op_responses().is_empty());
    assert_eq!(resp.header().unwrap().revision(), 7);
    // A delete that matches nothing inside a txn creates no revision either.
    let txn = Txn::new().and_then([TxnOp::delete("none", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 7);
    assert_eq!(revision(&mut c).await, 7);

    // The same key may be written in both branches (only one runs).
    let txn = Txn::new()
        .when([Compare::version("a", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("a", "s", None)])
        .or_else([TxnOp::put("a", "f", None)]);
    assert!(c.txn(txn).await.unwrap().succeeded());
    assert_eq!(dump(&mut c).await[0], ("a".into(), "s".into()));
}

#[tokio::test]
async fn nested_txn() {
    let (_m, mut c) = start().await;
    c.put("n", "1", None).await.unwrap(); // rev 2
    let inner = Txn::new()
        .when([Compare::value("n", CompareOp::Equal, "1")])
        .and_then([TxnOp::put("inner", "ok", None), TxnOp::get("n", None)])
        .or_else([TxnOp::put("inner", "bad", None)]);
    let outer = Txn::new()
        .when([Compare::version("n", CompareOp::Equal, 1)])
        .and_then([TxnOp::put("outer", "ok", None), TxnOp::txn(inner)]);
    let resp = c.txn(outer).await.unwrap();
    assert!(resp.succeeded());
    assert_eq!(resp.header().unwrap().revision(), 3);
    let ops = resp.op_responses();
    match &ops[1] {
        TxnOpResponse::Txn(t) => {
            assert!(t.succeeded());
            let inner_ops = t.op_responses();
            assert_eq!(inner_ops.len(), 2);
            match &inner_ops[1] {
                TxnOpResponse::Get(g) => assert_eq!(pairs(g.kvs()), [("n".into(), "1".into())]),
                other => panic!("expected range response, got {other:?}"),
            }
        }
        other => panic!("expected txn response, got {other:?}"),
    }
    let r = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(
        pairs(r.kvs()),
        [
            ("inner".into(), "ok".into()),
            ("n".into(), "1".into()),
            ("outer".into(), "ok".into())
        ]
    );
    assert!(
        r.kvs()
            .iter()
            .filter(|kv| kv.key() != b"n")
            .all(|kv| kv.mod_revision() == 3)
    );

    // etcd evaluates every compare of the whole txn tree against the store *before* the txn
    // (`compareToPath`), so an inner compare does not see the outer txn's earlier writes.
    let inner = Txn::new()
        .when([Compare::value("n", CompareOp::Equal, "2")])
        .and_then([TxnOp::put("seen", "new", None)])
        .or_else([TxnOp::put("seen", "old", None)]);
    let outer = Txn::new().and_then([TxnOp::put("n", "2", None), TxnOp::txn(inner)]);
    let resp = c.txn(outer).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 4);
    let r = c.get("seen", None).await.unwrap();
    assert_eq!(pairs(r.kvs()), [("seen".into(), "old".into())]);
}

#[tokio::test]
async fn duplicate_keys_are_rejected() {
    let (_m, mut c) = start().await;
    c.put("d", "0", None).await.unwrap(); // rev 2
    let rejected = [
        Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]),
        Txn::new().or_else([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]),
        // A put inside a deleted range.
        Txn::new().and_then([
            TxnOp::put("d", "1", None),
            TxnOp::delete("a", Some(DeleteOptions::new().with_range("e"))),
        ]),
        // A put repeated inside a nested txn.
        Txn::new().and_then([
            TxnOp::put("d", "1", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put("d", "2", None)])),
        ]),
    ];
    for txn in rejected {
        let desc = format!("{txn:?}");
        let res = c.txn(txn).await;
        assert!(res.is_err(), "{desc}");
        assert_grpc_error(res, Code::InvalidArgument, DUPLICATE);
    }
    assert_eq!(revision(&mut c).await, 2);
    assert_eq!(dump(&mut c).await, [("d".into(), "0".into())]);

    let allowed = [
        // Two deletes may overlap; reads may overlap writes.
        Txn::new().and_then([
            TxnOp::delete("x", None),
            TxnOp::delete("a", Some(DeleteOptions::new().with_range("z"))),
        ]),
        Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::get("d", None)]),
        // Same key in different branches.
        Txn::new()
            .and_then([TxnOp::put("d", "2", None)])
            .or_else([TxnOp::put("d", "3", None)]),
        // Same key in the two branches of a nested txn.
        Txn::new().and_then([TxnOp::txn(
            Txn::new()
                .and_then([TxnOp::put("d", "4", None)])
                .or_else([TxnOp::put("d", "5", None)]),
        )]),
    ];
    for txn in allowed {
        let desc = format!("{txn:?}");
        c.txn(txn).await.unwrap_or_else(|e| panic!("{desc}: {e}"));
    }
    assert_eq!(dump(&mut c).await, [("d".into(), "4".into())]);

    // etcd quirk (3.4 and 3.5, `checkIntervals`): a delete with range_end "\0" (from-key) is
    // put in the interval tree as [key, "\0"), an empty interval, so puts it covers are NOT
    // reported as duplicates, even of the very same key. The txn runs: delete, then put.
    let resp = c
        .txn(Txn::new().and_then([
            TxnOp::delete("d", Some(DeleteOptions::new().with_from_key())),
            TxnOp::put("d", "6", None),
            TxnOp::put("e", "7", None),
        ]))
        .await
        .unwrap();
    assert!(resp.succeeded());
    assert_eq!(
        dump(&mut c).await,
        [("d".into(), "6".into()), ("e".into(), "7".into())]
    );
    let r = c.get("d", None).await.unwrap();
    // Deleted and re-created in the same revision: a new generation.
    let rev = resp.header().unwrap().revision();
    assert_eq!(
        (
            r.kvs()[0].create_revision(),
            r.kvs()[0].mod_revision(),
            r.kvs()[0].version()
        ),
        (rev, rev, 1)
    );
    c.txn(Txn::new().and_then([
        TxnOp::delete("", Some(DeleteOptions::new().with_all_keys())),
        TxnOp::put("zzz", "1", None),
    ]))
    .await
    .unwrap();
    assert_eq!(dump(&mut c).await, [("zzz".into(), "1".into())]);
}

fn puts(n: usize) -> Vec<TxnOp> {
    (0..n)
        .map(|i| TxnOp::put(format!("op/{i:03}"), "v", None))
        .collect()
}

#[tokio::test]
async fn too_many_ops_default_limit_128() {
    let (_m, mut c) = start().await;
    assert_grpc_error(
        c.txn(Txn::new().and_then(puts(129))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    assert_grpc_error(
        c.txn(Txn::new().or_else(puts(129))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    let cmps: Vec<Compare> = (0..129)
        .map(|i| Compare::version(format!("c{i}"), CompareOp::Equal, 0))
        .collect();
    assert_grpc_error(
        c.txn(Txn::new().when(cmps)).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    assert_eq!(revision(&mut c).await, 1);

    // Exactly 128 in each list is fine (the limit is per list, not a sum).
    let cmps: Vec<Compare> = (0..128)
        .map(|i| Compare::version(format!("c{i}"), CompareOp::Equal, 0))
        .collect();
    let resp = c
        .txn(Txn::new().when(cmps).and_then(puts(128)).or_else(puts(128)))
        .await
        .unwrap();
    assert!(resp.succeeded());
    assert_eq!(resp.header().unwrap().revision(), 2);
    let r = c
        .get(
            "op/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), 128);
}

#[tokio::test]
async fn too_many_ops_with_max_txn_ops_flag() {
    let (_m, mut c) = start_with(&["--max-txn-ops", "3"]).await;
    assert_grpc_error(
        c.txn(Txn::new().and_then(puts(4))).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    let cmps: Vec<Compare> = (0..4)
        .map(|i| Compare::version(format!("c{i}"), CompareOp::Equal, 0))
        .collect();
    assert_grpc_error(
        c.txn(Txn::new().when(cmps)).await,
        Code::InvalidArgument,
        TOO_MANY,
    );
    // Nested txns share the budget: a nested txn may use at most max-txn-ops minus the
    // longest list (compare/success/failure) of its parent (`checkTxnRequest`).
    let ok = [
        Txn::new().and_then([
            TxnOp::put("n0", "v", None),
            TxnOp::txn(Txn::new().and_then(puts(1))),
        ]),
        Txn::new().and_then([TxnOp::txn(Txn::new().and_then(puts(2)))]),
    ];
    for txn in ok {
        let desc = format!("{txn:?}");
        c.txn(txn).await.unwrap_or_else(|e| panic!("{desc}: {e}"));
    }
    let rejected = [
        Txn::new().and_then([
            TxnOp::put("n0", "v", None),
            TxnOp::txn(Txn::new().and_then(puts(2))),
        ]),
        Txn::new().and_then([TxnOp::txn(Txn::new().and_then(puts(3)))]),
        Txn::new()
            .when([
                Compare::version("x", CompareOp::Equal, 0),
                Compare::version("y", CompareOp::Equal, 0),
            ])
            .or_else([TxnOp::txn(Txn::new().or_else(puts(2)))]),
    ];
    for txn in rejected {
        assert_grpc_error(c.txn(txn).await, Code::InvalidArgument, TOO_MANY);
    }
    assert_eq!(revision(&mut c).await, 3);
    // 3 is fine.
    let resp = c.txn(Txn::new().and_then(puts(3))).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), 4);
}
