//! The stock `etcdctl` (v3 API) against the server: commands and all output formats.
//!
//! Ids, the raft term and revisions are not normalized away: they are read over gRPC first and
//! then required exactly, so output and wire agree. Only values etcd itself does not define
//! (db size, raft index, latency) are checked for shape.

use etcd_client::Client;
use etcdrs_testkit::{Etcdctl, Member};
use serde_json::{Value, json};

use crate::start;

/// Ids and term as etcd reports them over gRPC.
struct Ids {
    cluster: u64,
    member: u64,
    term: u64,
}

async fn ids(c: &mut Client) -> Ids {
    let s = c.status().await.expect("status");
    let h = s.header().expect("header");
    Ids {
        cluster: h.cluster_id(),
        member: h.member_id(),
        term: s.raft_term(),
    }
}

fn b64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn parse_json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// Parses an etcdctl (tablewriter) table, checking its frame: `+---+` borders of the same width
/// as every row, centered headers, right-aligned cells. Returns (headers, rows) trimmed.
fn parse_table(out: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 4, "too short for a table: {out}");
    let border = lines[0];
    assert!(border.starts_with('+') && border.ends_with('+'), "{out}");
    assert!(border.chars().all(|ch| ch == '+' || ch == '-'), "{out}");
    assert_eq!(lines[2], border, "{out}");
    assert_eq!(lines[lines.len() - 1], border, "{out}");
    // Widths are in characters: cells may hold multi-byte text such as "µs".
    let width = |s: &str| s.chars().count();
    let widths: Vec<usize> = border[1..border.len() - 1].split('+').map(width).collect();
    let split = |line: &str| -> Vec<String> {
        assert_eq!(
            width(line),
            width(border),
            "row width differs from border: {line:?}"
        );
        let inner = line
            .strip_prefix('|')
            .and_then(|l| l.strip_suffix('|'))
            .unwrap_or_else(|| panic!("row not framed by '|': {line:?}"));
        let cells: Vec<&str> = inner.split('|').collect();
        assert_eq!(cells.len(), widths.len(), "{line:?}");
        for (cell, w) in cells.iter().zip(&widths) {
            assert_eq!(width(cell), *w, "{line:?}");
        }
        cells.iter().map(|s| (*s).to_owned()).collect()
    };
    let headers: Vec<String> = split(lines[1])
        .into_iter()
        .map(|h| {
            let t = h.trim();
            let pad = h.len() - t.len();
            // tablewriter centers headers; odd padding goes right.
            assert!(
                h.starts_with(&" ".repeat(pad / 2)),
                "header {h:?} not centered"
            );
            t.to_owned()
        })
        .collect();
    let rows = lines[3..lines.len() - 1]
        .iter()
        .map(|l| {
            split(l)
                .into_iter()
                .map(|cell| {
                    if !cell.trim().is_empty() {
                        assert!(
                            cell.ends_with(' ') && !cell.ends_with("  "),
                            "{cell:?} not right-aligned"
                        );
                    }
                    cell.trim().to_owned()
                })
                .collect()
        })
        .collect();
    (headers, rows)
}

async fn member_and_ctl() -> (Member, Client, Etcdctl) {
    let (m, c) = start().await;
    let ctl = m.etcdctl();
    (m, c, ctl)
}

