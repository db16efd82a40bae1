#!/usr/bin/env python3
"""Markdown tables (one per data set) from run_bench.sh's JSONL: median [all] train wall seconds,
train CPU seconds, P@1/3/5, nDCG@5, predict ms/sample, peak RSS, mean load average.
--compact (tagging_race.sh): one table, a row per data set and tool: P@1/3/5 and train wall
seconds (medians when a tool ran more than once, runs counted), mean load average.

  python summarize.py [--compact] /tmp/peers/results.jsonl
"""
import json
import statistics
import sys
from collections import OrderedDict


def compact(groups):
    print("\n| data | tool | P@1 | P@3 | P@5 | train s | runs | load avg |")
    print("|---|---|---|---|---|---|---|---|")
    for ds, rows in groups.items():
        for (peer, feat), runs in rows.items():
            name = peer if feat == "raw" else f"{peer} ({feat})"
            res = [r["result"] for r in runs if r["result"]]
            if not res:
                print(f"| {ds} | {name} | failed (rc={[r['rc'] for r in runs]}) | | | | {len(runs)} | |")
                continue
            def med(k):
                v = [x.get(k) for x in res if x.get(k) is not None]
                return f"{statistics.median(v):.2f}" if v else "-"
            load = [float(x["loadavg"]) for x in res if x.get("loadavg") is not None]
            print(f"| {ds} | {name} | {med('p@1')} | {med('p@3')} | {med('p@5')} | {med('train_seconds')} | "
                  f"{len(res)}{'' if len(res) == len(runs) else f' (+{len(runs) - len(res)} failed)'} | "
                  f"{statistics.mean(load) if load else float('nan'):.1f} |")


def main(path, brief=False):
    groups = OrderedDict()
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        ds, peer, feat = r["tag"].split("/")
        groups.setdefault(ds, OrderedDict()).setdefault((peer, feat), []).append(r)
    if brief:
        return compact(groups)
    for ds, rows in groups.items():
        print(f"\n### {ds}\n")
        print("| peer | features | train s median [runs] | train CPU s median | P@1 (median, range if runs differ) | P@3 | P@5 | nDCG@5 | predict ms/sample | peak RSS MB | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for (peer, feat), runs in rows.items():
            res = [r["result"] for r in runs if r["result"]]
            if not res:
                print(f"| {peer} | {feat} | failed (rc={[r['rc'] for r in runs]}) |")
                continue
            ts = [x.get("train_s", x.get("train_seconds")) for x in res]
            cpu = [x.get("train_cpu_s", x.get("train_cpu_seconds", x.get("train_cpu_seconds_summed"))) for x in res]
            cpu = [c for c in cpu if c is not None]
            last = res[-1]
            rss = max(r["time_maxrss_kb"] or 0 for r in runs) / 1024
            load = statistics.mean(float(x["loadavg"]) for x in res if x.get("loadavg") is not None)
            tmed = statistics.median(ts)
            extra = ""
            if "extrapolated_total_train_seconds" in last:
                extra = f" (sample {last['labels_trained']} labels; extrapolated total {last['extrapolated_total_train_seconds']} s wall, {last['extrapolated_total_cpu_seconds']} CPU s)"
            pm = statistics.median(x["predict_ms_per_sample"] for x in res) if last.get("predict_ms_per_sample") is not None else None
            def f(k):
                v = [x[k] for x in res if x.get(k) is not None]
                if not v:
                    return "-"
                m = f"{statistics.median(v):.2f}"
                return m if max(v) - min(v) < 0.005 else f"{m} ({min(v):.2f}-{max(v):.2f})"
            print(f"| {peer} | {feat} | {tmed:.2f} [{', '.join(f'{t:.2f}' for t in ts)}]{extra} | "
                  f"{f'{statistics.median(cpu):.2f}' if cpu else '-'} | {f('p@1')} | {f('p@3')} | {f('p@5')} | {f('ndcg@5')} | "
                  f"{'-' if pm is None else f'{pm:.4f}'} | {rss:.0f} | {load:.1f} |")


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--compact"]
    main(argv[0] if argv else "/tmp/peers/results.jsonl", brief="--compact" in sys.argv[1:])
