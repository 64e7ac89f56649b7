#!/usr/bin/env python3
# One install layout: the configuration file `meson install` puts in place, the one the unit's
# --config names and the one engramd reads without --config (its --help) are the same file for
# this build's prefix, and zsh completion lands in a directory zsh searches for that prefix.
# Reads meson's install plan (`meson introspect --installed`, what `meson install` copies).
# Usage: install_layout.py BUILD_DIR ENGRAMD
import json
import os
import re
import shutil
import subprocess
import sys

build_dir, engramd = sys.argv[1], sys.argv[2]
failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


def introspect(what):
    out = subprocess.run(["meson", "introspect", build_dir, what], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


prefix = next(o["value"] for o in introspect("--buildoptions") if o["name"] == "prefix")
installed = introspect("--installed")  # built or source file -> where it is installed


def destinations(suffix):
    return [dest for src, dest in installed.items() if src.endswith(suffix)]


units = [src for src in installed if src.endswith("/systemd/engramd.service")]
if len(units) != 1:
    sys.exit("FAIL: the install plan has %d engramd.service files" % len(units))
with open(units[0]) as f:
    exec_start = re.search(r"^ExecStart=(\S+) --config (\S+)", f.read(), re.M)
unit_config = exec_start.group(2)
tomls = destinations("/systemd/engramd.toml")
print("prefix %s: unit --config %s, engramd.toml installed as %s" % (prefix, unit_config, tomls))
if tomls != [unit_config]:
    fail("meson install puts engramd.toml at %s, the unit reads %s" % (tomls, unit_config))
if exec_start.group(1) != destinations("/daemon/engramd")[0]:
    fail("the unit runs %s, engramd is installed as %s" %
         (exec_start.group(1), destinations("/daemon/engramd")))

# engramd's compiled-in default, as its --help states it and as it acts on it.
help_text = subprocess.run([engramd, "--help"], check=True, capture_output=True,
                           text=True).stdout
default = re.search(r"--config PATH=(\S+)", help_text)
if not default:
    fail("engramd --help names no default configuration file:\n" + help_text)
elif default.group(1) != unit_config:
    fail("engramd reads %s without --config, the unit %s" % (default.group(1), unit_config))

# zsh completion: Debian's zsh (built for /usr) searches /usr/share/zsh/vendor-completions and
# /usr/local/share/zsh/site-functions; zsh built for another prefix searches its site-functions.
zsh = shutil.which("zsh")
if zsh and prefix in ("/usr", "/usr/local"):
    fpath = subprocess.run([zsh, "-f", "-c", "print -l $fpath"], check=True,
                           capture_output=True, text=True).stdout.split()
else:
    fpath = [os.path.join(prefix, "share/zsh/site-functions")]
for name in ("_engramctl", "_engramd"):
    for dest in destinations("/" + name):
        if os.path.dirname(dest) not in fpath:
            fail("%s is installed in %s, which zsh does not search (%s)" %
                 (name, os.path.dirname(dest), " ".join(fpath)))
    if not destinations("/" + name) and shutil.which("python3"):
        fail("no %s in the install plan" % name)

sys.exit(1 if failures else 0)
