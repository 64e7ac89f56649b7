"""python -m engram [--socket PATH] [--json] [--version]: a health check for engine operators.

Prints the libengram_client it loaded (and its wire protocol), whether engramd answers on the
socket (with one empty round trip's time) and the tables it serves. Exit status: 0 when the
daemon answered, 1 when the client library cannot be loaded, 3 when no daemon answered
(as `engramctl status` and `systemctl status` use 3 for "not running"), 4 when the socket
refused this user. Needs no torch. `--version` prints the package's release and exits 0.
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from . import __version__, errors


def _check(socket: Optional[str]) -> Dict[str, Any]:
    from . import client as client_module
    report: Dict[str, Any] = {"package": __version__,
                              "package_dir": os.path.dirname(os.path.abspath(__file__))}
    try:
        report["library"] = client_module.library_path()
        report["protocol"] = "%d.%d" % client_module.protocol_version()
    except errors.LibraryNotFoundError as e:
        report["error"] = str(e)
        report["exit"] = 1
        return report
    path = socket or os.environ.get("ENGRAM_SOCKET") or client_module.DEFAULT_SOCKET
    report["socket"] = path
    try:
        with client_module.Client(path, timeout=5, client_name="python -m engram") as c:
            report["round_trip_us"] = round(c.nop(timeout=5) * 1e6, 1)
            report["session_id"] = c.stats().session_id
            report["tables"] = [t.__dict__ for t in c.tables()]
    except errors.EngramPermissionError as e:
        report.update(status="refused", error=str(e), exit=4)
        return report
    except errors.EngramError as e:
        report.update(status="not answering", error=str(e), exit=3)
        return report
    report.update(status="running", exit=0)
    return report


def _print(report: Dict[str, Any]) -> None:
    print(f"engram {report['package']} ({report['package_dir']})")
    if "library" not in report:
        print(f"library: not loaded: {report['error']}")
        return
    print(f"library: {report['library']} (protocol {report['protocol']})")
    if report["exit"] != 0:
        print(f"engramd at {report['socket']}: {report['status']}: {report['error']}")
        return
    print(f"engramd at {report['socket']}: running, session {report['session_id']}, "
          f"empty round trip {report['round_trip_us']} us")
    tables: List[Dict[str, Any]] = report["tables"]
    if not tables:
        print("tables: none")
    for t in tables:
        print(f"table {t['layer']}: {t['num_rows']} rows of {t['row_bytes']} B, serving rows "
              f"[{t['covered_begin']}, {t['covered_end']}), {t['layout']}, {t['files']} file(s), "
              f"{t['data_bytes'] / 2**30:.2f} GiB")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engram", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="engramd's socket (default: $ENGRAM_SOCKET, else "
                                         "/run/engramd/engramd.sock)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--version", action="version", version=f"engram {__version__}",
                        help="print the package's release and exit")
    args = parser.parse_args(argv)
    report = _check(args.socket)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return int(report["exit"])


if __name__ == "__main__":
    sys.exit(main())
