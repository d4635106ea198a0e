"""An LLM judge as a reward: a rubric, a judge model behind any OpenAI-compatible endpoint (or the
policy's own server, as a call that is never trained on), a score in [0, 1] read from its reply."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..serving.llm import LLM
from ..tracer import Tracer
from ..transitions import SIDE_AGENT

__all__ = ["Judge", "JudgeParseError", "JudgeUsage", "parse_group", "parse_score"]

logger = logging.getLogger(__name__)

SYSTEM = (
    "You are a strict, fair grader. Read the rubric, the task and the reply; reason briefly, then end "
    "your answer with one line `Score: N/{scale}`, where N is an integer from 0 (fails the rubric) to "
    "{scale} (meets it fully)."
)
GROUP_SYSTEM = (
    "You are a strict, fair grader. Read the rubric, the task and the {n} numbered replies to it; compare "
    "them and reason briefly, then end your answer with one line per reply, `Reply i: Score: N/{scale}` "
    "for i = 1..{n}, where N is an integer from 0 (fails the rubric) to {scale} (meets it fully)."
)

_NUMBER = r"(-?\d+(?:\.\d+)?)"
_SCORE = re.compile(
    rf"score[^\w\-\u2212]{{0,3}}\s*[:=]?\s*\**\s*{_NUMBER}\s*\**\s*(?:(?:/|out of)\s*{_NUMBER})?", re.I
)
_REPLY_SCORE = re.compile(
    rf"reply\s*#?\s*(\d+)\s*\**\s*[:\-\u2013\u2014]?\s*\**\s*score\s*[:=]?\s*\**\s*{_NUMBER}"
    rf"\s*\**\s*(?:(?:/|out of)\s*{_NUMBER})?",
    re.I,
)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


class JudgeParseError(ValueError):
    """The judge's reply holds no score in the documented format (``reply``: what it said)."""

    def __init__(self, message: str, reply: str) -> None:
        super().__init__(message)
        self.reply = reply


def _json(text: str) -> Any:
    body = text.strip()
    fenced = _FENCE.match(body)
    try:
        return json.loads(fenced.group(1) if fenced else body)
    except (json.JSONDecodeError, ValueError):
        return None


def _scaled(value: float, out_of: float) -> float | None:
    if out_of <= 0 or not 0 <= value <= out_of:
        return None
    return value / out_of


def parse_score(text: str, scale: int = 10) -> float | None:
    """The score in a judge's reply, as a fraction in [0, 1]; ``None`` when there is none.

    Read, in order: a JSON reply ``{"score": N}`` (out of ``scale``); else the last ``Score: N/M``
    (``M`` when written, else ``scale``; ``Score: N``, ``score = N``, ``Score: N out of M`` too).
    A score outside ``[0, M]`` is no score (a negative one too: ``Score: -1/10``).

    >>> parse_score("Clear and correct.\\nScore: 8/10")
    0.8
    >>> parse_score("Score: 3/10 at first, but on reflection Score: 4 / 5")
    0.8
    >>> parse_score('{"score": 7, "reason": "ok"}')
    0.7
    >>> parse_score("Score: 12/10") is None, parse_score("Score: -1/10") is None
    (True, True)
    >>> parse_score("Looks fine to me.") is None
    True
    """
    data = _json(text)
    if isinstance(data, dict) and isinstance(data.get("score"), (int, float)):
        return _scaled(float(data["score"]), float(scale))
    matches = _SCORE.findall(text or "")
    if not matches:
        return None
    value, out_of = matches[-1]
    return _scaled(float(value), float(out_of) if out_of else float(scale))


def parse_group(text: str, n: int, scale: int = 10) -> list[float | None]:
    """The scores of replies ``1..n`` in a group judgement, as fractions (``None``: not found, out
    of range, or given twice with different values).

    Read: a JSON reply ``{"scores": [N1, N2, ...]}`` (out of ``scale``); else the lines
    ``Reply i: Score: N/M``.

    >>> parse_group("Reply 1 misses the point.\\nReply 1: Score: 2/10\\nReply 2: Score: 9/10", 2)
    [0.2, 0.9]
    >>> parse_group('{"scores": [10, 5, 0]}', 3)
    [1.0, 0.5, 0.0]
    >>> parse_group("Reply 2: Score: 6/10", 3)
    [None, 0.6, None]
    """
    data = _json(text)
    if isinstance(data, dict) and isinstance(data.get("scores"), list):
        values = data["scores"][:n] + [None] * max(0, n - len(data["scores"]))
        return [_scaled(float(v), float(scale)) if isinstance(v, (int, float)) else None for v in values]
    found: dict[int, float | None] = {}
    for index, value, out_of in _REPLY_SCORE.findall(text or ""):
        i = int(index)
        if 1 <= i <= n:
            score = _scaled(float(value), float(out_of) if out_of else float(scale))
            found[i] = score if i not in found or found[i] == score else None
    return [found.get(i) for i in range(1, n + 1)]


