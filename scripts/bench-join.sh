#!/usr/bin/env bash
# A new member catching up through a snapshot of the whole database, timed: a fresh single
# member loaded with JOIN_KEYS keys of JOIN_VAL bytes (etcd's benchmark, 100 clients), then,
# JOIN_ROUNDS times, a member added (`etcdctl member add`), started with
# --initial-cluster-state existing, and timed from its start until `endpoint status` on it shows
# the leader's revision; it is removed again before the next round.
#
# Usage: scripts/bench-join.sh etcd|ours
# Knobs: JOIN_KEYS (1000000), JOIN_VAL (256), JOIN_ROUNDS (2), JOIN_DIR (/tmp/join-bench: data
# dirs, removed at the end; the members' logs are kept beside it as $JOIN_DIR.<name>.log), JOIN_PORT (2370: this port and the next 7), ETCD34 (etcd on PATH),
# OURS (target/release/etcd), ETCD_BENCHMARK (../shared/tools/etcd-benchmark), JOIN_QUOTA (the
# members' --quota-backend-bytes: 8 GiB, or twice the keys' values when that is more; 8M keys of
# 1 KiB fill 8 GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
SYS=${1:?etcd or ours}
KEYS=${JOIN_KEYS:-1000000}
VAL=${JOIN_VAL:-256}
ROUNDS=${JOIN_ROUNDS:-2}
DIR=${JOIN_DIR:-/tmp/join-bench}
PORT=${JOIN_PORT:-2370}
ETCD34=${ETCD34:-$(command -v etcd)}
OURS=${OURS:-$PWD/target/release/etcd}
ETCD_BENCH=${ETCD_BENCHMARK:-$PWD/../shared/tools/etcd-benchmark}
QUOTA=${JOIN_QUOTA:-$(( KEYS * VAL * 2 > 8589934592 ? KEYS * VAL * 2 : 8589934592 ))}
BIN=$ETCD34
[ "$SYS" = ours ] && BIN=$OURS

PIDS=()
cleanup() {
  for log in "$DIR"/*.log; do [ -e "$log" ] && cp "$log" "$DIR.$(basename "$log")"; done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
rm -rf "$DIR"
mkdir -p "$DIR"

# start NAME CPORT PPORT CLUSTER STATE
start() {
  "$BIN" --name "$1" --data-dir "$DIR/$1" \
    --listen-client-urls "http://127.0.0.1:$2" --advertise-client-urls "http://127.0.0.1:$2" \
    --listen-peer-urls "http://127.0.0.1:$3" --initial-advertise-peer-urls "http://127.0.0.1:$3" \
    --initial-cluster "$4" --initial-cluster-token bench-join --initial-cluster-state "$5" \
    --quota-backend-bytes "$QUOTA" >>"$DIR/$1.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
}

revision() {
  { ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$1" --dial-timeout=1s --command-timeout=2s \
    endpoint status -w json 2>/dev/null || true; } | { grep -o '"revision":[0-9]*' || true; } \
    | head -n1 | cut -d: -f2
}

ctl() { ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$PORT" --command-timeout=600s "$@"; }

start m1 "$PORT" $((PORT + 1)) "m1=http://127.0.0.1:$((PORT + 1))" new
until [ -n "$(revision "$PORT")" ]; do sleep 0.1; done
echo "$SYS: loading $KEYS keys of $VAL B"
"$ETCD_BENCH" --endpoints "127.0.0.1:$PORT" --clients 100 --conns 10 put --key-size 16 \
  --val-size "$VAL" --sequential-keys --key-space-size "$KEYS" --total "$KEYS" >"$DIR/load.txt" 2>&1
target=$(revision "$PORT")
echo "$SYS: loaded, revision $target, db $(du -m "$DIR/m1" | tail -n1 | cut -f1) MiB"

for round in $(seq "$ROUNDS"); do
  name=j$round
  cport=$((PORT + 2 * round))
  pport=$((cport + 1))
  id=$(ctl member add "$name" --peer-urls "http://127.0.0.1:$pport" \
    | awk '$1 == "Member" && $3 == "added" { print $2 }')
  t0=$(date +%s.%N)
  start "$name" "$cport" "$pport" \
    "m1=http://127.0.0.1:$((PORT + 1)),$name=http://127.0.0.1:$pport" existing
  pid=$STARTED
  took=fail
  while kill -0 "$pid" 2>/dev/null; do
    r=$(revision "$cport")
    if [ -n "$r" ] && [ "$r" -ge "$target" ]; then
      took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
      break
    fi
    sleep 0.1
  done
  echo "$SYS: round $round: joined in $took s"
  # Removed while it runs: a two-member cluster without it has no quorum. etcd refuses to
  # remove a member while its peer has been connected for less than 5 s ("unhealthy
  # cluster"): retried.
  for _ in $(seq 60); do
    ctl member remove "$id" >/dev/null 2>&1 && break
    sleep 0.5
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "${DIR:?}/$name"
done
