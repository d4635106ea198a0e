"""The reflection model: any OpenAI-compatible chat endpoint, called over HTTP with the standard library.

Its answers are kept in a JSON-lines file keyed by a hash of the request, so a resumed optimisation
asks the same question once: the run replays to where it stopped without calling the model again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["ReflectionLM"]

logger = logging.getLogger(__name__)


class ReflectionLM:
    """Call ``base_url``/chat/completions with ``model`` (and ``api_key``); a callable ``prompt -> text``.

    ``prompt`` is a string (sent as one user message) or a list of chat messages. Transient failures
    (connection errors, 429 and 5xx answers) are retried ``retries`` times with backoff; any other
    answer raises ``RuntimeError`` naming the endpoint and status.

    >>> lm = ReflectionLM("http://127.0.0.1:8000/v1", model="gpt-4.1-mini", api_key="sk-...")
    >>> lm("Improve this instruction: ...")  # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float | None = 1.0,
        max_tokens: int | None = 4096,
        timeout: float = 300.0,
        retries: int = 3,
        cache: str | Path | None = None,
    ) -> None:
        if not base_url or not model:
            raise ValueError("the reflection model needs a base_url and a model name")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retries = retries
        self.calls = 0  #: requests sent to the endpoint (answers from the cache not counted)
        self._cache_path = Path(cache) if cache is not None else None
        self._cache: dict[str, str] = {}
        self._lock = threading.Lock()
        if self._cache_path is not None and self._cache_path.exists():
            for line in self._cache_path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self._cache[row["key"]] = row["text"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill

    def _key(self, messages: list[dict[str, Any]]) -> str:
        body = json.dumps([self.model, self.temperature, messages], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(body.encode()).hexdigest()

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        key = self._key(messages)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        text = self._request(messages)
        with self._lock:
            self._cache[key] = text
            if self._cache_path is not None:
                self._cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self._cache_path.open("a") as f:
                    f.write(json.dumps({"key": key, "text": text}, ensure_ascii=False) + "\n")
        return text

    def _request(self, messages: list[dict[str, Any]]) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    answer = json.loads(resp.read())
                self.calls += 1
                content = answer["choices"][0]["message"].get("content")
                if not isinstance(content, str):
                    raise RuntimeError(f"the reflection model at {url} answered no text: {answer!r:.300}")
                return content
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if (exc.code != 429 and exc.code < 500) or attempt == self.retries:
                    raise RuntimeError(
                        f"the reflection model at {url} answered {exc.code}: {detail}"
                    ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt == self.retries:
                    raise RuntimeError(f"the reflection model at {url} cannot be reached: {exc}") from None
            except (KeyError, IndexError, ValueError) as exc:
                raise RuntimeError(
                    f"the reflection model at {url} answered something else than a chat completion: {exc}"
                ) from None
            wait = min(30.0, 2.0**attempt)
            logger.warning("reflection model at %s: retrying in %.0f s", url, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover
