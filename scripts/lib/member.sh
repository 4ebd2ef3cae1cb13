# Sourced by the bench scripts that start one fresh member of their own.
# member_flags DATA_DIR PORT: sets MEMBER_FLAGS to the flags of a single member named m on
# 127.0.0.1, clients on PORT and peers on PORT + 1, its data in DATA_DIR (the quota, 8 GiB unless
# QUOTA says otherwise, well above what a run writes).
member_flags() {
  local peer="http://127.0.0.1:$(($2 + 1))"
  MEMBER_FLAGS=(--name m --data-dir "$1" --listen-client-urls "http://127.0.0.1:$2"
    --advertise-client-urls "http://127.0.0.1:$2" --listen-peer-urls "$peer"
    --initial-advertise-peer-urls "$peer" --initial-cluster "m=$peer"
    --quota-backend-bytes "${QUOTA:-8589934592}")
}
