"""reasoning-gym's procedural datasets as an environment: its questions, its answer format, its scorer."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from .base import Environment, require

__all__ = ["ReasoningGym", "extract_answer"]

EXTRA = "envs-reasoning-gym"
OPEN, CLOSE = "<answer>", "</answer>"


def _rg() -> Any:
    return require("reasoning_gym", EXTRA, "agl.envs.ReasoningGym")


@functools.lru_cache(maxsize=64)
def _dataset(name: str, size: int, seed: int, config_json: str) -> Any:
    config = json.loads(config_json)
    try:
        return _rg().create_dataset(name, size=size, seed=seed, **config)
    except AssertionError as exc:  # reasoning-gym checks a config with asserts
        raise ValueError(f"reasoning-gym {name!r}: config {config} is invalid: {exc}") from None


def extract_answer(reply: str | None) -> str:
    """The answer in a reply: the text after its last ``<answer>`` when no ``</answer>`` follows it
    (a reply that stopped at the stop string ``</answer>``, which the server leaves out of the reply
    as OpenAI does), else the text of its last ``<answer>...</answer>`` tag (reasoning-gym's own
    extraction), else its last non-empty line.

    >>> extract_answer("Let me think.\\n<answer>42</answer>")
    '42'
    >>> extract_answer("Let me think.\\n<answer> 42")
    '42'
    >>> extract_answer("5 - 3 = 2\\nSo: 2")
    'So: 2'
    """
    text = reply or ""
    opened = text.rfind(OPEN)
    if opened >= 0 and CLOSE not in text[opened:] and (cut := text[opened + len(OPEN) :].strip()):
        return cut
    tagged = _rg().utils.extract_answer(text, tag_name="answer")
    if tagged is not None:
        return str(tagged)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class ReasoningGym(Environment):
    """Tasks from ``reasoning_gym.create_dataset(name, size=, seed=, **config)``, scored by the
    dataset's own ``score_answer(answer, entry)``.

    Each task is a JSON dict: the entry's ``question``, ``answer`` and ``metadata`` plus ``name``,
    ``index``, ``size``, ``seed`` and ``config``, from which :meth:`entry` regenerates the exact
    entry to score against (in any process). The default agent sends reasoning-gym's default system
    prompt (think step by step, answer inside ``<answer>...</answer>``) and the question in one chat
    call with ``max_tokens`` (512) and ``stop`` (``["</answer>"]``: the reply ends once its answer is
    written; the server leaves the stop string out of the reply, and :func:`extract_answer` reads the
    answer left open); its answer is :func:`extract_answer` of the reply. The sizes fit a CPU: the
    embedded model thinks aloud under this prompt, and a step's time is its tokens; with the former
    1024 tokens and no stop string a step of 8 rollouts on a busy 2-core machine ran past the former
    300 s rollout timeout on every rollout. The agent declares its budget
    (:attr:`max_rollout_tokens`), to which the trainer sizes its rollout timeout. Bring your own agent
    and score its reply with :meth:`reward`. Needs
    ``pip install "agentlightning-lite[envs-reasoning-gym]"``; runs offline.

    ``shots=k`` puts ``k`` solved examples before the question, as earlier user/assistant turns whose
    replies are ``<answer>ANSWER</answer>``: a small model that ignores a system prompt's answer format
    copies it from the turns. They come from the same generator and config with ``shots_seed`` (one
    fixed set, so training and held-out tasks see the same prompt); :meth:`messages` is what the agent
    sends. ``timeout`` (seconds) is the agent's client's wait for a reply; ``None`` waits as long as the
    rollout may run (``llm.timeout``: the trainer's rollout timeout, sized to the engine before the first
    step), or the OpenAI client's own default (600 s) when the endpoint has no limit.

    >>> import agentlightning_lite as agl
    >>> env = agl.envs.ReasoningGym("basic_arithmetic", size=4, seed=1)
    >>> env.tasks[0]["question"]
    'Calculate 5 - 3 - 6.'
    >>> env.reward(env.tasks[0], "<answer>-4</answer>"), env.reward(env.tasks[0], "-3")
    (1.0, 0.0)
    >>> shot = agl.envs.ReasoningGym("basic_arithmetic", size=4, seed=1, shots=2)
    >>> [m["role"] for m in shot.messages(shot.tasks[0])]
    ['system', 'user', 'assistant', 'user', 'assistant', 'user']
    >>> # trainer.fit(env.agent, env.tasks); trainer.evaluate(env.agent, env.tasks)
    """

    def __init__(
        self,
        name: str,
        size: int = 100,
        seed: int = 0,
        *,
        system_prompt: str | None = None,
        max_tokens: int = 512,
        stop: Sequence[str] = (CLOSE,),
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
        shots: int = 0,
        shots_seed: int = 777,
        timeout: float | None = None,
        **config: Any,
    ) -> None:
        _rg()  # the missing extra, named, before anything else
        if shots < 0:
            raise ValueError(f"shots must be >= 0, got {shots}")
        self.name, self.size, self.seed, self.config = name, size, seed, dict(config)
        self.max_tokens, self.stop, self.timeout = max_tokens, list(stop), timeout
        self.system_prompt = system_prompt or _rg().utils.SYSTEM_PROMPTS["default"]
        config_json = json.dumps(self.config, sort_keys=True)
        dataset = _dataset(name, size, seed, config_json)
        self.shots: list[tuple[str, str]] = []
        if shots:
            demos = _dataset(name, shots, shots_seed, config_json)
            self.shots = [(str(demos[i]["question"]), str(demos[i]["answer"])) for i in range(shots)]
        tasks = [self._task(i, dataset[i]) for i in range(len(dataset))]
        super().__init__(tasks, temperature=temperature, eval_temperature=eval_temperature)

    def _task(self, index: int, entry: dict[str, Any]) -> dict[str, Any]:
        return {
            "question": entry["question"],
            "answer": entry["answer"],
            "metadata": json.loads(json.dumps(entry.get("metadata", {}), default=str)),
            "name": self.name,
            "index": index,
            "size": self.size,
            "seed": self.seed,
            "config": self.config,
        }

    @staticmethod
    def entry(task: dict[str, Any]) -> dict[str, Any]:
        """The dataset entry ``task`` came from, regenerated from its name, index, size, seed and config."""
        config = json.dumps(task.get("config", {}), sort_keys=True)
        entry: dict[str, Any] = _dataset(task["name"], task["size"], task["seed"], config)[task["index"]]
        return entry

    @staticmethod
    def reward(task: dict[str, Any], reply: str | None) -> float:
        """Score a reply (the model's whole text, or just its answer) with the dataset's ``score_answer``."""
        config = json.dumps(task.get("config", {}), sort_keys=True)
        dataset = _dataset(task["name"], task["size"], task["seed"], config)
        answer = extract_answer(reply)
        return float(dataset.score_answer(answer, dataset[task["index"]]))

    def messages(self, task: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, str]]:
        """The chat messages the default agent sends for ``task``: the system prompt (``system_prompt``
        or the environment's), the solved examples (``shots``), then the question.

        >>> import agentlightning_lite as agl
        >>> env = agl.envs.ReasoningGym("basic_arithmetic", size=1, seed=1, shots=1, system_prompt="Sum.")
        >>> [m["content"] for m in env.messages(env.tasks[0])][1:3]
        ['Calculate -( ( -( -( -6256 + -6605 ) ) ) ) + -590.', '<answer>12271</answer>']
        """
        out = [{"role": "system", "content": system_prompt or self.system_prompt}]
        for question, answer in self.shots:
            out += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": f"<answer>{answer}</answer>"},
            ]
        out.append({"role": "user", "content": task["question"]})
        return out

    def play(self, task: dict[str, Any], llm: Any, temperature: float) -> float:
        """One chat call with :meth:`messages`; the reward of its reply."""
        options = {} if self.timeout is None else {"timeout": self.timeout}
        client = llm.openai_client(max_retries=0, **options)
        reply = client.chat.completions.create(
            model=llm.model,
            messages=self.messages(task, llm.prompt("system", default=self.system_prompt)),
            max_tokens=self.max_tokens,
            temperature=temperature,
            **({"stop": self.stop} if self.stop else {}),
        )
        return self.reward(task, reply.choices[0].message.content)

    @property
    def max_rollout_tokens(self) -> int:
        """The most tokens a rollout generates: one call of ``max_tokens`` (the trainer sizes its
        rollout timeout to it, :mod:`agentlightning_lite.rl.preflight`)."""
        return self.max_tokens

    def __repr__(self) -> str:
        return f"ReasoningGym({self.name!r}, size={self.size}, seed={self.seed})"
