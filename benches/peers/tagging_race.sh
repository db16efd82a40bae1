#!/usr/bin/env bash
# Document-tagging race: farout's DocEncoder configs (margin, softmax) against omikuji, PECOS
# XR-Linear and fastText supervised (-loss hs, -loss softmax; xmc_peers.py), one after the other,
# each in its own process, on each data set named: bibtex, delicious ($FAROUT_DATA/xmc/NAME) and
# x17k (synthetic, 65,000 x 75,000 x 17,000, made by `farout data gen xmc` into $X17K if
# $X17K/train.txt is missing). Appends one JSON line per run to $OUT_JSONL (and the commands with
# their JSON to $OUT_MD), then prints markdown tables of test P@1/3/5 and training wall seconds
# (summarize.py --compact, then summarize.py's full tables) over everything in $OUT_JSONL:
# remove it first for a table of this run alone.
#
#   python3 -m venv /tmp/tag-venv && /tmp/tag-venv/bin/pip install omikuji libpecos fasttext-wheel numpy scipy
#   VENV=/tmp/tag-venv OUT_JSONL=/tmp/tagging/race.jsonl benches/peers/tagging_race.sh [bibtex delicious x17k]
#
# Run from anywhere; farout runs from the project root. Settings:
#   farout   configs/NAME-margin.toml and configs/NAME-softmax.toml; on x17k
#            configs/delicious-{margin,softmax}.toml with --set data.train/data.test = $X17K/...
#            and --set train.epochs=1 (docs/benchmarks.md, "Synthetic tagging data"); always
#            --set train.threads=$THREADS, logs in $WORK/runs/DS-CONFIG (not runs/), --summary
#            file, from which P@k (x 100) and train_seconds are taken.
#   peers    xmc_peers.py --threads $THREADS --only PEER on the raw features (see its docstring:
#            omikuji 3 trees, PECOS defaults, fastText dim 100, 25 epochs, lr 0.5).
# FAROUT (default: a copy of target/release/farout made at the start, so that a rebuild during the
# run changes nothing), THREADS=2, TOOLS (default "farout-margin farout-softmax omikuji pecos
# fasttext-hs fasttext-softmax"), FAROUT_DATA=/work/shared/data next to the project,
# X17K=/tmp/x17k, WORK=/tmp/tagging, TIMEOUT (seconds, optional: kill a run after this long,
# rc 124). No cargo: build the release binary beforehand.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/record.sh"
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-/tmp/tag-venv}
THREADS=${THREADS:-2}
WORK=${WORK:-/tmp/tagging}
OUT_JSONL=${OUT_JSONL:-$WORK/race.jsonl}
OUT_MD=${OUT_MD:-$WORK/race.md}
LOGDIR=${LOGDIR:-$WORK/logs}
X17K=${X17K:-/tmp/x17k}
export FAROUT_DATA=${FAROUT_DATA:-$(cd "$ROOT/.." && pwd)/shared/data}
TOOLS=${TOOLS:-"farout-margin farout-softmax omikuji pecos fasttext-hs fasttext-softmax"}
[ $# -eq 0 ] && set -- bibtex delicious x17k
mkdir -p "$LOGDIR" "$WORK/runs" "$(dirname "$OUT_JSONL")" "$(dirname "$OUT_MD")"

if [ -z "${FAROUT:-}" ]; then
  FAROUT=$WORK/farout
  cp "$ROOT/target/release/farout" "$FAROUT" || exit 1
fi
FAROUT_ID="$("$FAROUT" --version), sha256 $(sha256sum "$FAROUT" | cut -c1-12), tree $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ] && FAROUT_ID="$FAROUT_ID (dirty)"

echo "start $(date -u +%FT%TZ); uptime: $(uptime)"
echo "farout: $FAROUT_ID; peers: $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(", ".join(f"{p} {v(p)}" for p in ("omikuji", "libpecos", "fasttext-wheel", "numpy", "scipy")))')"

# run TAG FAROUT_SUMMARY CMD... : runs CMD under /usr/bin/time, logs command + JSON. The JSON is
# the last stdout line starting with `{` (peers) or, when FAROUT_SUMMARY is not -, the farout
# summary file put in the peers' shape (P@k and nDCG@k in percent).
run() {
  local tag=$1 summary=$2; shift 2
  local log="$LOGDIR/${tag//[\/:]/_}"
  local up; up=$(uptime)
  local to=(); [ -n "${TIMEOUT:-}" ] && to=(timeout "$TIMEOUT")
  [ "$summary" != - ] && rm -f "$summary"
  (cd "$ROOT" && /usr/bin/time -f '%e %M' -o "$log.time" "${to[@]}" "$@") > "$log.out" 2> "$log.err"
  local rc=$?
  local json
  if [ "$summary" != - ]; then
    json=$(python3 - "$summary" "$tag" "$FAROUT_ID" "$THREADS" <<'EOF' 2>>"$log.err"
import json, os, sys
s = json.load(open(sys.argv[1]))
m = s["metrics"]
out = {"peer": sys.argv[2].split("/")[1], "version": sys.argv[3], "config": s["name"],
       "threads": int(sys.argv[4]), "n_train": s["n_train"], "n_test": s["n_test"], "n_labels": s["n_classes"],
       "train_seconds": round(s["train_seconds"], 3)}
out.update({k: round(100 * m[k], 2) for k in ("p@1", "p@3", "p@5", "ndcg@1", "ndcg@3", "ndcg@5")})
out["n_eval"] = int(m["samples"])
out.update({k: s[k] for k in ("epochs", "steps", "samples_per_s", "model_bytes", "peak_rss_bytes")})
out["loadavg"] = os.getloadavg()[0]
print(json.dumps(out))
EOF
)
  else
    json=$(grep '^{' "$log.out" | tail -1)
  fi
  record "$tag" 1 "$rc" "$log" "$up" "$json" "$@"
  echo "$json" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read() or "null") or {}; print("  P@1/3/5", r.get("p@1"), r.get("p@3"), r.get("p@5"), "train s", r.get("train_seconds"))' >&2 2>/dev/null
}

