"""Reuse one ns-3 import across runs.

Importing ns-3's Python bindings and compiling the medium's C++ helpers takes
~20 s of CPU, more than many runs' flows. A series of runs (``hoplab reproduce``,
the lab's tests) starts one medium server (``python -m hoplab.medium --serve``)
that loads ns-3 once and forks a fresh medium per run from the loaded state.
Each forked medium runs its configuration exactly as a spawned one does; only
the start-up is shared. Without a server, the lab spawns a medium per run.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ENV = "HOPLAB_MEDIUM_SERVER"
LOAD_TIMEOUT_S = 180.0


def rt_prefix() -> list[str]:
    """SCHED_FIFO for the medium (and what it forks): keeps real time under CPU load."""
    return ["chrt", "-f", "10"] if shutil.which("chrt") else []


class ForkedMedium:
    """A medium forked by the server, with the parts of Popen the lab uses.

    The medium is the server's child, so its exit status stays with the server:
    ``returncode`` is 0 once it has exited (the lab reads the medium's own
    output file and log, not its status)."""

    def __init__(self, pid: int, pidfd: int, stdin):
        self.pid = pid
        self._pidfd: int | None = pidfd
        self.stdin = stdin
        self.returncode: int | None = None

    def _exited(self, timeout: float) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], max(0.0, timeout))
        if ready:
            os.close(self._pidfd)
            self._pidfd = None
            self.returncode = 0
            return True
        return False

    def poll(self) -> int | None:
        self._exited(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(1e9 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(f"medium {self.pid}", timeout)
        return 0

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def __del__(self):
        if self._pidfd is not None:
            os.close(self._pidfd)


def fork_medium(config: Path, log: Path) -> ForkedMedium | None:
    """Ask the running server (if any) for a medium; None means: spawn one instead."""
    path = os.environ.get(ENV)
    if not path:
        return None
    r, w = os.pipe()
    logfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30.0)
            s.connect(path)
            socket.send_fds(s, [str(config).encode()], [r, logfd, logfd])
            msg, fds, _, _ = socket.recv_fds(s, 64, 1)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError("the medium server did not return a process")
        medium = ForkedMedium(int(msg.decode()), fds[0], os.fdopen(w, "wb"))
        w = -1
        return medium
    except (OSError, ValueError):
        return None
    finally:
        os.close(r)
        os.close(logfd)
        if w >= 0:
            os.close(w)


@contextlib.contextmanager
def serving(progress=print):
    """Run a medium server for the duration of the block (root only; a server that
    is already named in the environment is reused). On any failure to start, runs
    fall back to spawning their own medium."""
    if os.environ.get(ENV) or os.geteuid() != 0:
        yield
        return
    sock = f"/run/hoplab-medium-{os.getpid()}.sock"
    cmd = rt_prefix() + [sys.executable, "-m", "hoplab.medium", "--serve", sock]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    # ns-3's bindings print a few diagnostics while loading; the server's own line ends the wait.
    deadline = time.time() + LOAD_TIMEOUT_S
    line = ""
    while "listening" not in line:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
        line = proc.stdout.readline() if ready else ""
        if not line:
            break
    if "listening" not in line:
        progress(f"medium server did not start ({line.strip() or 'no answer'}); each run loads ns-3 itself")
        proc.kill()
        proc.wait()
        yield
        return
    os.environ[ENV] = sock
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        Path(sock).unlink(missing_ok=True)
