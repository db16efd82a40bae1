#!/bin/sh
# farout against gensim 4.4 on dict-gcide with the same settings, for SEEDS seeds; one JSON line
# per run. gensim is evaluated on farout's word order (see scripts/gensim-skipgram.py --order).
# Both use word2vec's step size 0.025 (gensim's default alpha; the config's own lr is 0.05).
#   python3 -m venv /tmp/peers && /tmp/peers/bin/pip install gensim==4.4.0 scipy
#   bash scripts/compare-gensim.sh /tmp/gcide.txt 5 [/tmp/peers/bin/python]
set -eu
corpus=${1:?usage: compare-gensim.sh CORPUS [SEEDS] [PYTHON]}
seeds=${2:-5}
python=${3:-/tmp/peers/bin/python}
farout=${FAROUT:-target/release/farout}
for seed in $(seq 1 "$seeds"); do
  $farout train configs/skipgram-gcide.toml --overwrite --set model.skip_gram.lr=0.025 --set data.corpus="\"$corpus\"" --set log.progress=false \
    --set seed=$seed --set name=gcide-s$seed --summary /tmp/farout-gcide-s$seed.json > /dev/null
  python3 -c "import json; s=json.load(open('/tmp/farout-gcide-s$seed.json')); print(json.dumps({'peer': 'farout', 'seed': $seed, 'seconds': round(s['train_seconds'], 2), 'analogy': round(s['analogy']['accuracy'], 4), 'asked': s['analogy']['asked'], 'wordsim_spearman': round(s['similarity']['spearman'], 4)}))"
  $python scripts/gensim-skipgram.py "$corpus" --seed $seed --order runs/gcide-s$seed/checkpoint/vocab.txt
done
