#!/usr/bin/env bash
# bench-put.sh BIN CLIENTS TOTAL VALSIZE [PORT] : one row of bench-compare's put rows on its own.
# CONNS (default: CLIENTS, at most 100) sets the load generator's connections; bench-compare's
# rows use 10 for 100 clients and 100 for 1,000.
# Starts BIN (an etcd or etcd-rs binary) as a fresh single member, runs etcd's own load generator
# (../shared/tools/etcd-benchmark, or ETCD_BENCHMARK) with `put --key-size 8 --val-size VALSIZE
# --key-space-size 100000 --total TOTAL`, and prints requests/s, p99 (s), the server's CPU per put
# (/proc/PID/stat), the load generator's CPU per put (on two cores the two share the machine) and
# the bytes the block device under the data dir wrote per put during the run (machine-wide: run it
# on a quiet machine). Run it for each binary in turn for a ratio.
set -euo pipefail
BIN=$1 CLIENTS=$2 TOTAL=$3 VALSIZE=$4 PORT=${5:-25379}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOL=${ETCD_BENCHMARK:-$ROOT/../shared/tools/etcd-benchmark}
DIR=$(mktemp -d /tmp/bench-put.XXXXXX)
# shellcheck source=lib/member.sh
source "$ROOT/scripts/lib/member.sh"
member_flags "$DIR/data" "$PORT"
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
"$BIN" "${MEMBER_FLAGS[@]}" >"$DIR/log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$PORT" endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
dev=$(basename "$(df --output=source "$DIR" | tail -1)")
disk() { awk '{ printf "%.0f\n", $7 * 512 }' "/sys/class/block/$dev/stat"; }
cpu() { awk '{ print $14 + $15 }' "/proc/$PID/stat"; }
c0=$(cpu) d0=$(disk)
# The load generator's own CPU (user + system seconds), from bash's `time`.
TIMEFORMAT='%3U %3S'
{ time "$TOOL" --endpoints "127.0.0.1:$PORT" --clients "$CLIENTS" --conns "${CONNS:-$((CLIENTS < 100 ? CLIENTS : 100))}" \
  put --key-size 8 --val-size "$VALSIZE" --key-space-size 100000 --total "$TOTAL" >"$DIR/out" 2>&1; } 2>"$DIR/toolcpu"
out=$(cat "$DIR/out")
c1=$(cpu) d1=$(disk)
awk -v rps="$(echo "$out" | awk '/Requests\/sec/ { print $2 }')" \
  -v p99="$(echo "$out" | awk '$1 == "99%" && $2 == "in" { print $3 }')" \
  -v cpu=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="$TOTAL" -v bytes=$((d1 - d0)) -v bin="$BIN" \
  -v c="$CLIENTS" -v v="$VALSIZE" -v tool="$(awk '{ print $1 + $2 }' "$DIR/toolcpu")" \
  'BEGIN { printf "%s clients=%s value=%s requests/s=%s p99_s=%s server_cpu_us_per_put=%.1f tool_cpu_us_per_put=%.1f disk_bytes_per_put=%.0f\n",
           bin, c, v, rps, p99, cpu * 1e6 / hz / n, tool * 1e6 / n, bytes / n }'
