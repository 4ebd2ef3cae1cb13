"""The usual calls of etcd3gw (OpenStack's Python client for etcd's JSON gateway) against one
member: prints their results as one JSON object, which the Rust test compares with what etcd 3.4
gives. Usage: etcd3gw_calls.py HOST PORT"""
import json
import sys
import threading
import time

from etcd3gw.client import Etcd3Client

host, port = sys.argv[1], int(sys.argv[2])
c = Etcd3Client(host=host, port=port, timeout=10)
out = {}
out["api_path"] = c.api_path
out["put"] = c.put("foo", "bar")
out["get"] = [v.decode() if isinstance(v, bytes) else v for v in c.get("foo")]
c.put("dir/a", "1")
c.put("dir/b", "2")
out["get_prefix"] = sorted((v.decode(), m["key"].decode() if isinstance(m["key"], bytes) else m["key"]) for v, m in c.get_prefix("dir/"))
out["create_existing"] = c.create("foo", "other")
out["create_new"] = c.create("fresh", "x")
out["replace_ok"] = c.replace("foo", "bar", "baz")
out["replace_stale"] = c.replace("foo", "bar", "qux")
lease = c.lease(ttl=30)
out["lease_ttl_ok"] = 0 < lease.ttl() <= 30
c.put("leased", "v", lease=lease)
out["lease_keys"] = [k.decode() if isinstance(k, bytes) else k for k in lease.keys()]
out["refresh"] = lease.refresh() > 0
out["revoke"] = lease.revoke()
out["leased_after_revoke"] = c.get("leased")
events, cancel = c.watch("watched")
got = []
def reader():
    for ev in events:
        got.append((ev["kv"]["key"].decode() if isinstance(ev["kv"]["key"], bytes) else ev["kv"]["key"], ev.get("type", "PUT")))
        if len(got) == 2:
            break
t = threading.Thread(target=reader); t.start()
deadline = time.time() + 10
# Put until the watcher has seen two events (it may start after the first put), bounded.
while time.time() < deadline and t.is_alive() and len(got) < 2:
    c.put("watched", "w%d" % len(got))
    t.join(timeout=0.2)
t.join(timeout=10)
cancel()
out["watch"] = got[:2]
out["delete"] = c.delete("foo")
out["delete_missing"] = c.delete("foo")
out["members"] = len(c.members())
print(json.dumps(out, sort_keys=True))
