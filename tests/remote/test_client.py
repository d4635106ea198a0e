"""RunnerClient's retries: bounded for a trainer that keeps failing, unbounded while it is away."""

from __future__ import annotations

import time

import httpx
import pytest

from agentlightning_lite.remote import RemoteError, RunnerClient


def scripted(*answers: int) -> tuple[httpx.MockTransport, list[str]]:
    """A transport answering each request with the next status (the last one repeats)."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if len(seen) >= 30:  # a client that never gives up fails the test instead of hanging it
            raise AssertionError(f"still retrying after {len(seen)} requests")
        status = answers[min(len(seen), len(answers) - 1)]
        seen.append(request.url.path)
        if status >= 400:
            return httpx.Response(
                status, json={"error": {"message": f"boom {status}", "code": "internal_error"}}
            )
        return httpx.Response(status, json={"queued": 0, "weights_version": 7})

    return httpx.MockTransport(handle), seen


def test_a_trainer_that_keeps_answering_500_gives_a_clear_error_after_bounded_retries() -> None:
    transport, seen = scripted(500)
    client = RunnerClient("http://trainer:1", transport=transport, server_error_retries=3, max_backoff=0.05)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as err:
        client.status()
    assert time.monotonic() - t0 < 5
    assert len(seen) == 4  # the first try and three retries
    assert err.value.status == 500 and err.value.code == "internal_error"
    assert "the trainer at http://trainer:1 failed GET /agl/v1/status 4 times in a row" in str(err.value)
    assert "boom 500" in str(err.value)
    client.close()


def test_a_passing_500_is_retried_and_the_answer_returned() -> None:
    transport, seen = scripted(500, 500, 200)
    client = RunnerClient("http://trainer:1", transport=transport, server_error_retries=3, max_backoff=0.05)
    assert client.status() == {"queued": 0, "weights_version": 7}
    assert len(seen) == 3 and client.reconnects == 1
    client.close()


def test_a_trainer_that_is_away_is_waited_for_beyond_the_server_error_budget() -> None:
    """503 (a proxy in front of a restarting trainer) is retried like a refused connection: here eight
    times, more than the three retries a failing trainer gets."""
    transport, seen = scripted(*([503] * 8), 200)
    client = RunnerClient("http://trainer:1", transport=transport, server_error_retries=3, max_backoff=0.05)
    assert client.status()["weights_version"] == 7 and len(seen) == 9
    client.close()


def test_a_4xx_is_not_retried_and_bad_settings_are_refused() -> None:
    transport, seen = scripted(403)
    client = RunnerClient("http://trainer:1", transport=transport)
    with pytest.raises(RemoteError, match="403: boom 403"):
        client.status()
    assert len(seen) == 1
    client.close()
    with pytest.raises(ValueError, match="server_error_retries must be >= 0"):
        RunnerClient("http://trainer:1", server_error_retries=-1)
