# The scale section of scripts/bench-compare (sourced by it when BENCH_SCALE=1; it uses the
# helpers defined there): a big database side by side on a fresh single member of each, etcd 3.4
# first, then ours. Per server, in order:
#   load BENCH_SCALE_KEYS keys of BENCH_SCALE_VAL bytes with etcd's benchmark (100 clients), with
#   the server's CPU and bytes sent to the disk per put;
#   file size (length and blocks on the disk), endpoint status's dbSize and dbSizeInUse, RSS;
#   restart after SIGKILL and after SIGTERM, each timed to a healthy endpoint;
#   a paginated full scan (pages of 10,000 at the first page's revision), one reader and four;
#   two concurrent unpaginated ranges of BENCH_SCALE_RANGE keys, with the member's peak RSS growth;
#   half the keys overwritten, then a watch catching up on those events;
#   a physical compaction, then `etcdctl defrag`, each while one client keeps putting (500 a second): the call's
#   time, the writer's p99 and max latency and its failed requests meanwhile; sizes again;
#   a second member added, timed until it has caught up (through a snapshot of the database).
# Knobs: BENCH_SCALE_KEYS (1000000), BENCH_SCALE_VAL (1024), BENCH_SCALE_RANGE (200000),
# BENCH_SCALE_QUOTA (17179869184: 16 GiB; etcd 3.4 warns above 8 GiB), BENCH_SCALE_JOIN (1),
# BENCH_SCALE_SYSTEMS ("etcd ours": which servers run, in that order; one alone leaves the other's
# column failed), BENCH_SCALE_STEP_MAX (0: none; seconds after which the scans and the catch-up
# stop, their rows then saying how far they got: etcd 3.4's scan and catch-up grow faster than
# linearly and take hours at 10,000,000 keys), BENCH_SCALE_WRITER_RATE (500: the puts per second
# of the one client that writes during the compaction and the defrag; both servers then take the
# same writes in a second, so the files after those steps hold the same data per second of the
# step. 0: as fast as the server answers, which made the faster server's file after the
# compaction the larger by the writes it took in the 2 s before the compaction began).

SC_KEYS=${BENCH_SCALE_KEYS:-1000000}
SC_VAL=${BENCH_SCALE_VAL:-1024}
SC_RANGE=${BENCH_SCALE_RANGE:-200000}
SC_QUOTA=${BENCH_SCALE_QUOTA:-17179869184}
SC_JOIN=${BENCH_SCALE_JOIN:-1}
SC_SYSTEMS=${BENCH_SCALE_SYSTEMS:-etcd ours}
SC_STEP_MAX=${BENCH_SCALE_STEP_MAX:-0}
SC_WRITER_RATE=${BENCH_SCALE_WRITER_RATE:-500}
SC_CAP=()
[ "$SC_STEP_MAX" != 0 ] && SC_CAP=(--duration "$SC_STEP_MAX")
SC_HALF=$((SC_KEYS / 2))

# sc_start SYS NAME DIR CPORT PPORT CLUSTER STATE : a member of the scale section.
sc_start() {
  local bin=$ETCD34
  [ "$1" = ours ] && bin=$OURS
  "$bin" --name "$2" --data-dir "$3" \
    --listen-client-urls "http://127.0.0.1:$4" --advertise-client-urls "http://127.0.0.1:$4" \
    --listen-peer-urls "http://127.0.0.1:$5" --initial-advertise-peer-urls "http://127.0.0.1:$5" \
    --initial-cluster "$6" --initial-cluster-token bench-scale --initial-cluster-state "$7" \
    --quota-backend-bytes "$SC_QUOTA" >>"$OUT/scale.$1.$2.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
}

sc_ctl() { ETCDCTL_API=3 etcdctl --endpoints="$SC_EP" --command-timeout=3600s "$@"; }

# sc_status FIELD : a number of `endpoint status -w json` (dbSize, dbSizeInUse, revision).
sc_status() {
  { sc_ctl endpoint status -w json 2>/dev/null || true; } | { grep -o "\"$1\":[0-9]*" || true; } \
    | head -n1 | cut -d: -f2
}

sc_mib() { awk -v b="$1" 'BEGIN { if (b ~ /^[0-9]+$/) printf "%.0f", b / 1048576; else print "fail" }'; }

