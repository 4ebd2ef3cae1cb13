# The kube section of scripts/bench-compare (sourced by it when BENCH_KUBE=1; it uses the helpers
# defined there): kube-apiserver's traffic (`bench kube`) side by side on fresh single members,
# etcd 3.4 first, then ours. Each run: the nodes and pods created by create Txns, then
# BENCH_KUBE_DURATION seconds of the mix (node heartbeats, pod churn, events with leases,
# paginated LISTs, count-only and keys-only ranges, the watch stream with progress requests, the
# compaction loop); the server's CPU over the whole run per request, its RSS at the end. Two runs
# per server, each on a fresh member: the mix paced at its rates, then (BENCH_KUBE_MAX=1) the
# same mix unpaced, its writers closed-loop: the highest write rate each sustains with it; then
# (BENCH_KUBE_MATCHED=1, with both others) the mix paced at the write rate etcd 3.4 sustained
# unpaced, on each server: both servers' latencies and watch delay at one offered rate, the
# highest etcd keeps up with (the unpaced rows compare each server at its own, different, rate).
# Knobs: BENCH_KUBE_NODES (5000), BENCH_KUBE_PODS_PER_NODE (30), BENCH_KUBE_DURATION (120),
# BENCH_KUBE_CLIENTS (100) over BENCH_KUBE_CONNS (10), BENCH_KUBE_RATE_SCALE (1: multiplies the
# paced rates, which default to one real cluster's at 5,000 nodes, scaled by nodes/5000),
# BENCH_KUBE_PACED (1: 0 skips the paced run), BENCH_KUBE_COMPACT (30: seconds between compactions; kube-apiserver's 300 would never compact
# in a run this short, as its first turn only records the revision), BENCH_KUBE_MAX (1),
# BENCH_KUBE_ARGS (more `bench kube` flags), BENCH_KUBE_QUOTA (8589934592: both members'
# --quota-backend-bytes, the 8 GiB kube clusters use; at the 2 GiB default a server that keeps up
# with the unpaced mix fills its quota before the compaction loop's first turn).

KB_NODES=${BENCH_KUBE_NODES:-5000}
KB_PPN=${BENCH_KUBE_PODS_PER_NODE:-30}
KB_DURATION=${BENCH_KUBE_DURATION:-120}
KB_CLIENTS=${BENCH_KUBE_CLIENTS:-100}
KB_CONNS=${BENCH_KUBE_CONNS:-10}
KB_RATE_SCALE=${BENCH_KUBE_RATE_SCALE:-1}
KB_COMPACT=${BENCH_KUBE_COMPACT:-30}
KB_MAX=${BENCH_KUBE_MAX:-1}
KB_PACED=${BENCH_KUBE_PACED:-1}
KB_MATCHED=${BENCH_KUBE_MATCHED:-1}
read -r -a KB_ARGS <<<"${BENCH_KUBE_ARGS:-}"
MEMBER_FLAGS=(--quota-backend-bytes "${BENCH_KUBE_QUOTA:-8589934592}")

# kb_run SYS NAME ARGS... : `bench kube ARGS` on a fresh member of SYS; its JSON in
# $OUT/NAME.SYS.json, the server's CPU per request in .cpu, its RSS at the end in .rss.
kb_run() {
  local sys=$1 name=$2 bin=$ETCD34 dir cport pport pid before after
  shift 2
  [ "$sys" = ours ] && bin=$OURS
  log "$name: $sys, $KB_NODES nodes x $KB_PPN pods, ${KB_DURATION}s of the mix $*"
  dir=$WORK/$name.$sys
  cport=$(free_port)
  pport=$(free_port)
  start_member "$bin" kube "$dir" "$cport" "$pport" "kube=http://127.0.0.1:$pport" "$OUT/$name.$sys.log"
  pid=$STARTED
  if ! wait_healthy "127.0.0.1:$cport" 60 "$pid"; then
    log "$name: $sys did not start (see $OUT/$name.$sys.log)"
    stop_pids "$pid"
    return
  fi
  before=$(cpu_ticks "$pid")
  if ! "$BENCH" --endpoints "127.0.0.1:$cport" --output json --clients "$KB_CLIENTS" \
    --conns "$KB_CONNS" --duration "$KB_DURATION" kube --nodes "$KB_NODES" \
    --pods-per-node "$KB_PPN" --compact-interval "$KB_COMPACT" "$@" "${KB_ARGS[@]}" \
    >"$OUT/$name.$sys.json" 2>"$OUT/$name.$sys.err"; then
    log "$name on $sys failed: $(tail -n 3 "$OUT/$name.$sys.err" | tr '\n' ' ')"
  fi
  after=$(cpu_ticks "$pid")
  awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$(jnum "$OUT/$name.$sys.json" requests)" \
    'BEGIN { if (n ~ /^[0-9]+$/ && n > 0) printf "%.1f\n", t * 1e6 / hz / n; else print "fail" }' \
    >"$OUT/$name.$sys.cpu"
  rss_mib "$pid" >"$OUT/$name.$sys.rss"
  stop_pids "$pid"
  rm -rf "$dir"
}

for sys in etcd ours; do
  [ "$KB_PACED" = 1 ] && kb_run "$sys" kube --rate-scale "$KB_RATE_SCALE"
  [ "$KB_MAX" = 1 ] && kb_run "$sys" kube-max --unpaced
