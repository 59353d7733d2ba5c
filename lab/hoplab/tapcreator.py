"""Make the ns-3 wheel's TapBridge find its tap-creator helper.

The ``ns3`` wheel's ``libns3.44-tap-bridge.so`` has the build-tree path of
``ns3.44-tap-creator`` compiled in, and the helper's RUNPATH also points into
that build tree. Instead of patching binaries we install a small wrapper script
at exactly that path which runs the wheel's own helper with the wheel's
``lib64`` on the library path. Re-running is harmless.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .errors import LabError

_CREATOR_NAME = re.compile(rb"(/[\x21-\x7e]*/ns3\.[0-9.]+-tap-creator)\x00")


def wheel_dir() -> Path:
    """Directory of the installed ``ns3`` wheel (holds lib64/ and libexec/)."""
    import importlib.util

    spec = importlib.util.find_spec("ns3")
    if spec is None or not spec.submodule_search_locations:
        raise LabError("the ns3 package is not installed in this Python environment")
    return Path(list(spec.submodule_search_locations)[0])


def compiled_path(lib: Path) -> str:
    """The tap-creator path compiled into the tap-bridge library."""
    data = lib.read_bytes()
    m = _CREATOR_NAME.search(data)
    if m is None:
        raise LabError(f"no tap-creator path found in {lib}")
    return m.group(1).decode()


def wrapper_text(real: Path, libdir: Path) -> str:
    return (
        "#!/bin/sh\n"
        "# Installed by hoplab: runs the ns3 wheel's tap-creator with its libraries.\n"
        f'LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        "export LD_LIBRARY_PATH\n"
        f'exec "{real}" "$@"\n'
    )


def ensure() -> Path:
    """Install (or refresh) the wrapper; returns its path."""
    base = wheel_dir()
    libs = sorted((base / "lib64").glob("libns3*-tap-bridge.so"))
    reals = sorted((base / "libexec" / "ns3").glob("ns3*-tap-creator"))
    if not libs or not reals:
        raise LabError(f"tap-bridge library or tap-creator missing under {base}")
    target = Path(compiled_path(libs[0]))
    text = wrapper_text(reals[0], base / "lib64")
    if target.exists() and target.read_text(errors="replace") == text:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(tmp, target)
    real_mode = reals[0].stat().st_mode
    if not real_mode & stat.S_IXUSR:
        reals[0].chmod(real_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return target
