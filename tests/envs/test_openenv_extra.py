"""Without the envs-openenv extra, agl.envs.OpenEnv and ``--env openenv:URL`` name the missing extra."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli._common import CLIError
from agentlightning_lite.cli.train import env_tasks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is not None,
    reason="openenv is installed: tests/envs/test_openenv.py runs",
)


def test_the_missing_extra_is_named() -> None:
    with pytest.raises(
        ImportError,
        match=r'OpenEnv needs the package openenv: pip install "agentlightning-lite\[envs-openenv\]"',
    ):
        agl.envs.OpenEnv("http://127.0.0.1:8000")
    options = dict(agent=None, data=None, val_data=None, val_limit=None, limit=None, env_size=2, seed=0)
    with pytest.raises(CLIError, match=r"--env openenv:http://127\.0\.0\.1:8000: .*envs-openenv"):
        env_tasks(argparse.Namespace(**options, env="openenv:http://127.0.0.1:8000"))
