#!/usr/bin/env bash
# The LDGS paper's Figure 3 at One Billion Word scale: GD, GD-MIPS and GD-Decomp-MIPS on the
# collapsed skip-gram objective (eq. 9) over a synthetic 100 M-token corpus of 451,000 words,
# each started from the same epoch of negative sampling and given the same training time.
#
#   benches/figure3.sh OUT [SECONDS]      # default 600 s per method; about 15 GB free disk
#
# In OUT: runs/warm (the corpus, the held-out text and the negative-sampling checkpoint),
# runs/<method> (each method's run), and the compare layout that `farout compare --from OUT`
# draws: OUT/runs/<method>@0/{summary.json,metrics.jsonl}, summary.md and curves.png.
# FAROUT names the binary (default: target/release/farout, built if missing); WORDS and TOKENS
# change the corpus (default 451000 and 100000000; a quick check: WORDS=5000 TOKENS=300000).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: benches/figure3.sh OUT [SECONDS]}
SECONDS_EACH=${2:-600}
FAROUT=${FAROUT:-$HERE/target/release/farout}
[ -x "$FAROUT" ] || (cd "$HERE" && cargo build --release --bin farout)
mkdir -p "$OUT/work" && cd "$OUT/work"

WORDS=${WORDS:-451000}
TOKENS=${TOKENS:-100000000}
SCALE=(--set data.synthetic.words=$WORDS --set data.synthetic.tokens=$TOKENS --set data.synthetic.topics=$((WORDS >= 451 ? WORDS / 451 : 1)))
if [ ! -d runs/warm/checkpoint ]; then
  "$FAROUT" train "$HERE/configs/skipgram-gd-ldgs.toml" --set name=\"warm\" --set train.epochs=1 "${SCALE[@]}" \
    --summary warm.json
fi
# Every method's budget counts the warm-up's training seconds too.
WARM_SECONDS=$(python3 -c "import json; print(int(json.load(open('warm.json'))['train_seconds']) + 1)")

for method in gd gd-mips gd-ldgs; do
  rm -rf "runs/$method" && mkdir -p "runs/$method" && cp -r runs/warm/checkpoint "runs/$method/checkpoint"
  search=()
  # K/20 classes per search (per block for GD-Decomp-MIPS), as in the paper; the index
  # reassigns every changed row every 50 steps.
  [ "$method" = gd ] || search=(--set output.top=$((WORDS / 20)) --set index.refresh_every=50 --set index.refresh_drift=-1)
  "$FAROUT" train "$HERE/configs/compare/skipgram/$method.toml" --resume --set name=\"$method\" \
    --set data.corpus=\"runs/warm/corpus.txt\" --set eval.heldout=\"runs/warm/heldout.txt\" \
    --set train.epochs=2 --set train.max_seconds=$((WARM_SECONDS + SECONDS_EACH)) \
    --set model.skip_gram.updates=\"simultaneous\" --set train.batch_size=256 \
    --set eval.every_seconds=60 "${search[@]}" --summary "$method.json"
  mkdir -p "$OUT/runs/$method@0"
  cp "$method.json" "$OUT/runs/$method@0/summary.json"
  cp "runs/$method/metrics.jsonl" "$OUT/runs/$method@0/metrics.jsonl"
done
"$FAROUT" compare --from "$OUT" --out "$OUT"
