"""``agl.LLM``: the endpoint an agent calls (base_url, model, api_key), routed to one rollout."""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from .._compat import build_sdk_types

__all__ = ["LLM"]


class LLM(BaseModel):
    """An OpenAI-compatible endpoint for the policy model, as handed to an agent for one rollout.

    Give ``base_url``, ``model`` and ``api_key`` to any client or framework that accepts an
    OpenAI base URL (Chat Completions or Responses API), or ``anthropic_base_url`` to an Anthropic
    client (Messages API); the calls land in the rollout (and agent) the URL names.

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
    #: a key valid for this rollout's model calls only (``PolicyServer.rollout_key``), when the
    #: server has a key; what a program launched for the rollout is given (``agl.CommandAgent``)
    rollout_key: str | None = None
    #: the rollout's time limit in seconds (the trainer's ``RolloutConfig.timeout_s``), when it has one:
    #: the clients made here (:meth:`openai_client`, :meth:`anthropic_client`...) wait this long for a
    #: reply unless told otherwise, instead of their SDK's own default (600 s for OpenAI's), which a
    #: loaded CPU queueing a whole step's requests can outlast while the rollout itself still has time
    timeout: float | None = None

    def for_agent(self, agent: str) -> LLM:
        """The same endpoint for one agent of a multi-agent system: its calls are recorded with
        ``agent`` and, when the server's engine has an adapter per agent, served by that agent's.

        >>> llm = LLM(base_url="http://127.0.0.1:8000/rollout/r1/v1", model="smollm2-135m", rollout_id="r1")
        >>> writer = llm.for_agent("writer")
        >>> writer.base_url, writer.agent
        ('http://127.0.0.1:8000/rollout/r1/agent/writer/v1', 'writer')
        >>> LLM(base_url="http://127.0.0.1:8000/v1", model="smollm2-135m").for_agent("writer").model
        'smollm2-135m@writer'
        """
        if not agent:
            raise ValueError("for_agent needs an agent name")
        base = self.base_url.rstrip("/")
        model = (
            self.model.rpartition("@")[0]
            if self.agent and self.model.endswith(f"@{self.agent}")
            else self.model
        )
        if base.endswith("/v1") and "/rollout/" in base and "/" not in agent:
            root = base[: -len("/v1")]
            if "/agent/" in root:
                root = root[: root.rindex("/agent/")]
            return self.model_copy(
                update={"base_url": f"{root}/agent/{quote(agent, safe='')}/v1", "agent": agent}
            )
        return self.model_copy(update={"model": f"{model}@{agent}", "agent": agent})

    def prompt(self, name: str, default: str | None = None) -> str:
        """The text of prompt ``name`` for this rollout and agent:
        ``agl.prompt(name, default, agent=self.agent)`` (the candidate ``agl.APO`` is evaluating, the
        trainer's fixed prompts, or ``default``).

        >>> llm = LLM(base_url="http://127.0.0.1:8000/v1", model="m")
        >>> llm.for_agent("writer").prompt("system", "Be brief.")
        'Be brief.'
        """
        from ..prompts import prompt

        return prompt(name, default, agent=self.agent)

    def openai_client(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client for this endpoint (needs the ``openai`` package).

        Clients made here share one TLS context, so making one per rollout costs well under a
        millisecond (instead of the ~20 ms of loading the CA certificates each time). The SDK's
        response types are built first, once per process (see ``agentlightning_lite._compat``), so
        that clients made in many threads at once parse their first replies safely.
        """
        from openai import DefaultHttpxClient, OpenAI

        build_sdk_types("openai")

        if "http_client" not in kwargs:
            kwargs["http_client"] = DefaultHttpxClient(verify=_tls_context())
        if self.timeout is not None:
            kwargs.setdefault("timeout", self.timeout)
        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client for this endpoint (sharing one TLS context, as above)."""
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        build_sdk_types("openai")

        if "http_client" not in kwargs:
            kwargs["http_client"] = DefaultAsyncHttpxClient(verify=_tls_context())
        if self.timeout is not None:
            kwargs.setdefault("timeout", self.timeout)
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    @property
    def anthropic_base_url(self) -> str:
        """The base URL for Anthropic clients, which add ``/v1/messages`` themselves: ``base_url``
        without its ``/v1``.

        >>> LLM(base_url="http://127.0.0.1:8000/rollout/r1/v1", model="m").anthropic_base_url
        'http://127.0.0.1:8000/rollout/r1'
        """
        base = self.base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base

    def anthropic_client(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` client for this endpoint (needs the ``anthropic`` package): its
        Messages API calls (``client.messages.create(model=llm.model, ...)``) land in this rollout
        like the OpenAI client's, one ``llm`` span each with exact tokens."""
        from anthropic import Anthropic, DefaultHttpxClient

        build_sdk_types("anthropic")

        if "http_client" not in kwargs:
            kwargs["http_client"] = DefaultHttpxClient(verify=_tls_context())
        if self.timeout is not None:
            kwargs.setdefault("timeout", self.timeout)
        return Anthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)

    def async_anthropic_client(self, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` client for this endpoint (sharing one TLS context, as above)."""
        from anthropic import AsyncAnthropic, DefaultAsyncHttpxClient

        build_sdk_types("anthropic")

        if "http_client" not in kwargs:
            kwargs["http_client"] = DefaultAsyncHttpxClient(verify=_tls_context())
        if self.timeout is not None:
            kwargs.setdefault("timeout", self.timeout)
        return AsyncAnthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)


@functools.lru_cache(maxsize=1)
def _tls_context() -> Any:
    """The default, verifying TLS context (CA certificates loaded once per process)."""
    import os
    import ssl

    cafile = os.environ.get("SSL_CERT_FILE")
    if cafile is None:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:  # pragma: no cover - certifi comes with httpx
            pass
    return ssl.create_default_context(cafile=cafile, capath=os.environ.get("SSL_CERT_DIR"))
