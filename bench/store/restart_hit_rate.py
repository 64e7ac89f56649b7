#!/usr/bin/env python3
"""The row cache's hit rate right after a restart under load, against the hit rate before it,
for up to three restarts side by side in one run on one cache-tier table (--restarts picks them):

  kept     the cache's memfd handed to the next engramd as systemd's file-descriptor store does
           (tools/fdstore.py plays the service manager);
  hot set  a start without it, warming the hot set written at stop (memory.hot_set_path);
  cold     a start without either (what every restart did before).

Load: one client gathering steps of --step zipf-distributed row ids (exponent --zipf) of layer 14
back to back through `engramctl rows`, the same id stream for every case. Hit rates are the row
cache's counters (rows hit / rows looked up): "before" over the last --before seconds of the
phase that ends in the restart, "after" over the first --after seconds and the first 10 s after
the restarted daemon says READY. Also the time from SIGTERM to READY.

Usage: restart_hit_rate.py ENGRAMD ENGRAMCTL ENGRAM_SYNTH [--rows N] [--cache-bytes B] ...
"""
import argparse
import bisect
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from fdstore import Daemon, Manager  # noqa: E402

LAYER = 14
RESTARTS = ("kept", "hot set", "cold")


class Load:
    """Zipf row ids over the table, one step at a time, the same stream for every case."""

    def __init__(self, rows, exponent, step, seed):
        weights = [1.0 / (i + 1) ** exponent for i in range(rows)]
        total = sum(weights)
        self.cdf = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cdf.append(acc)
        # Popularity is spread over the table: rank r is row perm[r].
        self.perm = list(range(rows))
        random.Random(seed).shuffle(self.perm)
        self.rng = random.Random(seed + 1)
        self.step = step

    def ids(self):
        out = set()
        while len(out) < self.step:
            r = bisect.bisect_left(self.cdf, self.rng.random())
            out.add(self.perm[min(r, len(self.perm) - 1)])
        return sorted(out)


def run_for(d, load, seconds, out):
    """Gathers steps for `seconds`; the (hits, misses) counter samples at each second."""
    samples = []
    start = time.time()
    next_sample = start
    while True:
        now = time.time()
        if now >= next_sample:
            h, m, _ = d.cache_counters()
            samples.append((now - start, h, m))
            next_sample += 1.0
        if now - start >= seconds:
            return samples
        d.ctl("rows", str(LAYER), *map(str, load.ids()), "--out", out)


def rate(samples, t0, t1):
    """Hit rate between the samples nearest t0 and t1 (seconds into the phase)."""
    a = min(samples, key=lambda s: abs(s[0] - t0))
    b = min(samples, key=lambda s: abs(s[0] - t1))
    hits, misses = b[1] - a[1], b[2] - a[2]
    return hits / (hits + misses) if hits + misses else float("nan"), hits + misses


def restart(d, how, hot):
    t = time.time()
    d.stop()
    if how == "kept":
        d.start(pass_stored=True)
    else:
        d.manager.forget()
        if how == "cold" and os.path.exists(hot):
            os.unlink(hot)
        d.start()  # "cold": the hot set was removed, nothing to warm
    return time.time() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engramd")
    ap.add_argument("engramctl")
    ap.add_argument("synth")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cache-bytes", default="16M")
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--step", type=int, default=512)
    ap.add_argument("--warm", type=float, default=60, help="seconds of load before the first restart")
    ap.add_argument("--before", type=float, default=20)
    ap.add_argument("--after", type=float, default=60)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--restarts", default="kept,hot set,cold",
                    help="which restarts to run, in order, comma-separated (kept, hot set, cold)")
    a = ap.parse_args()
    a.restarts = [r.strip() for r in a.restarts.split(",") if r.strip()]
    unknown = [r for r in a.restarts if r not in RESTARTS]
    if unknown or not a.restarts:
        ap.error(f"--restarts: {', '.join(unknown) or 'none given'}: each must be one of "
                 f"{', '.join(RESTARTS)}")
    work = tempfile.mkdtemp(prefix="engram-restart-", dir=a.dir)
    try:
        bench(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench(a, work):
    model = f"{work}/model"
    subprocess.run([a.synth, model, "--rows", str(a.rows), "--seed", "9", "-q"], check=True)
    hot = f"{work}/hot-set"
    manager = Manager(f"{work}/notify")
    args = ["--tier", f"{LAYER}=cache", "--cache-bytes", a.cache_bytes, "--log-level", "info",
            "--hot-set-path", hot]
    d = Daemon(a.engramd, a.engramctl, work, model, manager, args)
    print("# restart_hit_rate")
    print(f"machine: {os.cpu_count()} online CPUs, {os.uname().release}")
    print(f"table: synthetic checkpoint, layer {LAYER} of {a.rows} rows, cache tier, "
          f"memory.cache {a.cache_bytes}; load: one client, steps of {a.step} zipf({a.zipf}) ids "
          f"back to back through engramctl rows")
    print(f"before: the last {a.before:.0f} s of the phase ending in the restart; after: the "
          f"first 10 s and {a.after:.0f} s from READY")
    print()
    load = Load(a.rows, a.zipf, a.step, seed=11)
    out = f"{work}/rows"
    d.start()
    try:
        phase = run_for(d, load, a.warm, out)
        rows = []
        for how in a.restarts:
            before, n_before = rate(phase, phase[-1][0] - a.before, phase[-1][0])
            used_before = d.cache_counters()[2]
            seconds = restart(d, how, hot)
            used_after = d.cache_counters()[2]
            phase = run_for(d, load, a.after, out)
            first10, _ = rate(phase, 0, 10)
            after, n_after = rate(phase, 0, a.after)
            rows.append((how, before, first10, after, seconds, used_before, used_after,
                         n_before, n_after))
        print("| restart | hit rate before | first 10 s | first "
              f"{a.after:.0f} s | after / before | SIGTERM to READY s | cached rows before | "
              "cached rows at READY | rows looked up before / after |")
        print("|---|---|---|---|---|---|---|---|---|")
        for how, before, first10, after, seconds, ub, ua, nb, na in rows:
            print(f"| {how} | {before:.3f} | {first10:.3f} | {after:.3f} | {after / before:.2f} | "
                  f"{seconds:.2f} | {ub} | {ua} | {nb} / {na} |")
        d.stop()
    finally:
        d.kill()


if __name__ == "__main__":
    main()
