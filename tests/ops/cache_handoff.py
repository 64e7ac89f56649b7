#!/usr/bin/env python3
"""The row cache kept across a restart, as systemd's file-descriptor store does it, without
systemd: this test is the service manager (tools/fdstore.py). It listens on a NOTIFY_SOCKET, takes the
memfd that engramd stores there (FDSTORE=1, FDNAME=row-cache), stops engramd and starts the next
one with the memfd passed as systemd passes it (fd 3, LISTEN_FDS=1, LISTEN_FDNAMES=row-cache,
LISTEN_PID).

Checked: the rows gathered before the restart hit right after it (the row cache's hit counter
rises by exactly their number, no miss) and are byte-exact; a table file touched between the two
runs (other tables) and a region with a garbage header are discarded with a log line naming why,
the daemon starts with an empty cache and still serves exact rows, and it asks the store to drop
the old region (FDSTOREREMOVE=1); 1 % of the cached rows rewritten in place with the file's times
put back keep the identity, are found by the row-by-row comparison at adoption and dropped, and
every row served is the file's; a start without the memfd warms the hot set written at the last
stop in the background until every one of its rows hits.

Usage: cache_handoff.py ENGRAMD ENGRAMCTL ENGRAM_SYNTH ENGRAM_INSPECT
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from fdstore import Daemon, Failure, Manager  # noqa: E402

LAYER = 14
ROWS = 20000


def check(ok, msg, d=None):
    if not ok:
        raise Failure(msg, d.log if d is not None else None)


def rewrite_in_place(d, model, rows):
    """Overwrites `rows` of layer LAYER in their files (same offsets, inode and size) and puts
    each file's access and modification times back; returns the rows."""
    geometry = json.loads(subprocess.run([d.inspect, model, "--layer", str(LAYER), "--json"],
                                         check=True, capture_output=True, text=True).stdout)
    table = geometry["tables"][0] if "tables" in geometry else geometry[0]
    times = {}
    rng = random.Random(11)
    for part in table["parts"]:
        path = part["file"]
        if path not in times:
            st = os.stat(path)
            times[path] = (st.st_atime_ns, st.st_mtime_ns)
        check(part["rows_per_page"] == 0, f"{path}: a paged part; this test writes flat ones")
        fd = os.open(path, os.O_WRONLY)
        try:
            for row in rows:
                at = part["base"] + (row - part["base_row"]) * part["row_bytes"]
                os.pwrite(fd, rng.randbytes(part["row_bytes"]), at)
            os.fsync(fd)
        finally:
            os.close(fd)
    for path, (atime, mtime) in times.items():
        os.utime(path, ns=(atime, mtime))
    return rows


def run(engramd, engramctl, synth, inspect, work):
    model = f"{work}/model"
    subprocess.run([synth, model, "--rows", str(ROWS), "--seed", "5", "-q"], check=True)
    manager = Manager(f"{work}/notify")
    d = Daemon(engramd, engramctl, work, model, manager,
               ["--tier", f"{LAYER}=cache", "--cache-bytes", "64M", "--log-level", "info"])
    d.inspect = inspect
    ids = random.Random(7).sample(range(ROWS), 3000)
    n = len(ids)
    try:
        checks(d, manager, model, work, ids, n)
    finally:
        d.kill()


