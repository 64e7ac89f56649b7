"""PEP 517 backend of the engram wheel: meson-python, limited to the install tags it is given.

pyproject.toml passes `--tags=python-runtime` to `meson install`. Recent meson-python releases
put only the files of those tags into the wheel; 0.12 (Debian 12's python3-mesonpy) installs
by tag but still packs every file of meson's install plan, which here would add engramd, the
tools, the headers and the systemd units (and fail on the programs, which the wheel build does
not compile). This module applies the same filter to the install plan and retags the wheel
for any CPython 3 (build_wheel); every other hook is meson-python's own.
"""

import base64
import hashlib
import os
import re
import sys
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
    """meson-python's wheel, retagged py3-none-<platform> when it holds no extension module:
    the package reaches its libraries through ctypes, so any CPython 3 on the platform can load
    it, while meson-python tags every wheel with files in platlib for the building
    interpreter only (cp311-cp311 on Debian 12)."""
    name = mesonpy.build_wheel(wheel_directory, config_settings, metadata_directory)
    return _retag_without_python_abi(os.path.join(wheel_directory, name))


_EXTENSION = re.compile(r"\.(cpython|abi3|pypy)[^/]*\.so$|\.pyd$")


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _retag_without_python_abi(path):
    directory, old_name = os.path.split(path)
    parts = old_name[:-len(".whl")].split("-")
    if len(parts) != 5 or parts[2] == "none":
        return old_name  # already interpreter-independent, or a name this does not know
    with zipfile.ZipFile(path) as source:
        names = source.namelist()
        if any(_EXTENSION.search(n) for n in names):
            return old_name
        platform = parts[4]
        tag = f"py3-none-{platform}"
        new_name = "-".join(parts[:2] + ["py3", "none", platform]) + ".whl"
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