@dataclass
class JudgeUsage:
    """What a judge has spent: calls, replies scored, replies it could not score, and tokens (the
    sum of the ``usage`` fields of the judge's responses; ``calls_without_usage`` had none).

    >>> JudgeUsage(calls=2, replies=4, prompt_tokens=900, completion_tokens=100).per_reply()
    {'calls': 0.5, 'prompt_tokens': 225.0, 'completion_tokens': 25.0}
    """

    calls: int = 0
    replies: int = 0
    unparsed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls_without_usage: int = 0

    def per_reply(self) -> dict[str, float]:
        """Calls and tokens per reply scored: the judge's cost per rollout."""
        n = max(self.replies, 1)
        return {
            "calls": self.calls / n,
            "prompt_tokens": self.prompt_tokens / n,
            "completion_tokens": self.completion_tokens / n,
        }


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


class Judge:
    """A reward from an LLM judge: ``judge(task, reply)`` asks the judge model to grade ``reply`` to
    ``task`` against ``rubric`` and returns its score as a float in [0, 1].

    Where the judge model is:

    * ``base_url`` + ``model`` (+ ``api_key``): any OpenAI-compatible endpoint (``POST
      {base_url}/chat/completions``), e.g. a hosted model, a ``vllm serve``, or a PolicyServer's
      ``server.base_url`` (whose calls are then each an implicit ``trace`` rollout, never trained on).
    * ``llm``: an ``agl.LLM`` (the rollout's, passed at each call, or one given here). The judge calls
      it as the agent ``"side"`` (``llm.for_agent("side")``), so its calls are recorded in the rollout
      like every call but are side calls, which :func:`agl.transitions` and the trainer leave out of
      training (as they do a harness's titles and summaries): the policy grades itself, untrained.
    * ``client`` + ``model``: an ``openai.OpenAI`` client of your own (its base URL, key, timeout
      and retries apply).

    Every call goes through the ``openai`` client (``agl.LLM.openai_client``, as an agent's calls do),
    with ``timeout`` seconds per try and ``max_retries`` retries of a failed try (a connection error,
    a 408, 409, 429 or 5xx answer, or no answer within ``timeout``). A judge that does not answer in
    time raises ``TimeoutError`` naming the judge model, its URL and the timeout; an error answer or
    an unreachable server raises ``RuntimeError`` naming the URL.

    The format: the judge is asked to end with ``Score: N/10`` (``scale``); :func:`parse_score` reads
    it (or a JSON ``{"score": N}``). A reply without a readable score is counted in
    ``usage.unparsed`` and raises :class:`JudgeParseError`, or, with ``fallback`` set, scores
    ``fallback`` (with a warning in the log): never a silent 0. :meth:`score_group` grades the
    replies of one GRPO group in one call (``Reply i: Score: N/10``), so they are compared side by side.

    Cost: one call per :meth:`score` (per rollout); one call per group with :meth:`score_group`
    (1/n per rollout, its prompt holding all n replies). ``usage`` (:class:`JudgeUsage`) adds up
    the calls and the ``usage`` fields of the responses; ``usage.per_reply()`` is the cost per
    rollout. Inside a rollout each judgement is also a ``custom`` span ``judge`` (scores, the judge's
    text, its usage). ``score`` is synchronous (an async agent calls ``await asyncio.to_thread(judge,
    task, reply)``).

    >>> judge = Judge("Is the arithmetic right?", base_url="http://127.0.0.1:8000/v1", model="judge")
    >>> judge.messages("What is 2+2?", "4")[1]["content"]
    'Rubric:\\nIs the arithmetic right?\\n\\nTask:\\nWhat is 2+2?\\n\\nReply:\\n4'
    >>> judge.parse("The reply is correct.\\nScore: 10/10")
    1.0
    >>> def agent(task, llm):  # doctest: +SKIP
    ...     reply = ...  # the agent's answer, through llm
    ...     return judge(task, reply)
    """

    def __init__(
        self,
        rubric: str,
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        llm: Any = None,
        scale: int = 10,
        max_tokens: int = 512,
        temperature: float = 0.0,
        fallback: float | None = None,
        timeout: float = 120.0,
        system_prompt: str | None = None,
        max_retries: int = 2,
        client: Any = None,
    ) -> None:
        if not rubric or not rubric.strip():
            raise ValueError("a Judge needs a rubric: what a good reply does")
        given = [
            name for name, v in (("base_url", base_url), ("llm", llm), ("client", client)) if v is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"give the judge one of base_url (with model), llm or client, not {' and '.join(given)}"
            )
        if (base_url is not None or client is not None) and not model:
            where = "at base_url" if client is None else "with a client"
            raise ValueError(f"a judge {where} needs model: the judge model's name there")
        if client is not None and not hasattr(
            getattr(getattr(client, "chat", None), "completions", None), "create"
        ):
            raise TypeError(f"client must be an openai.OpenAI client, got {type(client).__name__}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if scale < 1:
            raise ValueError(f"scale must be a positive integer, got {scale}")
        if fallback is not None and not 0.0 <= fallback <= 1.0:
            raise ValueError(f"fallback must lie in [0, 1], got {fallback}")
        self.rubric, self.base_url, self.model, self.api_key = rubric, base_url, model, api_key
        self.llm, self.scale, self.max_tokens, self.temperature = llm, scale, max_tokens, temperature
        self.fallback, self.timeout, self.system_prompt = fallback, timeout, system_prompt
        self.max_retries, self.client = max_retries, client
        self.usage = JudgeUsage()
        self._lock = threading.Lock()
        self._client: Any = None  # the client for base_url, made on the first call

    # -- prompts and parsing ---------------------------------------------------------------------
    def messages(self, task: Any, reply: Any) -> list[dict[str, str]]:
        """The chat messages that ask for one reply's score."""
        system = (self.system_prompt or SYSTEM).format(scale=self.scale, n=1)
        user = f"Rubric:\n{self.rubric}\n\nTask:\n{_render(task)}\n\nReply:\n{_render(reply)}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def group_messages(self, task: Any, replies: Sequence[Any]) -> list[dict[str, str]]:
        """The chat messages that ask for the scores of a group of replies to one task, in one call.

        >>> Judge("Be right.").group_messages("2+2?", ["4", "5"])[1]["content"].splitlines()[-5:]
        ['Reply 1:', '4', '', 'Reply 2:', '5']
        """
        system = GROUP_SYSTEM.format(scale=self.scale, n=len(replies))
        listed = "\n\n".join(f"Reply {i}:\n{_render(r)}" for i, r in enumerate(replies, 1))
        user = f"Rubric:\n{self.rubric}\n\nTask:\n{_render(task)}\n\n{listed}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def parse(self, text: str) -> float | None:
        """The score in the judge's reply (:func:`parse_score` with this judge's ``scale``)."""
        return parse_score(text, self.scale)

    # -- scoring ------------------------------------------------------------------------------------
    def score(self, task: Any, reply: Any, llm: Any = None) -> float:
        """The judge's score of ``reply`` to ``task``, in [0, 1] (``llm``: see the class docstring)."""
        text = self._judge(self.messages(task, reply), llm, replies=1)
        value = self.parse(text)
        return self._resolve([value], text)[0]

    __call__ = score

    def score_group(self, task: Any, replies: Sequence[Any], llm: Any = None) -> list[float]:
        """The scores of several replies to ``task`` (a GRPO group), from one judge call that sees
        them side by side; in the replies' order."""
        replies = list(replies)
        if not replies:
            return []
        text = self._judge(self.group_messages(task, replies), llm, replies=len(replies))
        return self._resolve(parse_group(text, len(replies), self.scale), text)

    def _resolve(self, values: list[float | None], text: str) -> list[float]:
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            with self._lock:
                self.usage.unparsed += len(missing)
            where = "" if len(values) == 1 else f" for replies {[i + 1 for i in missing]}"
            message = (
                f"the judge's reply holds no score in the format `Score: N/{self.scale}`{where} "
                f"(counted in judge.usage.unparsed = {self.usage.unparsed}): {text[-300:]!r}"
            )
            if self.fallback is None:
                raise JudgeParseError(message + "; set fallback= to score such replies instead", text)
            logger.warning("%s; scored %s (fallback)", message, self.fallback)
        scores: list[float] = []
        for value in values:
            if value is None:
                assert self.fallback is not None  # else raised above
                value = self.fallback
            scores.append(value)
        return scores

    # -- the call -----------------------------------------------------------------------------------
    def _endpoint(self, llm: Any) -> tuple[Any, str, str, bool]:
        """The client to call, its base URL, the judge model's name, and whether the client is made
        for this one call (and closed after it)."""
        if llm is not None and (self.base_url is not None or self.client is not None):
            own = "base_url" if self.client is None else "client"
            raise ValueError(
                f"this judge calls its own endpoint ({own}); leave out llm, or build Judge(rubric) "
                "to judge with the rollout's llm"
            )
        target = llm if llm is not None else self.llm
        if target is not None:
            side = target.for_agent(SIDE_AGENT)
            return self._openai(side), side.base_url, side.model, True
        if self.client is not None:
            assert self.model is not None
            return (
                self.client,
                str(getattr(self.client, "base_url", "the client's endpoint")),
                self.model,
                False,
            )
        if self.base_url is None:
            raise ValueError(
                "this judge has no endpoint: give Judge(..., base_url=, model=), Judge(..., llm=), or "
                "pass the rollout's llm: judge(task, reply, llm=llm)"
            )
        assert self.model is not None
        with self._lock:
            if self._client is None:
                llm = LLM(base_url=self.base_url, model=self.model)
                if self.api_key is not None:
                    llm = llm.model_copy(update={"api_key": self.api_key})
                self._client = self._openai(llm)
        return self._client, self.base_url, self.model, False

    def _openai(self, llm: LLM) -> Any:
        try:
            return llm.openai_client(timeout=self.timeout, max_retries=self.max_retries)
        except ImportError as exc:
            raise ImportError(
                "agl.rewards.Judge calls its judge model with the openai client: pip install openai "
                '(or "agentlightning-lite[serve]")'
            ) from exc

    def _judge(self, messages: list[dict[str, str]], llm: Any, replies: int) -> str:
        client, base_url, model, owned = self._endpoint(llm)
        try:
            current = Tracer.current_rollout()
            if current is None:
                return self._post(client, base_url, model, messages, replies)[0]
            span_input = {"messages": messages, "model": model}
            with current.tracer.span("custom", "judge", input=span_input) as span:
                text, usage = self._post(client, base_url, model, messages, replies)
                span.set_output({"text": text, "usage": usage})
            return text
        finally:
            if owned:
                client.close()

    def _post(
        self, client: Any, base_url: str, model: str, messages: list[dict[str, str]], replies: int
    ) -> tuple[str, dict[str, Any] | None]:
        import openai

        try:
            completion = client.chat.completions.create(
                model=model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature
            )
        except openai.APITimeoutError:
            timeout = getattr(client, "timeout", self.timeout)
            tries = 1 + int(getattr(client, "max_retries", self.max_retries))
            raise TimeoutError(
                f"the judge model {model!r} at {base_url} did not answer within {timeout} s "
                f"({tries} {'try' if tries == 1 else 'tries'}): check that the server there is serving "
                f"{model!r}, or give it longer with Judge(..., timeout=) (seconds per try) and max_retries="
            ) from None
        except openai.APIConnectionError as exc:
            raise RuntimeError(f"the judge at {base_url} cannot be reached: {exc.__cause__ or exc}") from None
        except openai.APIStatusError as exc:
            detail = exc.response.text[:500]
            raise RuntimeError(f"the judge at {base_url} answered {exc.status_code}: {detail}") from None
        except openai.APIError as exc:
            raise RuntimeError(f"the judge at {base_url} answered no usable response: {exc}") from None
        choices = getattr(completion, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise RuntimeError(f"the judge at {base_url} answered no message: {str(completion)[:300]}")
        text = choices[0].message.content or ""
        raw = getattr(completion, "usage", None)
        usage = raw.model_dump(exclude_none=True) if raw is not None else None
        with self._lock:
            self.usage.calls += 1
            self.usage.replies += replies
            if usage is None:
                self.usage.calls_without_usage += 1
            else:
                self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        return str(text), usage

    def __repr__(self) -> str:
        where = self.base_url or (
            str(getattr(self.client, "base_url", "a client"))
            if self.client is not None
            else ("the rollout's llm (side calls)" if self.llm is None else self.llm.base_url)
        )
        return f"Judge({self.rubric[:40]!r}, {where}, usage={asdict(self.usage)})"