#[tokio::test]
async fn put_get_del_simple_output() {
    let (_m, mut c, ctl) = member_and_ctl().await;
    for k in ["a", "b", "c", "foo", "foo1", "foo2", "fop"] {
        assert_eq!(ctl.ok(&["put", k, &format!("v-{k}")]).await, "OK\n");
    } // revs 2..=8
    assert_eq!(ctl.ok(&["put", "foo", "new"]).await, "OK\n"); // rev 9

    assert_eq!(ctl.ok(&["get", "foo"]).await, "foo\nnew\n");
    assert_eq!(ctl.ok(&["get", "nope"]).await, "");
    assert_eq!(
        ctl.ok(&["get", "foo", "--prefix"]).await,
        "foo\nnew\nfoo1\nv-foo1\nfoo2\nv-foo2\n"
    );
    // A second positional argument is the range end.
    assert_eq!(ctl.ok(&["get", "a", "c"]).await, "a\nv-a\nb\nv-b\n");
    assert_eq!(
        ctl.ok(&["get", "foo1", "--from-key"]).await,
        "foo1\nv-foo1\nfoo2\nv-foo2\nfop\nv-fop\n"
    );
    assert_eq!(
        ctl.ok(&["get", "b", "--from-key", "--limit", "2"]).await,
        "b\nv-b\nc\nv-c\n"
    );
    assert_eq!(
        ctl.ok(&["get", "foo", "--prefix", "--print-value-only"])
            .await,
        "new\nv-foo1\nv-foo2\n"
    );
    // --keys-only prints each key followed by an empty line.
    assert_eq!(
        ctl.ok(&["get", "foo", "--prefix", "--keys-only"]).await,
        "foo\n\nfoo1\n\nfoo2\n\n"
    );
    assert_eq!(ctl.ok(&["get", "foo", "--rev", "5"]).await, "foo\nv-foo\n");
    assert_eq!(ctl.ok(&["get", "foo", "--rev=4"]).await, "");
    assert_eq!(
        ctl.ok(&[
            "get",
            "f",
            "--prefix",
            "--sort-by=MODIFY",
            "--order=DESCEND"
        ])
        .await,
        "foo\nnew\nfop\nv-fop\nfoo2\nv-foo2\nfoo1\nv-foo1\n"
    );
    // del prints the number of deleted keys; --prev-kv adds the deleted pairs.
    assert_eq!(ctl.ok(&["del", "a"]).await, "1\n");
    assert_eq!(ctl.ok(&["del", "a"]).await, "0\n");
    assert_eq!(ctl.ok(&["del", "foo", "--prefix"]).await, "3\n");
    assert_eq!(
        ctl.ok(&["del", "fop", "--prev-kv"]).await,
        "1\nfop\nv-fop\n"
    );
    assert_eq!(ctl.ok(&["del", "b", "--from-key"]).await, "2\n");
    assert_eq!(ctl.ok(&["get", "", "--from-key"]).await, "");

    // Values from stdin.
    let out = ctl.ok_stdin(&["put", "stdin-key"], "from stdin").await;
    assert_eq!(out, "OK\n");
    assert_eq!(
        ctl.ok(&["get", "stdin-key", "--print-value-only"]).await,
        "from stdin\n"
    );

    // What etcdctl wrote is what etcd-client reads.
    let r = c.get("stdin-key", None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"from stdin");
    assert_eq!(r.header().unwrap().revision(), 14);
}

#[tokio::test]
async fn errors_exit_codes_and_messages() {
    let (_m, _c, ctl) = member_and_ctl().await;
    ctl.ok(&["put", "k", "v"]).await;
    let out = ctl.run(&["get", ""]).await.unwrap();
    assert_eq!(out.code(), Some(1));
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: key is not provided\n"),
        "{}",
        out.stderr
    );
    // Bad arguments: exit code 128 (ExitBadArgs), nothing sent.
    let out = ctl.run(&["put"]).await.unwrap();
    assert_eq!(out.code(), Some(128));
    assert_eq!(
        out.stderr,
        "Error: put command needs 1 argument and input from stdin or 2 arguments\n"
    );
    // put/get/del do not support table output: exit code 4 (ExitBadFeature) *after* the request
    // ran, so the put below is applied.
    let out = ctl.run(&["put", "t", "1", "-w", "table"]).await.unwrap();
    assert_eq!(out.code(), Some(4));
    assert_eq!(out.stderr, "Error: table not supported as output format\n");
    assert_eq!(ctl.ok(&["get", "t", "--print-value-only"]).await, "1\n");
    for args in [["get", "t", "-w", "table"], ["del", "t", "-w", "table"]] {
        let out = ctl.run(&args).await.unwrap();
        assert_eq!(out.code(), Some(4), "{args:?}");
        assert_eq!(out.stderr, "Error: table not supported as output format\n");
    }
    assert_eq!(ctl.ok(&["get", "t"]).await, "");
}