for ds in "$@"; do
  case $ds in
    x17k)
      if [ ! -f "$X17K/train.txt" ]; then
        echo "generating $X17K" >&2
        "$FAROUT" data gen xmc --samples 65000 --features 75000 --labels 17000 --out "$X17K" || exit 1
      fi
      train=$X17K/train.txt; test=$X17K/test.txt; cfg=delicious
      over=(--set "data.train=\"$train\"" --set "data.test=\"$test\"" --set train.epochs=1) ;;
    *)
      train=$FAROUT_DATA/xmc/$ds/train.txt; test=$FAROUT_DATA/xmc/$ds/test.txt; cfg=$ds; over=() ;;
  esac
  for tool in $TOOLS; do
    case $tool in
      farout-*)
        name=$cfg-${tool#farout-}
        run "$ds/$tool/raw" "$WORK/runs/$ds-$name.summary.json" "$FAROUT" train "configs/$name.toml" "${over[@]}" \
          --set train.threads="$THREADS" --set "log.dir=\"$WORK/runs/$ds-$name\"" --set log.progress=false \
          --overwrite --summary "$WORK/runs/$ds-$name.summary.json" ;;
      *)
        run "$ds/$tool/raw" - "$VENV/bin/python" "$HERE/xmc_peers.py" --train "$train" --test "$test" \
          --threads "$THREADS" --only "$tool" --tmp "$WORK/tmp" ${PEER_EXTRA:-} ;;
    esac
  done
done

echo "end $(date -u +%FT%TZ); uptime: $(uptime)"
python3 "$HERE/summarize.py" --compact "$OUT_JSONL"
python3 "$HERE/summarize.py" "$OUT_JSONL"