# sc_sizes SYS STEP : the database file's length and blocks, dbSize and dbSizeInUse, in MiB.
sc_sizes() {
  local f="$SC_DIR/member/snap/db"
  echo "$(sc_mib "$(stat -c %s "$f")") $(sc_mib "$(($(stat -c %b "$f") * $(stat -c %B "$f")))") \
$(sc_mib "$(sc_status dbSize)") $(sc_mib "$(sc_status dbSizeInUse)")" >"$OUT/scale.$1.sizes.$2"
}

# sc_secs COMMAND... : runs it, prints its wall time in seconds ("failed after N s" when it
# failed, so that the row is not read as the time of a finished call).
sc_secs() {
  local t0 failed=""
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { log "scale: '$*' failed"; failed=1; }
  awk -v a="$t0" -v b="$(date +%s.%N)" -v f="$failed" \
    'BEGIN { if (f) printf "failed after %.2f s", b - a; else printf "%.2f", b - a }'
}

# sc_restart SYS SIGNAL : stops the member with SIGNAL, starts it again, prints the seconds
# from the start to a healthy endpoint.
sc_restart() {
  kill -s "$2" "$SC_PID" 2>/dev/null || true
  for _ in $(seq 600); do kill -0 "$SC_PID" 2>/dev/null || break; sleep 0.1; done
  local t0
  t0=$(date +%s.%N)
  sc_start "$1" m1 "$SC_DIR" "$SC_CPORT" "$SC_PPORT" "m1=http://127.0.0.1:$SC_PPORT" new
  SC_PID=$STARTED
  wait_healthy "$SC_EP" 600 "$SC_PID" || log "scale: $1 not healthy after a $2 restart"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'
}

# sc_peak_rss PID FILE : samples the RSS of PID every 50 ms into FILE (peak MiB) until killed.
sc_peak_rss() {
  local peak=0 r
  while kill -0 "$1" 2>/dev/null; do
    r=$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$1/status" 2>/dev/null || echo 0)
    [ "${r:-0}" -gt "$peak" ] && peak=$r && echo "$peak" >"$2"
    sleep 0.05
  done
}

# sc_under_writer SYS NAME COMMAND... : runs COMMAND (timed) while one client puts at
# BENCH_SCALE_WRITER_RATE puts a second; the writer's JSON in $OUT/scale.SYS.NAME.writer.json, the seconds in .secs.
sc_under_writer() {
  local sys=$1 name=$2 wpid
  shift 2
  "$BENCH" --endpoints "$SC_EP" --output json --clients 1 --conns 1 --duration 36000 \
    put --key-size 16 --val-size "$SC_VAL" --key-space-size 1000 --rate "$SC_WRITER_RATE" \
    >"$OUT/scale.$sys.$name.writer.json" 2>"$OUT/scale.$sys.$name.writer.err" &
  wpid=$!
  sleep 2
  sc_secs "$@" >"$OUT/scale.$sys.$name.secs"
  sleep 1
  kill -TERM "$wpid" 2>/dev/null || true
  wait "$wpid" 2>/dev/null || true
}

