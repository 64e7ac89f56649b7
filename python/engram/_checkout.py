"""The release of a source checkout's engram package, read from the checkout's meson.build (the
one place it is written), for a package imported from the source tree rather than installed."""

import pathlib
import re

_PROJECT_VERSION = re.compile(r"\bproject\s*\((?:[^()]|\([^()]*\))*?\bversion\s*:\s*'([^']+)'")


def checkout_version() -> str:
    """meson.build's project version; ImportError when the package lies outside a checkout
    (copied without meson's engram/_version.py) or meson.build states none."""
    meson_build = pathlib.Path(__file__).resolve().parents[2] / "meson.build"
    try:
        match = _PROJECT_VERSION.search(meson_build.read_text())
    except OSError as e:
        raise ImportError(f"engram has no _version.py (meson writes it when installing the "
                          f"package) and {meson_build} cannot be read: {e}") from e
    if match is None:
        raise ImportError(f"engram has no _version.py and {meson_build} states no project "
                          f"version")
    return match.group(1)
