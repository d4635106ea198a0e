"""The PolicyServer's settings as one object: ``settings=ServingSettings(...)``, the keywords over it, the
checks, and a running server on 127.0.0.1 honouring them."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, ServingSettings
from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.settings import ServingOptions


def _engine() -> ScriptedEngine:
    return ScriptedEngine(["ok"], tokenizer="bytes")


def test_settings_and_keywords_give_the_same_server() -> None:
    by_settings = PolicyServer(_engine(), settings=ServingSettings(api_key="k", max_n=2, aliases=["a"]))
    by_keywords = PolicyServer(_engine(), api_key="k", max_n=2, aliases=["a"])
    assert by_settings.settings == by_keywords.settings
    assert by_settings.settings.aliases == ("a",) and "a" in by_settings.served_names
    assert (by_settings.api_key, by_settings.max_n) == ("k", 2)  # the old attributes read the settings
    assert agl.ServingSettings is ServingSettings


def test_keywords_apply_over_settings_which_stay_unchanged() -> None:
    base = ServingSettings(api_key="k", max_n=2, flush=True)
    server = PolicyServer(_engine(), settings=base, max_n=5, api_key=None)
    assert (server.settings.max_n, server.settings.api_key, server.settings.flush) == (5, None, True)
    assert base.max_n == 2 and base.api_key == "k"
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.max_n = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        server.max_n = 3  # type: ignore[misc]  # read-only: a new server takes new settings


def test_the_keyword_options_are_the_settings_fields() -> None:
    fields = {f.name for f in dataclasses.fields(ServingSettings)}
    assert set(typing.get_type_hints(ServingOptions)) == fields


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"loop": "trio"}, ValueError, "loop must be"),
        ({"truncated_sampling": "drop"}, ValueError, "truncated_sampling must be"),
        ({"port": 70000}, ValueError, "port must be an int from 0"),
        ({"port": "8000"}, ValueError, "port must be an int"),
        ({"max_n": 0}, ValueError, "max_n must be a positive int, got 0"),
        ({"default_max_tokens": -1}, ValueError, "default_max_tokens must be a positive int"),
        ({"aliases": "model-b"}, TypeError, "aliases must be a sequence of names"),
        ({"max_tokens": 5}, TypeError, r"unknown serving setting\(s\) \['max_tokens'\]"),
    ],
)
def test_bad_settings_name_their_cause(changes: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ServingSettings().replace(**changes)
    with pytest.raises(error, match=match):
        PolicyServer(_engine(), **changes)


def test_a_positional_third_argument_must_be_settings() -> None:
    with pytest.raises(TypeError, match="settings must be a ServingSettings, got str"):
        PolicyServer(_engine(), None, "127.0.0.1")  # type: ignore[arg-type]


def test_a_running_server_honours_its_settings() -> None:
    store = agl.MemoryStore()
    settings = ServingSettings(api_key="k", max_n=1, record_unrouted=False, model_name="policy")
    with PolicyServer(_engine(), store, settings=settings) as server:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        url = f"{server.base_url}/chat/completions"
        assert httpx.post(url, json=body, timeout=10).status_code == 401
        auth = {"Authorization": "Bearer k"}
        too_many = httpx.post(url, json={**body, "n": 2}, headers=auth, timeout=10)
        assert too_many.status_code == 400 and "n" in too_many.json()["error"]["message"]
        ok = httpx.post(url, json=body, headers=auth, timeout=10)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"
        assert ok.json()["model"] == "policy"
    assert store.rollouts() == []  # record_unrouted=False: nothing recorded
