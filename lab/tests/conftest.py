"""Shared fixtures of the lab's tests."""

import os

import pytest

from hoplab import mediumserver


@pytest.fixture(scope="session")
def medium_server():
    """One ns-3 import for every emulation of the session (hoplab.mediumserver); emulated
    tests that do not request it spawn their own medium, as `hoplab run` does."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CI runs as root)")
    with mediumserver.serving(progress=print):
        yield os.environ.get(mediumserver.ENV)
