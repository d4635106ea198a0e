"""``agl.LLM``: the endpoint an agent calls (base_url, model, api_key), routed to one rollout."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["LLM"]


class LLM(BaseModel):
    """An OpenAI-compatible endpoint for the policy model, as handed to an agent for one rollout.

    Give ``base_url``, ``model`` and ``api_key`` to any client or framework that accepts an
    OpenAI base URL; the calls land in the rollout (and agent) the URL names.

    >>> llm = LLM(base_url="http://127.0.0.1:8000/rollout/r1/v1", model="smollm2-135m")
    >>> llm.api_key
    'agl-no-key'
    >>> client = llm.openai_client()  # doctest: +SKIP
    """

    model_config = ConfigDict(frozen=True)

    base_url: str
    model: str
    api_key: str = "agl-no-key"
    rollout_id: str | None = None
    agent: str | None = None

    def openai_client(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client for this endpoint (needs the ``openai`` package)."""
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this endpoint."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)
