#!/usr/bin/env bash
# Interleaved peer benchmark: omikuji, PECOS XR-Linear, LIBLINEAR -s 2 OvA (xmc_peers.py) and
# farout's DiSMEC example, raw and tf-idf, REPS repetitions, on each data set directory given.
# Appends every command and its JSON to $OUT_MD (markdown) and $OUT_JSONL.
#
#   VENV=/tmp/peers/venv DISMEC=/tmp/peers/dismec REPS=3 THREADS=2 \
#     benches/peers/run_bench.sh /work/shared/data/xmc/bibtex /work/shared/data/xmc/delicious
#
# DISMEC is the binary built by
#   CARGO_TARGET_DIR=/work/target-linear cargo build --release -p farout-linear --example dismec
# (copied out of the target dir so that concurrent edits/rebuilds don't change it mid-run).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/record.sh"
VENV=${VENV:-/tmp/peers/venv}
DISMEC=${DISMEC:-/tmp/peers/dismec}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
OUT_MD=${OUT_MD:-/tmp/peers/results.md}
OUT_JSONL=${OUT_JSONL:-/tmp/peers/results.jsonl}
LOGDIR=${LOGDIR:-/tmp/peers/logs}
# TIMEOUT (seconds, optional): kill a run after this long (rc 124 in the log).
VARIANTS=${VARIANTS:-"omikuji:raw omikuji:tfidf pecos:raw pecos:tfidf liblinear:raw liblinear:tfidf dismec-msi:raw dismec-msi:tfidf dismec-zero:raw dismec-zero:tfidf"}
mkdir -p "$LOGDIR"

# run TAG REP CMD... : runs CMD under /usr/bin/time, logs command + JSON (last stdout line).
run() {
  local tag=$1 rep=$2; shift 2
  local log="$LOGDIR/${tag//[\/:]/_}.rep$rep"
  local up; up=$(uptime)
  local to=(); [ -n "${TIMEOUT:-}" ] && to=(timeout "$TIMEOUT")
  /usr/bin/time -f '%e %M' -o "$log.time" "${to[@]}" "$@" > "$log.out" 2> "$log.err"
  local rc=$?
  record "$tag" "$rep" "$rc" "$log" "$up" "$(grep '^{' "$log.out" | tail -1)" "$@"
}

for rep in $(seq 1 "$REPS"); do
  for dir in "$@"; do
    ds=$(basename "$dir")
    for v in $VARIANTS; do
      peer=${v%%:*}; feat=${v##*:}
      tf=(); [ "$feat" = tfidf ] && tf=(--tfidf)
      case $peer in
        dismec-*)
          run "$ds/$peer/$feat" "$rep" "$DISMEC" --data "$dir" --init "${peer#dismec-}" "${tf[@]}" --threads "$THREADS" ;;
        *)
          run "$ds/$peer/$feat" "$rep" "$VENV/bin/python" "$HERE/xmc_peers.py" --train "$dir/train.txt" \
            --test "$dir/test.txt" --threads "$THREADS" --only "$peer" "${tf[@]}" ${PEER_EXTRA:-} ;;
      esac
    done
  done
done
