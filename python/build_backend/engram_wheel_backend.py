"""PEP 517 backend of the engram wheel: meson-python, limited to the install tags it is given.

pyproject.toml passes `--tags=python-runtime` to `meson install`. Recent meson-python releases
put only the files of those tags into the wheel; 0.12 (Debian 12's python3-mesonpy) installs
by tag but still packs every file of meson's install plan, which here would add engramd, the
tools, the headers and the systemd units (and fail on the programs, which the wheel build does
not compile). This module applies the same filter to the install plan and retags the wheel
for any CPython 3 on any manylinux system with this machine's glibc or newer (build_wheel);
every other hook is meson-python's own.
"""

import base64
import hashlib
import os
import posixpath
import re
import subprocess
import sys
import tempfile
import zipfile

try:
    import mesonpy
except ImportError as e:
    raise ImportError(
        f"building the engram wheel needs meson-python, which {sys.executable} cannot import: "
        f"install python3-mesonpy (tools/setup.sh) and run pip from /usr/bin/python3 or from a "
        f"venv made with /usr/bin/python3 -m venv --system-site-packages") from e

_HOOKS = ("build_sdist", "build_editable", "get_requires_for_build_sdist",
          "get_requires_for_build_wheel", "get_requires_for_build_editable",
          "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable")
for _name in _HOOKS:
    if hasattr(mesonpy, _name):
        globals()[_name] = getattr(mesonpy, _name)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """meson-python's wheel, retagged py3-none-manylinux_<glibc>_<arch>.

    py3-none: the package reaches its libraries through ctypes and holds no extension module,
    so any CPython 3 on the platform can load it, while meson-python tags every wheel with
    files in platlib for the building interpreter only (cp311-cp311 on Debian 12).
    manylinux: meson-python 0.12 tags it linux_<arch>, which package indexes refuse; the
    bundled libraries load nothing from the system but the C and C++ runtimes (and the GPU
    runtime the process brings), which _manylinux_platform checks, so the wheel runs wherever
    glibc is at least the building machine's (PEP 600)."""
    name = mesonpy.build_wheel(wheel_directory, config_settings, metadata_directory)
    return _retag(os.path.join(wheel_directory, name))


_EXTENSION = re.compile(r"\.(cpython|abi3|pypy)[^/]*\.so$|\.pyd$")

# What a manylinux wheel may load from the system rather than carry (the libraries every
# PEP 600 platform provides: the C runtime, and the C++ runtime of the toolchain, whose GCC 12
# is no newer than any distribution with glibc 2.36 ships) and, as `auditwheel --exclude`
# would, the GPU driver and runtimes: the machine's driver and the process's torch provide
# them (bundle_libs.py leaves the same ones out).
_MANYLINUX_SYSTEM = re.compile(
    r"^(ld-linux[-.\w]*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libnsl|libstdc\+\+|"
    r"libgcc_s)\.so(\.\d+)*$")
_GPU_RUNTIME = re.compile(r"^(libcuda|libcudart|libnvidia-.*|libnvrtc|libamdhip64|"
                          r"libhsa-runtime64|libhiprtc|libdrm.*|libnuma)\.so(\..*)?$")


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _readelf(path, option):
    try:
        return subprocess.run(["readelf", option, "-W", path], check=True, capture_output=True,
                              text=True).stdout
    except FileNotFoundError as e:
        raise RuntimeError("tagging the engram wheel manylinux needs readelf (binutils)") from e


