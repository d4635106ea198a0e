"""Fixtures for the Tinker API tests: one server per module over the tiny SmolLM2-tokenizer model
(real HTTP on 127.0.0.1, real peft training), and a plain HTTP client of its ``/api/v1`` routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")
httpx = pytest.importorskip("httpx")

from agentlightning_lite.tinker import TinkerServer, build_backend  # noqa: E402


@pytest.fixture(scope="module")
def tinker_server(tiny_smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    """A Tinker server over the tiny model, answering ``try_again`` after 0.5 s of long-poll."""
    backend = build_backend(str(tiny_smol), num_threads=1, seed=0)
    server = TinkerServer(backend, tmp_path_factory.mktemp("tinker-out"), poll_s=0.5).start()
    yield server
    server.close()


class Api:
    """JSON calls to ``/api/v1``: ``api.post("create_session", {})``; ``api.result(future)`` polls."""

    def __init__(self, server: TinkerServer) -> None:
        self.server = server
        self.http = httpx.Client(base_url=f"{server.url}/api/v1", timeout=60)

    def post(self, route: str, body: Any = None, **kw: Any) -> Any:
        return self.http.post(f"/{route}", json=body, **kw)

    def result(self, future: dict[str, Any], timeout: float = 60.0, **kw: Any) -> Any:
        """Poll ``/retrieve_future`` until the outcome is there (the JSON, or the raw response with
        ``headers=``)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.http.post("/retrieve_future", json={"request_id": future["request_id"]}, **kw)
            assert r.status_code == 200, r.text
            if (
                r.headers["content-type"].startswith("application/json")
                and r.json().get("type") == "try_again"
            ):
                continue
            return r if kw else r.json()
        raise AssertionError(f"{future} did not finish in {timeout} s")

    def session(self) -> str:
        return str(self.post("create_session", {"tags": []}).json()["session_id"])

    def model(self, session: str, seq: int = 0, rank: int = 4) -> str:
        base = self.server.backend.base_model_names()[0]
        body = {"session_id": session, "model_seq_id": seq, "base_model": base, "lora_config": {"rank": rank}}
        future = self.post("create_model", body).json()
        assert self.result(future) == {"type": "create_model", "model_id": future["model_id"]}
        return str(future["model_id"])


@pytest.fixture
def api(tinker_server: TinkerServer) -> Iterator[Api]:
    client = Api(tinker_server)
    yield client
    client.http.close()
