# Sourced by the peer benchmark scripts: appends one finished run to $OUT_MD (the command and
# its JSON, for reading) and to $OUT_JSONL (one line, for summarize.py).
#
#   record TAG REP RC LOG UPTIME_BEFORE JSON CMD...
#
# LOG.time holds `/usr/bin/time -f '%e %M'`'s line (wall seconds, max RSS in KB); JSON is the
# run's result (empty: null). Prints `TAG rep REP rc=RC wall=...s` to stderr.
record() {
  local tag=$1 rep=$2 rc=$3 log=$4 up=$5 json=${6:-null}; shift 6
  local wall maxrss_kb
  read -r wall maxrss_kb < <(tail -1 "$log.time")
  {
    echo "### $tag rep $rep  (rc=$rc, $(date -u +%FT%TZ))"
    echo "uptime before: $up"
    echo '```'
    echo "$*"
    echo '```'
    echo '```json'
    echo "$json"
    echo '```'
    echo "process wall ${wall}s, max RSS ${maxrss_kb} KB (/usr/bin/time); uptime after: $(uptime)"
    echo
  } >> "$OUT_MD"
  printf '{"tag":"%s","rep":%s,"rc":%s,"proc_wall_s":%s,"time_maxrss_kb":%s,"uptime_before":"%s","result":%s}\n' \
    "$tag" "$rep" "$rc" "${wall:-null}" "${maxrss_kb:-null}" "$up" "$json" >> "$OUT_JSONL"
  echo "$tag rep $rep rc=$rc wall=${wall}s" >&2
}
