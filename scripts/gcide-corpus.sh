#!/bin/sh
# Writes the dict-gcide corpus (Debian package dict-gcide) as one lower-cased line per source
# line, words of [a-z'] only: about 5.4 M tokens, 46,914 words at min_count 5.
#   apt-get install dict-gcide && scripts/gcide-corpus.sh /tmp/gcide.txt
set -eu
# Byte-wise: in a UTF-8 locale sed leaves bytes of invalid sequences in place.
export LC_ALL=C
out=${1:?usage: gcide-corpus.sh OUT.txt}
zcat /usr/share/dictd/gcide.dict.dz | tr 'A-Z' 'a-z' | sed "s/[^a-z']/ /g; s/  */ /g; s/^ //; s/ \$//" \
  | grep -v '^$' > "$out"
wc -w "$out"
