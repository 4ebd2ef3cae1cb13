#!/usr/bin/env bash
# bench-instructions.sh BIN TOTAL VALSIZE : user-space instructions the server executes per put,
# counted by valgrind's callgrind: a measure of CPU per request that the machine's noise does not
# move (the wall-clock rows of bench-compare swing by a third on a shared machine), for comparing
# two builds of ours. Kernel work (system calls, copies into the page cache, the network stack)
# is not counted, and valgrind runs the member about fifty times slower, one thread at a time, so
# batches are smaller than at full speed: compare builds with it, not servers.
#
# Starts BIN under callgrind with instrumentation off as a fresh single member, warms it up with
# 500 puts, then counts only while etcd's load generator (../shared/tools/etcd-benchmark, or
# ETCD_BENCHMARK) puts TOTAL values of VALSIZE bytes (8-byte keys over 100,000, CLIENTS clients
# (default 50) over 10 connections). Prints the instructions per put. Needs valgrind.
set -euo pipefail
BIN=$1 TOTAL=$2 VALSIZE=$3 PORT=${PORT:-25379}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOL=${ETCD_BENCHMARK:-$ROOT/../shared/tools/etcd-benchmark}
DIR=$(mktemp -d /tmp/bench-instructions.XXXXXX)
# shellcheck source=lib/member.sh
source "$ROOT/scripts/lib/member.sh"
member_flags "$DIR/data" "$PORT"
trap 'kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; rm -rf "$DIR"' EXIT
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$DIR/callgrind.out" \
  "$BIN" "${MEMBER_FLAGS[@]}" >"$DIR/log" 2>&1 &
PID=$!
for _ in $(seq 300); do
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$PORT" endpoint health >/dev/null 2>&1 && break
  sleep 0.5
done
put() {
  "$TOOL" --endpoints "127.0.0.1:$PORT" --clients "$1" --conns 10 \
    put --key-size 8 --val-size "$VALSIZE" --key-space-size 100000 --total "$2"
}
put 10 500 >/dev/null 2>&1
callgrind_control --instr=on "$PID" >/dev/null
put "${CLIENTS:-50}" "$TOTAL" >"$DIR/out" 2>&1
callgrind_control --instr=off "$PID" >/dev/null
callgrind_control --dump "$PID" >/dev/null
# The dump is written by the member's next scheduling of valgrind's thread: wait for its totals.
for _ in $(seq 120); do
  grep -qs '^totals:' "$DIR/callgrind.out.1" && break
  sleep 0.5
done
total=$(awk '/^totals:/ { print $2 }' "$DIR/callgrind.out.1")
[ -n "$total" ] || { echo "no callgrind dump from the member" >&2; exit 1; }
[ -z "${KEEP_PROFILE:-}" ] || cp "$DIR/callgrind.out.1" "$KEEP_PROFILE"
echo "$BIN value=$VALSIZE puts=$TOTAL requests/s_under_valgrind=$(awk '/Requests\/sec/ { print $2 }' "$DIR/out") instructions_per_put=$((total / TOTAL))"
