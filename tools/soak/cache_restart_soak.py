#!/usr/bin/env python3
"""The row cache under a long checked load, across restarts that keep it: engram-soak's
byte-checked gathers against a synthetic checkpoint with layer 14 resident and layer 1 in a row
cache small enough to evict all the time, while engramd is stopped and started RESTARTS times,
each time handing the cache over as systemd's fd store would (tools/fdstore.py), so that the
next engramd adopts it and proves every kept row against the table files under load.

Usage: cache_restart_soak.py BUILD_DIR [--seconds S] [--restarts N] [--rows R] [--work DIR]
Prints engram-soak's progress and report, and per restart the adoption line engramd logged.
Exit status: engram-soak's (0: every row right, no error), or 1 if a restart failed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fdstore  # noqa: E402  (tools/, beside this folder)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--work", default="/var/tmp/engram-cache-restart-soak")
    a = p.parse_args()
    b = os.path.abspath(a.build_dir)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    model = os.path.join(a.work, "model")
    seed = "7"
    subprocess.run([f"{b}/tools/tables/engram-synth", model, "--rows", str(a.rows),
                    "--seed", seed, "-q"], check=True)
    manager = fdstore.Manager(os.path.join(a.work, "notify.sock"))
    # An 80 MiB cache holds about a fifth of layer 1's rows: eviction runs all the time.
    daemon = fdstore.Daemon(f"{b}/daemon/engramd", f"{b}/tools/engramctl/engramctl", a.work,
                            model, manager,
                            ["--tier", "14=resident", "--tier", "1=cache", "--cache-bytes",
                             "80M", "--memory-budget", "400M"])
    daemon.start()
    soak = subprocess.Popen([f"{b}/tools/soak/engram-soak", "--socket",
                             os.path.join(a.work, "engramd.sock"), "--seed", seed, "--rows",
                             str(a.rows), "--clients", "2", "--seconds", str(a.seconds),
                             "--report-every", "60"])
    t0 = time.monotonic()
    try:
        for k in range(1, a.restarts + 1):
            while time.monotonic() - t0 < k * a.seconds / (a.restarts + 1):
                time.sleep(1)
                manager.drain(0)  # what engramd told its "service manager" meanwhile
            hits, misses, used = daemon.cache_counters()
            daemon.stop()
            started = time.monotonic()
            daemon.start(pass_stored=True)
            print(f"restart {k} at {time.monotonic() - t0:.0f} s: {used} rows cached before, "
                  f"started again in {time.monotonic() - started:.1f} s", flush=True)
            for line in daemon.logged().splitlines():
                if "adopted the region" in line:
                    print("  " + line, flush=True)
    except fdstore.Failure as e:
        print(f"restart failed: {e}", file=sys.stderr)
        soak.kill()
        daemon.kill()
        return 1
    rc = soak.wait()
    hits, misses, used = daemon.cache_counters()
    print(f"row cache at the end: {hits} hits, {misses} misses, {used} rows", flush=True)
    daemon.stop()
    return rc


if __name__ == "__main__":
    sys.exit(main())
