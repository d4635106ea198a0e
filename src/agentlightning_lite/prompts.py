"""Prompts an agent reads: one text per (agent, name), its default declared where it is read.

An agent reads its prompt with :func:`prompt` (or ``llm.prompt(name, default)`` on the ``agl.LLM`` it
is handed). Inside a rollout the text comes from the rollout's ``metadata["prompts"]``: the candidate
``agl.APO`` is evaluating, or the fixed prompts a trainer was given (``Trainer(prompts=...)``);
otherwise the declared default. The prompts travel in the rollout's metadata, so an agent run by a
remote runner reads the same text as one run in-process. Each read is recorded once per rollout as a
zero-length ``custom`` span named ``agl.prompt`` (attributes ``component`` and ``source``), which is
how ``agl.APO`` finds the components an agent reads and their defaults.

Nothing here imports more than the tracer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .span_handles import RolloutHandle
from .tracer import Tracer

__all__ = [
    "PROMPT_SPAN",
    "component_key",
    "load_prompts",
    "prompt",
    "save_prompts",
    "split_key",
    "with_prompts",
]

#: the name of the span that records a prompt read
PROMPT_SPAN = "agl.prompt"


def component_key(name: str, agent: str | None = None) -> str:
    """The key of a prompt component: ``"<agent>/<name>"``, or ``name`` for a prompt of no agent.

    >>> component_key("system", agent="writer"), component_key("system")
    ('writer/system', 'system')
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a prompt name is a non-empty string without '/', got {name!r}")
    if agent is None:
        return name
    if not isinstance(agent, str) or not agent or "/" in agent:
        raise ValueError(f"an agent name is a non-empty string without '/', got {agent!r}")
    return f"{agent}/{name}"


def split_key(key: str) -> tuple[str | None, str]:
    """``(agent, name)`` of a component key.

    >>> split_key("writer/system"), split_key("system")
    (('writer', 'system'), (None, 'system'))
    """
    agent, sep, name = key.rpartition("/")
    return (agent if sep else None), name


def prompt(name: str, default: str | None = None, agent: str | None = None) -> str:
    """The text of prompt ``name`` (of ``agent``, in a multi-agent system) for the current rollout.

    Under ``agl.APO`` it is the candidate being evaluated; under RL, the prompts the trainer was given
    (``Trainer(prompts="runs/apo/prompts.json")``) or else ``default``. Outside a rollout: ``default``.
    ``KeyError`` when there is neither a text nor a default.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("2+2?", metadata={"prompts": {"writer/system": "Answer in digits."}}):
    ...     agl.prompt("system", default="You are helpful.", agent="writer")
    'Answer in digits.'
    >>> agl.prompt("system", default="You are helpful.", agent="writer")  # no rollout: the default
    'You are helpful.'
    """
    key = component_key(name, agent)
    ro = Tracer.current_rollout()
    given = ro.prompts if ro is not None else {}
    if key in given:
        text, source = given[key], "given"
    elif default is not None:
        text, source = str(default), "default"
    else:
        raise KeyError(f"no prompt {key!r} in this rollout and no default: give default=... where it is read")
    if ro is not None:
        _record_read(ro, key, text, source, default)
    return text


def _record_read(ro: RolloutHandle, key: str, text: str, source: str, default: str | None) -> None:
    agent, name = split_key(key)
    attrs = {
        "component": key,
        "prompt_agent": agent,
        "prompt_name": name,
        "source": source,
        "default": default,
    }
    ro.record_instant("custom", PROMPT_SPAN, text, attrs, once=key)  # once per rollout


def load_prompts(source: str | os.PathLike[str] | Mapping[str, str] | None) -> dict[str, str]:
    """Prompts as a ``{component: text}`` dict: from a mapping, or a JSON file written by ``agl.APO``
    (``output_dir/prompts.json``, or any ``{"prompts": {...}}`` / flat ``{key: text}`` file).

    >>> load_prompts({"writer/system": "Be brief."})
    {'writer/system': 'Be brief.'}
    """
    if source is None:
        return {}
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "prompts.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no prompts file at {path}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("prompts"), dict):
            data = data["prompts"]
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError(f"prompts must map component names to texts, got {data!r:.200}")
    for k in data:
        agent, name = split_key(k)
        component_key(name, agent)  # validates
    return dict(data)


def save_prompts(path: str | os.PathLike[str], prompts: Mapping[str, str], **extra: Any) -> Path:
    """Write ``{"prompts": {...}, **extra}`` as JSON to ``path`` (atomically); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps({"prompts": dict(prompts), **extra}, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return out


def with_prompts(metadata: Mapping[str, Any], prompts: Mapping[str, str]) -> dict[str, Any]:
    """``metadata`` with ``prompts`` under ``"prompts"`` (texts already there win: a candidate
    being evaluated overrides the trainer's fixed prompts)."""
    out = dict(metadata)
    if prompts:
        out["prompts"] = {**prompts, **(metadata.get("prompts") or {})}
    return out