def _glibc_version():
    """(major, minor) of this machine's glibc, which the bundled libraries were linked with."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (ValueError, OSError, AttributeError):
        name, version = "", ""
    match = re.fullmatch(r"(\d+)\.(\d+)", version)
    if name != "glibc" or match is None:
        raise RuntimeError("the engram wheel can be tagged manylinux only on a glibc system, "
                           f"not on one whose C library says {name!r} {version!r}")
    return int(match.group(1)), int(match.group(2))


def _manylinux_platform(source, arch):
    """manylinux_<X>_<Y>_<arch> for the wheel in `source` (an open ZipFile): X.Y is this
    machine's glibc, after checking that every ELF file in the wheel needs only libraries the
    wheel carries or _MANYLINUX_SYSTEM/_GPU_RUNTIME allow, and no newer glibc symbol version."""
    glibc = _glibc_version()
    libs = [n for n in source.namelist() if re.search(r"\.so(\.\d+)*$", n)]
    carried = {posixpath.basename(n) for n in libs}
    with tempfile.TemporaryDirectory() as folder:
        for name in libs:
            path = os.path.join(folder, posixpath.basename(name))
            with open(path, "wb") as f:
                f.write(source.read(name))
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                                _readelf(path, "--dynamic"))
            foreign = [n for n in needed if n not in carried and
                       not _MANYLINUX_SYSTEM.match(n) and not _GPU_RUNTIME.match(n)]
            if foreign:
                raise RuntimeError(
                    f"the engram wheel cannot be tagged manylinux: {name} needs "
                    f"{', '.join(foreign)}, which the wheel does not carry and a manylinux "
                    f"system need not provide (python/build_backend/bundle_libs.py bundles "
                    f"what ldd finds)")
            versions = re.findall(r"Name: GLIBC_(\d+)\.(\d+)", _readelf(path, "--version-info"))
            newest = max(((int(a), int(b)) for a, b in versions), default=(0, 0))
            if newest > glibc:
                raise RuntimeError(
                    f"the engram wheel cannot be tagged manylinux_{glibc[0]}_{glibc[1]}: {name} "
                    f"needs GLIBC_{newest[0]}.{newest[1]}")
    return f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"


def _retag(path):
    directory, old_name = os.path.split(path)
    parts = old_name[:-len(".whl")].split("-")
    if len(parts) != 5 or not parts[4].startswith("linux_"):
        return old_name  # a name this does not know, or not a plain Linux platform tag
    with zipfile.ZipFile(path) as source:
        names = source.namelist()
        interpreter = parts[2:4]
        if not any(_EXTENSION.search(n) for n in names):
            interpreter = ["py3", "none"]
        platform = _manylinux_platform(source, parts[4][len("linux_"):])
        tag = "-".join(interpreter + [platform])
        new_name = "-".join(parts[:2] + [tag]) + ".whl"
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL"))
        wheel_file = f"{dist_info}/WHEEL"
        wheel_text = re.sub(r"(?m)^Tag: .*$", f"Tag: {tag}",
                            source.read(wheel_file).decode())
        record_file = f"{dist_info}/RECORD"
        record = [line for line in source.read(record_file).decode().splitlines()
                  if line and not line.startswith(wheel_file + ",")]
        record.append(f"{wheel_file},{_record_hash(wheel_text.encode())},"
                      f"{len(wheel_text.encode())}")
        with zipfile.ZipFile(os.path.join(directory, new_name), "w",
                             zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():  # keeps each file's mode and time
                if info.filename == wheel_file:
                    target.writestr(info, wheel_text)
                elif info.filename == record_file:
                    target.writestr(info, "\n".join(record) + "\n")
                else:
                    target.writestr(info, source.read(info))
    os.remove(path)
    return new_name


def _install_tags(install_args):
    """The tags of `--tags=a,b` / `--tags a,b` in meson install's arguments (None: all)."""
    tags = None
    args = list(install_args)
    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--tags="):
            value = arg.split("=", 1)[1]
        elif arg == "--tags" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            tags = (tags or set()) | {t.strip() for t in value.split(",") if t.strip()}
    return tags


def _filter_plan(plan, tags):
    return {kind: {path: details for path, details in files.items()
                   if details.get("tag") in tags}
            for kind, files in plan.items()}


_plan_property = getattr(getattr(mesonpy, "Project", None), "_install_plan", None)
if isinstance(_plan_property, property):
    # Filtering a plan that meson-python already filtered by the same tags changes nothing.
    def _tagged_install_plan(self):
        plan = _plan_property.fget(self)
        tags = _install_tags(getattr(self, "_meson_args", {}).get("install", ()))
        return plan if tags is None else _filter_plan(plan, tags)

    mesonpy.Project._install_plan = property(_tagged_install_plan)


_configure = getattr(getattr(mesonpy, "Project", None), "_configure", None)
if callable(_configure):
    # meson-python 0.12 asks for `meson setup --reconfigure` whenever a build folder is given
    # (config setting builddir), which fails on a folder meson never set up.
    def _configure_once(self, reconfigure=False):
        build_dir = getattr(self, "_build_dir", None)
        if reconfigure and build_dir is not None and \
                not (build_dir / "meson-private" / "coredata.dat").is_file():
            reconfigure = False
        return _configure(self, reconfigure=reconfigure)

    mesonpy.Project._configure = _configure_once
