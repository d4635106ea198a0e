"""reasoning-gym's procedural datasets as an environment: its questions, its answer format, its scorer."""

from __future__ import annotations

import functools
import json
from typing import Any

from .base import Environment, require

__all__ = ["ReasoningGym", "extract_answer"]

EXTRA = "envs-reasoning-gym"


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
    """The answer in a reply: the text of its last ``<answer>...</answer>`` tag (reasoning-gym's own
    extraction), else its last non-empty line.

    >>> extract_answer("Let me think.\\n<answer>42</answer>")
    '42'
    >>> extract_answer("5 - 3 = 2\\nSo: 2")
    'So: 2'
    """
    text = reply or ""
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
    call; its answer is :func:`extract_answer` of the reply. Bring your own agent and score its reply
    with :meth:`reward`. Needs ``pip install "agentlightning-lite[envs-reasoning-gym]"``; runs offline.

    >>> import agentlightning_lite as agl
    >>> env = agl.envs.ReasoningGym("basic_arithmetic", size=4, seed=1)
    >>> env.tasks[0]["question"]
    'Calculate 5 - 3 - 6.'
    >>> env.reward(env.tasks[0], "<answer>-4</answer>"), env.reward(env.tasks[0], "-3")
    (1.0, 0.0)
    >>> # trainer.fit(env.agent, env.tasks); trainer.evaluate(env.agent, env.tasks)
    """

    def __init__(
        self,
        name: str,
        size: int = 100,
        seed: int = 0,
        *,
        system_prompt: str | None = None,
        max_tokens: int = 1024,
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
        **config: Any,
    ) -> None:
        _rg()  # the missing extra, named, before anything else
        self.name, self.size, self.seed, self.config = name, size, seed, dict(config)
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt or _rg().utils.SYSTEM_PROMPTS["default"]
        dataset = _dataset(name, size, seed, json.dumps(self.config, sort_keys=True))
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

    def play(self, task: dict[str, Any], llm: Any, temperature: float) -> float:
        """One chat call with the question; the reward of its reply."""
        client = llm.openai_client(max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "system", "content": llm.prompt("system", default=self.system_prompt)},
                {"role": "user", "content": task["question"]},
            ],
            max_tokens=self.max_tokens,
            temperature=temperature,
        )
        return self.reward(task, reply.choices[0].message.content)

    def __repr__(self) -> str:
        return f"ReasoningGym({self.name!r}, size={self.size}, seed={self.seed})"