#[tokio::test]
async fn json_and_fields_output_of_put_get_del() {
    let (_m, mut c, ctl) = member_and_ctl().await;
    let id = ids(&mut c).await;
    let header = |rev: i64| json!({"cluster_id": id.cluster, "member_id": id.member, "revision": rev, "raft_term": id.term});

    // put
    let out = parse_json(&ctl.ok(&["put", "foo", "bar", "-w", "json"]).await);
    assert_eq!(out, json!({"header": header(2)}));
    let out = ctl.ok(&["put", "foo", "baz", "-w", "fields"]).await;
    assert_eq!(
        out,
        format!(
            "\"ClusterID\" : {}\n\"MemberID\" : {}\n\"Revision\" : 3\n\"RaftTerm\" : {}\n",
            id.cluster, id.member, id.term
        )
    );
    let out = parse_json(
        &ctl.ok(&["put", "foo", "qux", "--prev-kv", "-w", "json"])
            .await,
    );
    assert_eq!(
        out,
        json!({"header": header(4), "prev_kv": {
            "key": b64(b"foo"), "create_revision": 2, "mod_revision": 3, "version": 2,
            "value": b64(b"baz")}})
    );
    ctl.ok(&["put", "foo2", "x"]).await; // rev 5

    // get: zero fields (lease 0, more false) are omitted.
    let out = parse_json(&ctl.ok(&["get", "foo", "--prefix", "-w", "json"]).await);
    assert_eq!(
        out,
        json!({"header": header(5), "kvs": [
            {"key": b64(b"foo"), "create_revision": 2, "mod_revision": 4, "version": 3, "value": b64(b"qux")},
            {"key": b64(b"foo2"), "create_revision": 5, "mod_revision": 5, "version": 1, "value": b64(b"x")}
        ], "count": 2})
    );
    let out = parse_json(
        &ctl.ok(&["get", "foo", "--prefix", "--limit", "1", "-w", "json"])
            .await,
    );
    assert_eq!(out["more"], json!(true));
    assert_eq!(out["count"], json!(2));
    assert_eq!(out["kvs"].as_array().unwrap().len(), 1);
    // Empty result: no kvs, no count.
    let out = parse_json(&ctl.ok(&["get", "nope", "-w", "json"]).await);
    assert_eq!(out, json!({"header": header(5)}));

    let out = ctl.ok(&["get", "foo", "-w", "fields"]).await;
    assert_eq!(
        out,
        format!(
            "\"ClusterID\" : {}\n\"MemberID\" : {}\n\"Revision\" : 5\n\"RaftTerm\" : {}\n\
             \"Key\" : \"foo\"\n\"CreateRevision\" : 2\n\"ModRevision\" : 4\n\"Version\" : 3\n\
             \"Value\" : \"qux\"\n\"Lease\" : 0\n\"More\" : false\n\"Count\" : 1\n",
            id.cluster, id.member, id.term
        )
    );

    // del
    let out = parse_json(&ctl.ok(&["del", "foo2", "-w", "json"]).await);
    assert_eq!(out, json!({"header": header(6), "deleted": 1}));
    let out = parse_json(&ctl.ok(&["del", "missing", "-w", "json"]).await);
    assert_eq!(out, json!({"header": header(6)}));
    let out = ctl.ok(&["del", "foo", "--prev-kv", "-w", "fields"]).await;
    assert_eq!(
        out,
        format!(
            "\"ClusterID\" : {}\n\"MemberID\" : {}\n\"Revision\" : 7\n\"RaftTerm\" : {}\n\
             \"Deleted\" : 1\n\"PrevKey\" : \"foo\"\n\"PrevCreateRevision\" : 2\n\
             \"PrevModRevision\" : 4\n\"PrevVersion\" : 3\n\"PrevValue\" : \"qux\"\n\"PrevLease\" : 0\n",
            id.cluster, id.member, id.term
        )
    );
}

#[tokio::test]
async fn txn_from_stdin() {
    let (_m, mut c, ctl) = member_and_ctl().await;
    let id = ids(&mut c).await;
    ctl.ok(&["put", "t1", "v"]).await; // rev 2

    // compares, blank line, success ops, blank line, failure ops, blank line.
    let out = ctl
        .ok_stdin(
            &["txn"],
            "value(\"t1\") = \"v\"\n\nput t2 \"yes\"\nget t1\n\nput t2 \"no\"\n\n",
        )
        .await;
    assert_eq!(out, "SUCCESS\n\nOK\n\nt1\nv\n");
    let out = ctl
        .ok_stdin(
            &["txn"],
            "value(\"t1\") = \"zz\"\n\nput t2 \"yes\"\n\nput t2 \"no\"\ndel t1\n\n",
        )
        .await;
    assert_eq!(out, "FAILURE\n\nOK\n\n1\n");
    assert_eq!(ctl.ok(&["get", "t", "--prefix"]).await, "t2\nno\n");

    // -i prints the prompts.
    let out = ctl
        .ok_stdin(
            &["txn", "-i"],
            "mod(\"t2\") > \"0\"\nversion(\"t2\") = \"2\"\n\nput t3 x\n\n\n",
        )
        .await;
    assert_eq!(
        out,
        "compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\nSUCCESS\n\nOK\n"
    );

    // JSON: nested responses carry only a revision in their header; false `succeeded` is
    // omitted.
    let out = parse_json(
        &ctl.ok_stdin(
            &["txn", "-w", "json"],
            "create(\"t3\") < \"1\"\n\nput t4 y\n\nput t3 z\ndel t2\n\n",
        )
        .await,
    );
    assert_eq!(
        out,
        json!({
            "header": {"cluster_id": id.cluster, "member_id": id.member, "revision": 6, "raft_term": id.term},
            "responses": [
                {"Response": {"ResponsePut": {"header": {"revision": 6}}}},
                {"Response": {"ResponseDeleteRange": {"header": {"revision": 6}, "deleted": 1}}}
            ]
        })
    );
    let out = parse_json(&ctl.ok_stdin(&["txn", "-w", "json"], "\nget t3\n\n\n").await);
    assert_eq!(out["succeeded"], json!(true));
    assert_eq!(
        out["responses"][0]["Response"]["ResponseRange"]["kvs"][0]["value"],
        json!(b64(b"z"))
    );
    // A txn is one revision.
    let r = c.get("t3", None).await.unwrap();
    assert_eq!((r.kvs()[0].mod_revision(), r.kvs()[0].version()), (6, 2));
}