done
# The rate scale at which the paced mix offers etcd's unpaced write rate.
KB_MATCHED_SCALE=$(awk -v max="$(jnum "$OUT/kube-max.etcd.json" writes_per_sec)" \
  -v offered="$(jnum "$OUT/kube.etcd.json" offered_writes_per_sec)" -v scale="$KB_RATE_SCALE" \
  'BEGIN { if (max ~ /^[0-9.]+$/ && offered ~ /^[0-9.]+$/ && offered > 0) printf "%.3f", scale * max / offered; else print "fail" }')
if [ "$KB_MATCHED" = 1 ] && [ "$KB_PACED" = 1 ] && [ "$KB_MAX" = 1 ]; then
  if [ "$KB_MATCHED_SCALE" = fail ]; then
    log "kube-matched: no rate from etcd's runs, skipped"
  else
    for sys in etcd ours; do kb_run "$sys" kube-matched --rate-scale "$KB_MATCHED_SCALE"; done
  fi
fi

# --- the kube rows -----------------------------------------------------------------------------
kb() { fmt "$(jnum "$OUT/$1.$2.json" "$3")"; }
kb_file() { cat "$OUT/$1.$2.$3" 2>/dev/null || echo fail; }
# kb_row NAME LABEL KEY BETTER : one number of both servers' JSON.
kb_row() { row "$L: $2" "$(kb "$1" etcd "$3")" "$(kb "$1" ours "$3")" "$4"; }
L="kube, $KB_NODES nodes x $KB_PPN pods"
kb_row kube "create Txns (population), objects/s" populate_per_sec higher
kb_row kube "paced mix: writes offered/s" offered_writes_per_sec -
kb_row kube "paced mix: writes/s" writes_per_sec higher
kb_row kube "paced mix: write p50 ms" write_p50_ms lower
kb_row kube "paced mix: write p99 ms" write_p99_ms lower
kb_row kube "paced mix: write max ms" write_max_ms lower
kb_row kube "paced mix: LISTs done" lists higher
kb_row kube "paced mix: LIST of all pods, p50 ms" list_pods_p50_ms lower
kb_row kube "paced mix: LIST of all pods, p99 ms" list_pods_p99_ms lower
kb_row kube "paced mix: LIST of all nodes, p50 ms" list_nodes_p50_ms lower
kb_row kube "paced mix: LIST of all nodes, p99 ms" list_nodes_p99_ms lower
kb_row kube "paced mix: watch delay p50 ms" watch_delay_p50_ms lower
kb_row kube "paced mix: watch delay p99 ms" watch_delay_p99_ms lower
kb_row kube "paced mix: watch events" watch_events -
kb_row kube "paced mix: watch events missing" watch_missing -
kb_row kube "paced mix: conflicts" conflicts -
kb_row kube "paced: errors (population and mix)" errors -
row "$L: paced: server CPU us per request" "$(kb_file kube etcd cpu)" "$(kb_file kube ours cpu)" lower
row "$L: paced: server RSS after the run, MiB" "$(kb_file kube etcd rss)" "$(kb_file kube ours rss)" lower
if [ "$KB_MAX" = 1 ]; then
  kb_row kube-max "unpaced mix: writes/s" writes_per_sec higher
  kb_row kube-max "unpaced mix: write p50 ms" write_p50_ms lower
  kb_row kube-max "unpaced mix: write p99 ms" write_p99_ms lower
  kb_row kube-max "unpaced mix: LISTs done" lists higher
  kb_row kube-max "unpaced mix: LIST of all pods, p99 ms" list_pods_p99_ms lower
  kb_row kube-max "unpaced mix: watch delay p99 ms" watch_delay_p99_ms lower
  kb_row kube-max "unpaced mix: watch events missing" watch_missing -
  kb_row kube-max "unpaced mix: conflicts" conflicts -
  kb_row kube-max "unpaced: errors (population and mix)" errors -
  row "$L: unpaced: server CPU us per request" "$(kb_file kube-max etcd cpu)" \
    "$(kb_file kube-max ours cpu)" lower
  row "$L: unpaced: server RSS after the run, MiB" "$(kb_file kube-max etcd rss)" \
    "$(kb_file kube-max ours rss)" lower
fi
if [ "$KB_MATCHED" = 1 ] && [ -f "$OUT/kube-matched.etcd.json" ]; then
  M="matched mix (rate scale $KB_MATCHED_SCALE: etcd's unpaced rate)"
  kb_row kube-matched "$M: writes offered/s" offered_writes_per_sec -
  kb_row kube-matched "$M: writes/s" writes_per_sec higher
  kb_row kube-matched "$M: write p50 ms" write_p50_ms lower
  kb_row kube-matched "$M: write p99 ms" write_p99_ms lower
  kb_row kube-matched "$M: LIST of all pods, p99 ms" list_pods_p99_ms lower
  kb_row kube-matched "$M: watch delay p50 ms" watch_delay_p50_ms lower
  kb_row kube-matched "$M: watch delay p99 ms" watch_delay_p99_ms lower
  kb_row kube-matched "$M: watch events missing" watch_missing -
  kb_row kube-matched "$M: errors" errors -
  row "$L: matched: server CPU us per request" "$(kb_file kube-matched etcd cpu)" \
    "$(kb_file kube-matched ours cpu)" lower
fi
