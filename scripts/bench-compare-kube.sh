# The kube section of scripts/bench-compare (sourced by it when BENCH_KUBE=1; it uses the helpers
# defined there): kube-apiserver's traffic (`bench kube`) side by side on a fresh single member
# of each, etcd 3.4 first, then ours. Per server: the nodes and pods created by create Txns, then
# BENCH_KUBE_DURATION seconds of the mix (node heartbeats, pod churn, events with leases,
# paginated LISTs, count-only and keys-only ranges, the watch stream with progress requests, the
# compaction loop); the server's CPU over the whole run per request, and its RSS at the end.
# Knobs: BENCH_KUBE_NODES (5000), BENCH_KUBE_PODS_PER_NODE (30), BENCH_KUBE_DURATION (120),
# BENCH_KUBE_CLIENTS (100) over BENCH_KUBE_CONNS (10), BENCH_KUBE_RATE_SCALE (1: multiplies the
# write rates, which default to one real cluster's at 5,000 nodes, scaled by nodes/5000),
# BENCH_KUBE_COMPACT (300: seconds between compactions), BENCH_KUBE_ARGS (more `bench kube` flags).

KB_NODES=${BENCH_KUBE_NODES:-5000}
KB_PPN=${BENCH_KUBE_PODS_PER_NODE:-30}
KB_DURATION=${BENCH_KUBE_DURATION:-120}
KB_CLIENTS=${BENCH_KUBE_CLIENTS:-100}
KB_CONNS=${BENCH_KUBE_CONNS:-10}
KB_RATE_SCALE=${BENCH_KUBE_RATE_SCALE:-1}
KB_COMPACT=${BENCH_KUBE_COMPACT:-300}
read -r -a KB_ARGS <<<"${BENCH_KUBE_ARGS:-}"

for sys in etcd ours; do
  bin=$ETCD34
  [ $sys = ours ] && bin=$OURS
  log "kube: $sys, $KB_NODES nodes x $KB_PPN pods, ${KB_DURATION}s of the mix"
  kb_dir=$WORK/kube.$sys
  kb_cport=$(free_port)
  kb_pport=$(free_port)
  start_member "$bin" kube "$kb_dir" "$kb_cport" "$kb_pport" "kube=http://127.0.0.1:$kb_pport" \
    "$OUT/kube.$sys.log"
  kb_pid=$STARTED
  if ! wait_healthy "127.0.0.1:$kb_cport" 60 "$kb_pid"; then
    log "kube: $sys did not start (see $OUT/kube.$sys.log)"
    continue
  fi
  before=$(cpu_ticks "$kb_pid")
  if ! "$BENCH" --endpoints "127.0.0.1:$kb_cport" --output json --clients "$KB_CLIENTS" \
    --conns "$KB_CONNS" --duration "$KB_DURATION" kube --nodes "$KB_NODES" \
    --pods-per-node "$KB_PPN" --rate-scale "$KB_RATE_SCALE" --compact-interval "$KB_COMPACT" \
    "${KB_ARGS[@]}" >"$OUT/kube.$sys.json" 2>"$OUT/kube.$sys.err"; then
    log "kube on $sys failed: $(tail -n 3 "$OUT/kube.$sys.err" | tr '\n' ' ')"
  fi
  after=$(cpu_ticks "$kb_pid")
  awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$(jnum "$OUT/kube.$sys.json" requests)" \
    'BEGIN { if (n ~ /^[0-9]+$/ && n > 0) printf "%.1f\n", t * 1e6 / hz / n; else print "fail" }' \
    >"$OUT/kube.$sys.cpu"
  rss_mib "$kb_pid" >"$OUT/kube.$sys.rss"
  stop_pids "$kb_pid"
  rm -rf "$kb_dir"
done

# --- the kube rows -----------------------------------------------------------------------------
kb() { fmt "$(jnum "$OUT/kube.$1.json" "$2")"; }
kb_row() { row "$L: $1" "$(kb etcd "$2")" "$(kb ours "$2")" "$3"; }
L="kube, $KB_NODES nodes x $KB_PPN pods"
kb_row "create Txns (population), objects/s" populate_per_sec higher
kb_row "mix: writes/s" writes_per_sec higher
kb_row "mix: write p50 ms" write_p50_ms lower
kb_row "mix: write p99 ms" write_p99_ms lower
kb_row "mix: write max ms" write_max_ms lower
kb_row "mix: LISTs done" lists higher
kb_row "mix: LIST p50 ms" list_p50_ms lower
kb_row "mix: LIST p99 ms" list_p99_ms lower
kb_row "mix: watch delay p50 ms" watch_delay_p50_ms lower
kb_row "mix: watch delay p99 ms" watch_delay_p99_ms lower
kb_row "mix: watch events" watch_events -
kb_row "mix: watch events missing" watch_missing -
kb_row "mix: conflicts" conflicts -
kb_row "errors (population and mix)" errors -
row "$L: server CPU us per request" "$(cat "$OUT/kube.etcd.cpu" 2>/dev/null || echo fail)" \
  "$(cat "$OUT/kube.ours.cpu" 2>/dev/null || echo fail)" lower
row "$L: server RSS after the run, MiB" "$(cat "$OUT/kube.etcd.rss" 2>/dev/null || echo fail)" \
  "$(cat "$OUT/kube.ours.rss" 2>/dev/null || echo fail)" lower