#[tokio::test]
async fn compaction() {
    let (_m, mut c, ctl) = member_and_ctl().await;
    for v in ["1", "2", "3", "4"] {
        ctl.ok(&["put", "k", v]).await; // revs 2..=5
    }
    assert_eq!(ctl.ok(&["compaction", "3"]).await, "compacted revision 3\n");
    let err = ctl.fail(&["get", "k", "--rev", "2"]).await;
    assert!(
        err.ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{err}"
    );
    assert_eq!(ctl.ok(&["get", "k", "--rev", "3"]).await, "k\n2\n");
    let out = ctl.run(&["compaction", "3"]).await.unwrap();
    assert_eq!(out.code(), Some(1));
    assert!(
        out.stderr
            .ends_with("Error: etcdserver: mvcc: required revision has been compacted\n"),
        "{}",
        out.stderr
    );
    let err = ctl.fail(&["compaction", "100"]).await;
    assert!(
        err.ends_with("Error: etcdserver: mvcc: required revision is a future revision\n"),
        "{err}"
    );
    assert_eq!(
        ctl.ok(&["compaction", "--physical", "5"]).await,
        "compacted revision 5\n"
    );
    assert_eq!(ctl.ok(&["get", "k"]).await, "k\n4\n");
    assert_eq!(
        c.get("k", None).await.unwrap().header().unwrap().revision(),
        5,
        "compaction does not create a revision"
    );
}

#[tokio::test]
async fn member_list_formats() {
    let (m, mut c, ctl) = member_and_ctl().await;
    let id = ids(&mut c).await;
    let hex = format!("{:x}", id.member);

    assert_eq!(
        ctl.ok(&["member", "list"]).await,
        format!(
            "{hex}, started, test, {}, {}, false\n",
            m.peer_url(),
            m.endpoint()
        )
    );

    let out = parse_json(&ctl.ok(&["member", "list", "-w", "json"]).await);
    // The member list header has no revision (zero is omitted).
    assert_eq!(
        out,
        json!({
            "header": {"cluster_id": id.cluster, "member_id": id.member, "raft_term": id.term},
            "members": [{"ID": id.member, "name": "test", "peerURLs": [m.peer_url()], "clientURLs": [m.endpoint()]}]
        })
    );

    let (headers, rows) = parse_table(&ctl.ok(&["member", "list", "-w", "table"]).await);
    assert_eq!(
        headers,
        [
            "ID",
            "STATUS",
            "NAME",
            "PEER ADDRS",
            "CLIENT ADDRS",
            "IS LEARNER"
        ]
    );
    assert_eq!(
        rows,
        [[
            hex,
            "started".to_owned(),
            "test".to_owned(),
            m.peer_url(),
            m.endpoint(),
            "false".to_owned()
        ]]
    );
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3 && parts[0] == "3" && parts.iter().all(|p| p.parse::<u32>().is_ok())
}

/// humanize.Bytes, e.g. "25 kB", "1.2 MB".
fn is_human_size(s: &str) -> bool {
    let Some((num, unit)) = s.split_once(' ') else {
        return false;
    };
    num.parse::<f64>().is_ok() && ["B", "kB", "MB", "GB"].contains(&unit)
}