def checks(d, manager, model, work, ids, n):

    # 1. Fill the cache, see it hit, stop.
    d.start()
    check(manager.stored is not None,
          "engramd did not store the row cache's memfd (FDSTORE=1, FDNAME=row-cache)", d)
    truth = d.gather(LAYER, ids, f"{work}/first")
    d.gather(LAYER, ids, f"{work}/warm")
    hits0, _, used0 = d.cache_counters()
    check(used0 >= n and hits0 >= n,
          f"the cache holds {used0} rows and hit {hits0} times before the restart", d)
    d.stop()
    check(manager.stored is not None, "the stored memfd was dropped at stop", d)

    # 2. Restart with the memfd passed: every row hits at once, byte-exact.
    d.start(pass_stored=True)
    check("row cache: adopted the region handed over" in d.logged(),
          "engramd did not adopt the region passed as row-cache", d)
    hits, misses, used = d.cache_counters()
    check(used == used0 and hits == 0 and misses == 0,
          f"after adoption: {used} rows (before: {used0}), {hits} hits, {misses} misses", d)
    after = d.gather(LAYER, ids, f"{work}/after")
    hits, misses, _ = d.cache_counters()
    check(after == truth, "rows served from the adopted cache differ from those served before", d)
    check(hits == n and misses == 0,
          f"right after the restart: {hits} hits and {misses} misses of {n} rows", d)
    print(f"adopted: {used} rows kept; hit rate right after the restart {hits}/{n} "
          f"(before: {n}/{n}), bytes exact")
    d.stop()

    # 2b. 1 % of the cached rows rewritten in place, the file's times put back (cp -p, rsync -t,
    # tar): the identity is unchanged and the region adopted, but every row is compared with its
    # file and those rows are dropped; every row served is the file's now.
    rewritten = rewrite_in_place(d, model, ids[::100])
    d.start(pass_stored=True)
    text = d.logged()
    check("row cache: adopted the region handed over" in text,
          "a region whose files kept their identity was not adopted", d)
    found = (f"{n} rows compared with the table files" in text and
             f"{len(rewritten)} differed and were dropped" in text and
             f"{len(rewritten)} rows of layer {LAYER}" in text and
             "differ from the table file" in text)
    check(found, f"the {len(rewritten)} rows rewritten in place were not found and dropped", d)
    served = d.gather(LAYER, ids, f"{work}/rewritten")
    hits, misses, _ = d.cache_counters()
    check(hits == n - len(rewritten) and misses == len(rewritten),
          f"after an in-place rewrite: {hits} hits and {misses} misses of {n} rows", d)
    d.stop()
    manager.forget()  # a cold start: rows straight from the files (its region goes on below)
    d.start()
    truth = d.gather(LAYER, ids, f"{work}/from-files")
    d.stop()
    check(served == truth, "rows served after an in-place rewrite differ from the files", d)
    check(served != after, "the in-place rewrite changed no row served", d)
    print(f"rewritten in place, mtime put back: {len(rewritten)} rows dropped, the rest kept; "
          "bytes are the files'")

    # 3. A table file touched between the runs: other tables, the region is discarded.
    table_file = next(os.path.join(model, f) for f in sorted(os.listdir(model))
                      if os.path.isfile(os.path.join(model, f)) and
                      os.path.getsize(os.path.join(model, f)) > 1 << 20)
    st = os.stat(table_file)
    os.utime(table_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    d.start(pass_stored=True)
    text = d.logged()
    check("discarded the region handed over" in text and "other tables" in text,
          "a region of other tables was not discarded with its reason", d)
    check(manager.saw("FDSTOREREMOVE=1"),
          "engramd did not ask the store to drop the discarded region", d)
    check(d.cache_counters()[2] == 0, "the cache does not start empty after a discard", d)
    check(d.gather(LAYER, ids, f"{work}/fresh") == truth, "rows differ after a discarded region", d)
    print("tables changed: the region was discarded with its reason, the cache started empty")
    d.stop()

    # 4. Garbage in the region's header: refused, never served.
    os.pwrite(manager.stored, random.Random(3).randbytes(64), 0)
    d.start(pass_stored=True)
    text = d.logged()
    check("discarded the region handed over" in text and "bad header" in text,
          "a region with a garbage header was not discarded with its reason", d)
    check(d.gather(LAYER, ids, f"{work}/garbage") == truth, "rows differ after a garbage region", d)
    print("garbage header: the region was discarded with its reason")
    d.stop()

    # 5. A cold start (no memfd passed) warms the hot set written at the last stop.
    hot = f"{work}/hot-set"
    manager.forget()
    d.start(extra=("--hot-set-path", hot))
    d.gather(LAYER, ids, f"{work}/hot1")
    d.gather(LAYER, ids, f"{work}/hot2")
    d.stop()
    check("hot set of the row cache written at stop" in d.logged(), "no hot set written at stop", d)
    manager.forget()
    d.start(extra=("--hot-set-path", hot))
    deadline = time.time() + 60
    used = 0
    while time.time() < deadline:
        used = d.cache_counters()[2]
        if used >= n:
            break
        time.sleep(0.2)
    check("warming" in d.logged() and used >= n,
          f"the background warm filled {used} of the {n} hot rows", d)
    hits0, misses0, _ = d.cache_counters()
    check(d.gather(LAYER, ids, f"{work}/hot3") == truth, "rows differ after the warm", d)
    hits, misses, _ = d.cache_counters()
    check(hits - hits0 == n and misses == misses0,
          f"after the warm: {hits - hits0} hits, {misses - misses0} misses of {n}", d)
    print(f"cold start: the background warm filled the {n} hot rows; all hit, bytes exact")
    d.stop()


def main():
    engramd, engramctl, synth, inspect = sys.argv[1:5]
    work = tempfile.mkdtemp(prefix="engram-handoff-")
    try:
        run(engramd, engramctl, synth, inspect, work)
    except Failure as e:
        print("FAIL:", e)
        sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
