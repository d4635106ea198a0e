"""Sampling parameters of an OpenAI request body, checked: a 400 naming the parameter, never a 500."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request

__all__ = ["MAX_TOP_LOGPROBS", "Params", "parse_params", "parse_prompts"]

MAX_TOP_LOGPROBS = 20


@dataclass
class Params:
    """The sampling settings of one request, as the server understood them."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    #: the truncation and penalty settings a training rollout's request asked for and the server
    #: ignored (``PolicyServer(truncated_sampling="ignore")``), e.g. ``{"top_p": 0.8}``; ``None``: none
    truncation_ignored: dict[str, Any] | None = None

    def reshaping(self) -> dict[str, Any]:
        """The settings that are not neutral and make the sampled distribution differ from the
        tempered softmax the trainer scores: truncation (top-p, top-k, min-p) and the penalties.

        >>> Params(top_p=0.8, repetition_penalty=1.1, temperature=0.7).reshaping()
        {'top_p': 0.8, 'repetition_penalty': 1.1}
        """
        return {k: getattr(self, k) for k, v in _UNSHAPED.items() if getattr(self, k) != v}

    def unshape(self) -> dict[str, Any]:
        """Set :meth:`reshaping`'s settings to their neutral values; returns what they were."""
        asked = self.reshaping()
        for k, v in _UNSHAPED.items():
            setattr(self, k, v)
        return asked

    def record(self) -> dict[str, Any]:
        """What the ``llm`` span keeps in ``attributes["params"]``."""
        ignored = {"truncation_ignored": self.truncation_ignored} if self.truncation_ignored else {}
        return ignored | {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            **{k: v for k, v in self.shaping().items() if v != _NEUTRAL[k]},
            "max_tokens": self.max_tokens,
            "stop": self.stop,
            "seed": self.seed,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "stream": self.stream,
        }

    def shaping(self) -> dict[str, Any]:
        """The settings besides temperature and top-p that shape what is sampled (engine order:
        penalties, temperature, min-p, top-k, top-p); neutral values change nothing."""
        return {k: getattr(self, k) for k in _NEUTRAL}


#: the values of :meth:`Params.shaping`'s settings that leave the distribution as it is
_NEUTRAL: dict[str, Any] = {
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
#: every setting that reshapes the tempered distribution, at its neutral value
_UNSHAPED: dict[str, Any] = {"top_p": 1.0, **_NEUTRAL}


def _number(body: dict[str, Any], key: str, default: Any, lo: float, hi: float, integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise bad_request(f"'{key}' must be {'an integer' if integer else 'a number'}, got {value!r}", key)
    if not lo <= value <= hi:  # NaN fails this too
        raise bad_request(f"'{key}' must be between {lo} and {hi}, got {value!r}", key)
    return value


def _flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be a boolean, got {value!r}", key)
    return value


def parse_params(body: dict[str, Any], chat: bool, max_n: int) -> Params:
    """Read and check the sampling parameters of a chat (``chat=True``) or completions body.

    >>> parse_params({"n": 2, "temperature": 0}, chat=True, max_n=4).n
    2
    >>> parse_params({"n": "2"}, chat=True, max_n=4)
    Traceback (most recent call last):
    ...
    agentlightning_lite.serving.errors.APIError: 'n' must be an integer, got '2'
    """
    p = Params()
    p.n = _number(body, "n", 1, 1, max_n, integer=True)
    p.temperature = float(_number(body, "temperature", 1.0, 0.0, 2.0))
    p.top_p = float(_number(body, "top_p", 1.0, 0.0, 1.0))
    if p.top_p <= 0.0:
        raise bad_request("'top_p' must be greater than 0", "top_p")
    top_k = _number(body, "top_k", 0, -1, 2**31 - 1, integer=True)
    p.top_k = max(top_k, 0)  # vLLM: -1 and 0 both mean "all tokens"
    p.min_p = float(_number(body, "min_p", 0.0, 0.0, 1.0))
    p.presence_penalty = float(_number(body, "presence_penalty", 0.0, -2.0, 2.0))
    p.frequency_penalty = float(_number(body, "frequency_penalty", 0.0, -2.0, 2.0))
    p.repetition_penalty = float(_number(body, "repetition_penalty", 1.0, 0.0, 10.0))
    if p.repetition_penalty <= 0.0:
        raise bad_request("'repetition_penalty' must be greater than 0", "repetition_penalty")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    p.max_tokens = _number(body, key, None, 1, 10**9, integer=True)
    if not chat and p.max_tokens is None:
        p.max_tokens = 16  # the OpenAI default for /v1/completions
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    p.stop = [s for s in stop if s]
    p.seed = _number(body, "seed", None, -(2**63), 2**63 - 1, integer=True)
    p.stream = _flag(body, "stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        p.include_usage = bool(opts.get("include_usage"))
    if chat:
        p.logprobs = _flag(body, "logprobs")
        p.top_logprobs = (
            _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, integer=True) if p.logprobs else 0
        )
    else:
        lp = _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
        p.logprobs = lp is not None
        p.top_logprobs = lp or 0
        if _flag(body, "echo"):
            raise bad_request("'echo' is not supported by this server", "echo")
        if body.get("suffix"):
            raise bad_request("'suffix' is not supported by this server", "suffix")
        best_of = body.get("best_of")
        if best_of is not None and best_of != p.n:
            raise bad_request("'best_of' is not supported by this server (use n)", "best_of")
    return p


def parse_prompts(prompt: Any) -> list[tuple[str | None, list[int] | None]]:
    """``/v1/completions`` prompts as (text, token ids): a string, strings, token ids or lists of them.

    >>> parse_prompts("hi")
    [('hi', None)]
    >>> parse_prompts([[1, 2], [3]])
    [(None, [1, 2]), (None, [3])]
    """
    if prompt is None:
        raise bad_request(
            "Missing required parameter: 'prompt'.", "prompt", code="missing_required_parameter"
        )
    if isinstance(prompt, str):
        return [(prompt, None)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, str) for x in prompt):
            return [(x, None) for x in prompt]
        if all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in prompt):
            return [(None, list(prompt))]
        if all(
            isinstance(x, list)
            and x
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)
            for x in prompt
        ):
            return [(None, list(x)) for x in prompt]
    raise bad_request("'prompt' must be a string, a list of strings, or token ids", "prompt")
