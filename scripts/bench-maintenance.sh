#!/usr/bin/env bash
# bench-maintenance.sh BIN [KEYS] : a physical compaction and a defragmentation of a loaded member,
# each while one client keeps writing (issue 43's "no pauses" rows, on their own).
# Starts BIN (etcd or etcd-rs) as a fresh single member with a 16 GiB quota, loads KEYS (1000000)
# keys of 1 KiB with etcd's load generator (100 clients), overwrites half of them, then runs
# `etcdctl compact REV --physical` and `etcdctl defrag`, each beside `bench put` (one client,
# 1 KiB values, target/release/bench): prints each call's time, the writer's puts, errors, p99 and
# max latency, and the database size (etcd's dbSize and dbSizeInUse) after each step.
set -euo pipefail
BIN=$1 KEYS=${2:-1000000} PORT=${BENCH_MAINT_PORT:-26379}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOL=${ETCD_BENCHMARK:-$ROOT/../shared/tools/etcd-benchmark}
BENCH=$ROOT/target/release/bench
DIR=$(mktemp -d /tmp/bench-maintenance.XXXXXX)
# shellcheck source=lib/member.sh
source "$ROOT/scripts/lib/member.sh"
QUOTA=17179869184 member_flags "$DIR/data" "$PORT"
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
"$BIN" "${MEMBER_FLAGS[@]}" >"$DIR/log" 2>&1 &
PID=$!
ctl() { ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$PORT" --command-timeout=3600s "$@"; }
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
status() {
  ctl endpoint status -w json | python3 -c 'import json, sys
d = json.load(sys.stdin)[0]["Status"]
print("  dbSize %.0f MiB, dbSizeInUse %.0f MiB, revision %s" % (d["dbSize"] / 2**20, d.get("dbSizeInUse", 0) / 2**20, d["header"]["revision"]))'
}
load() {
  local t0
  t0=$(date +%s.%N)
  "$TOOL" --endpoints "127.0.0.1:$PORT" --clients 100 --conns 100 put --key-size 8 --val-size 1024 \
    --key-space-size "$1" --sequential-keys --total "$1" 2>&1 | grep Requests/sec
  echo "  took $(echo "$(date +%s.%N) - $t0" | bc) s"
}
echo "load $KEYS keys of 1 KiB:"; load "$KEYS"; status
echo "overwrite half:"; load $((KEYS / 2)); status
for op in compact defrag; do
  "$BENCH" --endpoints "127.0.0.1:$PORT" --clients 1 --conns 1 --duration 36000 --output json \
    put --key-size 16 --val-size 1024 --key-space-size 1000 >"$DIR/writer.json" 2>"$DIR/writer.err" &
  writer=$!
  sleep 2
  rev=$(ctl endpoint status -w json | grep -o '"revision":[0-9]*' | cut -d: -f2)
  t0=$(date +%s.%N)
  if [ "$op" = compact ]; then ctl compact "$rev" --physical >/dev/null; else ctl defrag >/dev/null; fi
  took=$(echo "$(date +%s.%N) - $t0" | bc)
  sleep 1
  kill -TERM "$writer" 2>/dev/null || true
  wait "$writer" 2>/dev/null || true
  echo "$op: $took s; writer: $(python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); l = d["latency_ms"]
print("%d puts, %d errors, p99 %.1f ms, max %.1f ms" % (d["total"], d["errors"], l["p99"], l["max"]))' "$DIR/writer.json" 2>/dev/null || echo "no report: $(head -c 300 "$DIR/writer.err")")"
  status
done