for sys in $SC_SYSTEMS; do
  log "scale: $sys, $SC_KEYS keys of $SC_VAL bytes"
  SC_DIR=$WORK/scale.$sys
  SC_CPORT=$(free_port)
  SC_PPORT=$(free_port)
  SC_EP=127.0.0.1:$SC_CPORT
  sc_start "$sys" m1 "$SC_DIR" "$SC_CPORT" "$SC_PPORT" "m1=http://127.0.0.1:$SC_PPORT" new
  SC_PID=$STARTED
  wait_healthy "$SC_EP" 60 "$SC_PID" || { log "scale: $sys did not start"; continue; }

  before=$(cpu_ticks "$SC_PID")
  wbefore=$(disk_bytes)
  etool_run scale-load "$sys" "$SC_EP" --clients 100 --conns 10 put --key-size 16 \
    --val-size "$SC_VAL" --sequential-keys --key-space-size "$SC_KEYS" --total "$SC_KEYS"
  echo $(($(cpu_ticks "$SC_PID") - before)) >"$OUT/scale.$sys.load.ticks"
  per_request "$wbefore" "$(disk_bytes)" "$SC_KEYS" >"$OUT/scale.$sys.load.wbytes"
  sleep 2
  rss_mib "$SC_PID" >"$OUT/scale.$sys.rss"
  sc_sizes "$sys" load

  sc_restart "$sys" KILL >"$OUT/scale.$sys.restart.kill"
  sc_restart "$sys" TERM >"$OUT/scale.$sys.restart.term"

  "$BENCH" --endpoints "$SC_EP" --output json --clients 1 --conns 1 "${SC_CAP[@]}" scan --page-size 10000 \
    >"$OUT/scale.$sys.scan1.json" 2>"$OUT/scale.$sys.scan1.err" || log "scale: scan failed on $sys"
  "$BENCH" --endpoints "$SC_EP" --output json --clients 4 --conns 4 "${SC_CAP[@]}" scan --page-size 10000 \
    >"$OUT/scale.$sys.scan4.json" 2>"$OUT/scale.$sys.scan4.err" || log "scale: scan x4 failed on $sys"
  rss_before=$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$SC_PID/status")
  echo "$rss_before" >"$OUT/scale.$sys.unpaged.peak"
  sc_peak_rss "$SC_PID" "$OUT/scale.$sys.unpaged.peak" &
  sampler=$!
  "$BENCH" --endpoints "$SC_EP" --output json --clients 2 --conns 2 scan --page-size 0 \
    --limit "$SC_RANGE" >"$OUT/scale.$sys.unpaged.json" 2>"$OUT/scale.$sys.unpaged.err" \
    || log "scale: unpaginated ranges failed on $sys"
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  echo $(($(cat "$OUT/scale.$sys.unpaged.peak") - rss_before)) >"$OUT/scale.$sys.unpaged.growth"

  rev0=$(sc_status revision)
  etool_run scale-overwrite "$sys" "$SC_EP" --clients 100 --conns 10 put --key-size 16 \
    --val-size "$SC_VAL" --sequential-keys --key-space-size "$SC_HALF" --total "$SC_HALF"
  "$BENCH" --endpoints "$SC_EP" --output json "${SC_CAP[@]}" catchup --rev $((rev0 + 1)) --events "$SC_HALF" \
    >"$OUT/scale.$sys.catchup.json" 2>"$OUT/scale.$sys.catchup.err" || log "scale: catch-up failed on $sys"
  sc_sizes "$sys" overwrite

  rev=$(sc_status revision)
  sc_under_writer "$sys" compact sc_ctl compact "$rev" --physical
  sc_sizes "$sys" compact
  sc_under_writer "$sys" defrag sc_ctl defrag
  sc_sizes "$sys" defrag

  if [ "$SC_JOIN" = 1 ]; then
    j_cport=$(free_port)
    j_pport=$(free_port)
    sc_ctl member add m2 --peer-urls "http://127.0.0.1:$j_pport" >/dev/null 2>&1 \
      || log "scale: member add failed on $sys"
    target=$(sc_status revision)
    t0=$(date +%s.%N)
    sc_start "$sys" m2 "$WORK/scale.$sys.m2" "$j_cport" "$j_pport" \
      "m1=http://127.0.0.1:$SC_PPORT,m2=http://127.0.0.1:$j_pport" existing
    j_pid=$STARTED
    caught=fail
    for _ in $(seq 36000); do
      kill -0 "$j_pid" 2>/dev/null || break
      r=$({ ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$j_cport" --dial-timeout=1s \
        --command-timeout=2s endpoint status -w json 2>/dev/null || true; } \
        | { grep -o '"revision":[0-9]*' || true; } | head -n1 | cut -d: -f2)
      if [ -n "$r" ] && [ "$r" -ge "$target" ]; then
        caught=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
        break
      fi
      sleep 0.1
    done
    echo "$caught" >"$OUT/scale.$sys.join"
    stop_pids "$j_pid"
  fi
  stop_pids "$SC_PID"
  rm -rf "$SC_DIR" "$WORK/scale.$sys.m2"
done

# --- the scale rows ----------------------------------------------------------------------------
sc_get() { cat "$OUT/scale.$1.$2" 2>/dev/null || echo fail; }
sc_size() { awk -v i="$3" '{ print $i }' "$OUT/scale.$1.sizes.$2" 2>/dev/null || echo fail; }
sc_w() { fmt "$(jnum "$OUT/scale.$1.$2.writer.json" "$3")"; }
# sc_capped SYS STEP FIELD : STEP's FIELD, or "stopped at Ns (K keys or events)" when the cap
# ended it.
sc_capped() {
  local f="$OUT/scale.$1.$2.json"
  if grep -q '"stopped":true' "$f" 2>/dev/null; then
    local n
    n=$(jnum "$f" keys)
    [ "$n" = fail ] && n="$(jnum "$f" events) events" || n="$n keys"
    echo "stopped at $(jnum "$f" duration_s) s ($n)"
  else
    jnum "$f" "$3"
  fi
}
L="scale, $SC_KEYS keys of $SC_VAL B"
row "$L: load, puts/s (etcd's benchmark)" "$(etool "$OUT/etcd-tool.scale-load.etcd.txt" rps)" \
  "$(etool "$OUT/etcd-tool.scale-load.ours.txt" rps)" higher
for sys in etcd ours; do
  awk -v t="$(sc_get "$sys" load.ticks)" -v hz="$CLK_TCK" -v n="$SC_KEYS" \
    'BEGIN { if (t ~ /^[0-9]+$/ && n > 0) printf "%.1f\n", t * 1e6 / hz / n; else print "fail" }' \
    >"$OUT/scale.$sys.load.cpu"
done
row "$L: load, server CPU us per put" "$(sc_get etcd load.cpu)" "$(sc_get ours load.cpu)" lower
row "$L: load, server bytes written to disk per put" "$(sc_get etcd load.wbytes)" \
  "$(sc_get ours load.wbytes)" lower
row "$L: RSS after the load, MiB" "$(sc_get etcd rss)" "$(sc_get ours rss)" lower
for step in load overwrite compact defrag; do
  row "$L: file after $step, MiB on disk (length)" \
    "$(sc_size etcd "$step" 2) ($(sc_size etcd "$step" 1))" \
    "$(sc_size ours "$step" 2) ($(sc_size ours "$step" 1))" lower
  row "$L: dbSize / dbSizeInUse after $step, MiB" \
    "$(sc_size etcd "$step" 3) / $(sc_size etcd "$step" 4)" \
    "$(sc_size ours "$step" 3) / $(sc_size ours "$step" 4)" -
done
row "$L: restart after SIGKILL to healthy, s" "$(sc_get etcd restart.kill)" "$(sc_get ours restart.kill)" lower
row "$L: restart after SIGTERM to healthy, s" "$(sc_get etcd restart.term)" "$(sc_get ours restart.term)" lower
row "$L: paginated full scan, 1 reader, keys/s" "$(jnum "$OUT/scale.etcd.scan1.json" keys_per_sec)" \
  "$(jnum "$OUT/scale.ours.scan1.json" keys_per_sec)" higher
row "$L: paginated full scan, 4 readers, s" "$(sc_capped etcd scan4 duration_s)" \
  "$(sc_capped ours scan4 duration_s)" lower
row "$L: 2 unpaginated ranges of $SC_RANGE keys, s" "$(jnum "$OUT/scale.etcd.unpaged.json" duration_s)" \
  "$(jnum "$OUT/scale.ours.unpaged.json" duration_s)" lower
row "$L: 2 unpaginated ranges, member RSS growth MiB" "$(sc_get etcd unpaged.growth)" \
  "$(sc_get ours unpaged.growth)" lower
row "$L: overwrite half, puts/s (etcd's benchmark)" "$(etool "$OUT/etcd-tool.scale-overwrite.etcd.txt" rps)" \
  "$(etool "$OUT/etcd-tool.scale-overwrite.ours.txt" rps)" higher
row "$L: watch catch-up on $SC_HALF events, s" "$(sc_capped etcd catchup duration_s)" \
  "$(sc_capped ours catchup duration_s)" lower
for step in compact defrag; do
  row "$L: $step call, s" "$(sc_get etcd "$step.secs")" "$(sc_get ours "$step.secs")" lower
  row "$L: $step, writer p99 / max ms" "$(sc_w etcd "$step" p99) / $(sc_w etcd "$step" max)" \
    "$(sc_w ours "$step" p99) / $(sc_w ours "$step" max)" -
  row "$L: $step, writer puts / failed" "$(jnum "$OUT/scale.etcd.$step.writer.json" total) / $(jnum "$OUT/scale.etcd.$step.writer.json" errors)" \
    "$(jnum "$OUT/scale.ours.$step.writer.json" total) / $(jnum "$OUT/scale.ours.$step.writer.json" errors)" -
done
if [ "$SC_JOIN" = 1 ]; then
  row "$L: new member caught up (snapshot), s" "$(sc_get etcd join)" "$(sc_get ours join)" lower
fi
