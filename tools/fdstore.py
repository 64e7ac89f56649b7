"""A stand-in for systemd's service manager, for tests and benchmarks of the row cache kept
across restarts: a NOTIFY_SOCKET that keeps the fd engramd stores (FDSTORE=1, FDNAME=row-cache)
and drops it on FDSTOREREMOVE=1, and a start that passes it back as systemd does (fd 3,
LISTEN_FDS=1, LISTEN_FDNAMES=row-cache, LISTEN_PID of the engramd process)."""
import json
import os
import signal
import socket
import subprocess
import sys


class Failure(Exception):
    """What went wrong, with the daemon's log."""

    def __init__(self, msg, log=None):
        text = msg
        if log is not None and os.path.exists(log):
            text += "\n--- daemon log\n" + open(log).read()
        super().__init__(text)


class Manager:
    """A NOTIFY_SOCKET that keeps what a service stores, as systemd's fd store does."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.stored = None  # the fd stored as row-cache
        self.messages = []

    def drain(self, timeout=0.0):
        self.sock.settimeout(timeout)
        try:
            while True:
                msg, fds, _, _ = socket.recv_fds(self.sock, 4096, 4)
                text = msg.decode()
                self.messages.append(text)
                fields = dict(l.split("=", 1) for l in text.split("\n") if "=" in l)
                named = fields.get("FDNAME") == "row-cache"
                if fields.get("FDSTOREREMOVE") == "1" and named:
                    self.forget()
                if fields.get("FDSTORE") == "1" and named and fds:
                    if self.stored is not None and os.path.samestat(os.fstat(self.stored),
                                                                    os.fstat(fds[0])):
                        os.close(fds[0])  # systemd keeps one copy of the same file
                    else:
                        self.forget()
                        self.stored = fds[0]
                    fds = fds[1:]
                for fd in fds:
                    os.close(fd)
                self.sock.settimeout(0.0)
        except (BlockingIOError, socket.timeout):
            pass

    def forget(self):
        if self.stored is not None:
            os.close(self.stored)
        self.stored = None

    def saw(self, needle):
        return any(needle in m for m in self.messages)


class Daemon:
    """engramd serving `model` on `work`/engramd.sock under `manager`."""

    def __init__(self, engramd, engramctl, work, model, manager, args):
        self.engramd, self.engramctl = engramd, engramctl
        self.work, self.model, self.manager, self.args = work, model, manager, list(args)
        self.log = f"{work}/log"
        self.proc = None

    def start(self, pass_stored=False, extra=()):
        env = dict(os.environ, NOTIFY_SOCKET=self.manager.path)
        argv = [self.engramd, "--model", self.model, "--socket", f"{self.work}/engramd.sock",
                *self.args, *extra]
        pass_fds = ()
        if pass_stored:
            fd = self.manager.stored
            if fd is None:
                raise Failure("no row-cache fd in the store to pass")
            env.update(LISTEN_FDS="1", LISTEN_FDNAMES="row-cache", HANDOFF_FD=str(fd))
            argv = ["bash", "-c", 'exec 3>&"$HANDOFF_FD"; '
                    '[ "$HANDOFF_FD" = 3 ] || exec {HANDOFF_FD}>&-; '
                    'export LISTEN_PID=$$; unset HANDOFF_FD; exec "$@"', "engramd", *argv]
            pass_fds = (fd,)
        self.manager.messages.clear()
        out = open(self.log, "w")
        self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     pass_fds=pass_fds)
        for _ in range(1200):
            self.manager.drain(0.05)
            if self.manager.saw("READY=1"):
                return
            if self.proc.poll() is not None:
                raise Failure(f"engramd exited with {self.proc.returncode}", self.log)
        raise Failure("engramd never said READY=1", self.log)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=90) != 0:
            raise Failure(f"engramd exited with {self.proc.returncode} after SIGTERM", self.log)
        self.proc = None
        self.manager.drain(0.1)

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def logged(self):
        return open(self.log).read()

    def ctl(self, *args):
        r = subprocess.run([self.engramctl, *args, "--socket", f"{self.work}/engramd.sock"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise Failure(f"engramctl {' '.join(args)}: {r.stdout}{r.stderr}", self.log)
        return r.stdout

    def cache_counters(self):
        """(hits, misses, used_slots) of the row cache."""
        cache = json.loads(self.ctl("status", "--json"))["store"]["cache"]
        return cache["hits"], cache["misses"], cache["used_rows"]

    def gather(self, layer, ids, out):
        self.ctl("rows", str(layer), *map(str, ids), "--out", out)
        return open(out, "rb").read()