#[tokio::test]
async fn endpoint_status_and_health() {
    let (m, mut c, ctl) = member_and_ctl().await;
    let id = ids(&mut c).await;
    let hex = format!("{:x}", id.member);

    // Simple: endpoint, id, version, db size, is leader, is learner, term, index, applied, errors.
    let out = ctl.ok(&["endpoint", "status"]).await;
    let fields: Vec<&str> = out.trim_end_matches('\n').split(", ").collect();
    assert_eq!(fields.len(), 10, "{out:?}");
    assert_eq!(fields[..2], [m.endpoint().as_str(), hex.as_str()]);
    assert!(is_version(fields[2]), "{out:?}");
    assert!(is_human_size(fields[3]), "{out:?}");
    assert_eq!(
        fields[4..7],
        ["true", "false", id.term.to_string().as_str()]
    );
    assert!(fields[7].parse::<u64>().unwrap() >= 1);
    assert!(fields[8].parse::<u64>().unwrap() >= 1);
    assert_eq!(fields[9], "", "no errors (line ends with \", \")");

    let (headers, rows) = parse_table(&ctl.ok(&["endpoint", "status", "-w", "table"]).await);
    assert_eq!(
        headers,
        [
            "ENDPOINT",
            "ID",
            "VERSION",
            "DB SIZE",
            "IS LEADER",
            "IS LEARNER",
            "RAFT TERM",
            "RAFT INDEX",
            "RAFT APPLIED INDEX",
            "ERRORS"
        ]
    );
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row[..2], [m.endpoint(), hex.clone()]);
    assert!(is_version(&row[2]), "{row:?}");
    assert!(is_human_size(&row[3]), "{row:?}");
    assert_eq!(row[4..7], ["true", "false", &id.term.to_string()]);
    assert!(
        row[7].parse::<u64>().is_ok() && row[8].parse::<u64>().is_ok(),
        "{row:?}"
    );
    assert_eq!(row[9], "");

    let out = parse_json(&ctl.ok(&["endpoint", "status", "-w", "json"]).await);
    let arr = out.as_array().expect("array");
    assert_eq!(arr.len(), 1);
    assert_eq!(arr[0]["Endpoint"], json!(m.endpoint()));
    let st = &arr[0]["Status"];
    let mut keys: Vec<&str> = st.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    // isLearner=false and empty errors are omitted.
    assert_eq!(
        keys,
        [
            "dbSize",
            "dbSizeInUse",
            "header",
            "leader",
            "raftAppliedIndex",
            "raftIndex",
            "raftTerm",
            "version"
        ]
    );
    assert_eq!(
        st["header"],
        json!({"cluster_id": id.cluster, "member_id": id.member, "revision": 1, "raft_term": id.term})
    );
    assert_eq!(st["leader"], json!(id.member));
    assert_eq!(st["raftTerm"], json!(id.term));
    assert!(is_version(st["version"].as_str().unwrap()));
    let db = st["dbSize"].as_u64().unwrap();
    let in_use = st["dbSizeInUse"].as_u64().unwrap();
    assert!(db > 0 && in_use > 0 && in_use <= db, "{st}");
    assert!(st["raftAppliedIndex"].as_u64().unwrap() <= st["raftIndex"].as_u64().unwrap());

    // endpoint health: the simple form goes to stderr (etcdctl 3.4).
    let out = ctl.run(&["endpoint", "health"]).await.unwrap();
    assert!(out.success());
    assert_eq!(out.stdout, "");
    let prefix = format!(
        "{} is healthy: successfully committed proposal: took = ",
        m.endpoint()
    );
    assert!(out.stderr.starts_with(&prefix), "{:?}", out.stderr);
    assert!(out.stderr.ends_with('\n') && out.stderr.lines().count() == 1);

    let out = parse_json(&ctl.ok(&["endpoint", "health", "-w", "json"]).await);
    let arr = out.as_array().expect("array");
    assert_eq!(arr.len(), 1);
    assert_eq!(arr[0]["endpoint"], json!(m.endpoint()));
    assert_eq!(arr[0]["health"], json!(true));
    assert!(arr[0]["took"].as_str().is_some());

    let (headers, rows) = parse_table(&ctl.ok(&["endpoint", "health", "-w", "table"]).await);
    assert_eq!(headers, ["ENDPOINT", "HEALTH", "TOOK", "ERROR"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0][0].as_str(), rows[0][1].as_str()),
        (m.endpoint().as_str(), "true")
    );
    assert_eq!(rows[0][3], "");
}
