"""PEP 517 backend of the engram wheel: meson-python, limited to the install tags it is given.

pyproject.toml passes `--tags=python-runtime` to `meson install`. Recent meson-python releases
put only the files of those tags into the wheel; 0.12 (Debian 12's python3-mesonpy) installs
by tag but still packs every file of meson's install plan, which here would add engramd, the
tools, the headers and the systemd units (and fail on the programs, which the wheel build does
not compile). This module applies the same filter to the install plan, then hands every hook
to meson-python unchanged.
"""

import sys

try:
    import mesonpy
except ImportError as e:
    raise ImportError(
        f"building the engram wheel needs meson-python, which {sys.executable} cannot import: "
        f"install python3-mesonpy (tools/setup.sh) and run pip from /usr/bin/python3 or from a "
        f"venv made with /usr/bin/python3 -m venv --system-site-packages") from e

_HOOKS = ("build_sdist", "build_wheel", "build_editable", "get_requires_for_build_sdist",
          "get_requires_for_build_wheel", "get_requires_for_build_editable",
          "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable")
for _name in _HOOKS:
    if hasattr(mesonpy, _name):
        globals()[_name] = getattr(mesonpy, _name)


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
