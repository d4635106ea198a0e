"""Fixtures of the harness tests: whether network namespaces work here, and where the CLIs are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agentlightning_lite.harness import sandbox

#: where tests/harness/install_clis.sh installs the harness CLIs (AGL_HARNESS_DIR overrides it)
CLI_DIR = Path(os.environ.get("AGL_HARNESS_DIR", Path.home() / ".cache" / "agl-harness-clis"))

_ISOLATION = sandbox.isolation_available()


def needs_isolation() -> None:
    if _ISOLATION is not None:
        pytest.skip(f"no network namespace for the harness: {_ISOLATION}")


def cli(name: str) -> str:
    """The path of harness CLI ``name``: in ``$AGL_HARNESS_BIN``, the install folder, else on PATH
    (the test skips without it)."""
    for folder in (os.environ.get("AGL_HARNESS_BIN"), str(CLI_DIR / "node_modules" / ".bin")):
        if folder and (Path(folder) / name).exists():
            return str(Path(folder) / name)
    found = shutil.which(name)
    if found is None:
        pytest.skip(
            f"the {name} CLI is not installed: run tests/harness/install_clis.sh "
            f"(or set AGL_HARNESS_BIN to a folder holding it)"
        )
    return found
