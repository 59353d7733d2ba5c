"""Shared fixtures of the lab's tests."""

import os
import time

import pytest

from hoplab import mediumserver
from hoplab.errors import LabError
from hoplab.run import run_spec


@pytest.fixture(scope="session")
def medium_server():
    """One ns-3 import for every emulation of the session (hoplab.mediumserver); emulated
    tests that do not request it spawn their own medium, as `hoplab run` does."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CI runs as root)")
    with mediumserver.serving(progress=print):
        yield os.environ.get(mediumserver.ENV)


@pytest.fixture
def run_waiting():
    """`run_waiting(spec, out)`: run a spec, waiting (up to 30 min) while another emulation
    holds the lab lock; emulated tests of different files may run at once."""
    def run(sp, out, timeout=1800):
        deadline = time.time() + timeout
        while True:
            try:
                return run_spec(sp, out, progress=lambda *_: None)
            except LabError as e:
                if "another emulation is running" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(5)
    return run
