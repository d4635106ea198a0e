"""The trained policies: which adapters are trained, whose calls train each, their optimisers and
(PPO) value heads.

A run trains one or more policies. ``lora=`` (one adapter shared by every trained agent) is the
one-policy case, named ``"default"``; ``policies=`` gives each agent its own adapter on one base model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..lora_settings import LoRA
from .algorithm import WeightUpdate

__all__ = [
    "Policy",
    "PolicyPlan",
    "ValueHead",
    "adapter_params",
    "build_policies",
    "make_optimizer",
    "plan_for",
    "plan_policies",
    "single_plan",
]

DEFAULT = "default"  # the name of the one policy of a run without policies=


class ValueHead(nn.Module):
    """A linear value estimate on the backbone's last hidden state, one value per token (PPO's).

    >>> import torch
    >>> ValueHead(8)(torch.ones(2, 3, 8)).shape  # zero at first: [batch, tokens]
    torch.Size([2, 3])
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.v = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.v.weight)
        nn.init.zeros_(self.v.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.v(hidden).squeeze(-1)


@dataclass
class Policy:
    """One trained adapter: the agents it serves, its optimiser and (PPO) value head."""

    name: str  # the policy's name in metrics: the agent that owns the adapter ("default": single policy)
    adapter: str | None  # the peft adapter it trains (None: the model's only adapter, left active)
    agents: list[str] | None  # whose calls train it (None: every agent's)
    optimizer: torch.optim.Optimizer
    value_head: ValueHead | None


@dataclass
class PolicyPlan:
    """What to train: adapters to train, frozen adapters to load, agent -> adapter routes.

    ``shared`` is the one-policy plan of ``lora=``: one adapter (the engine's own) trained on the calls
    of ``agents`` (``None``: every agent), no routes.
    """

    trained: dict[str, LoRA]  # adapter name -> settings
    owners: dict[str, str]  # adapter name -> the agent (policy) that owns it
    frozen: dict[str, str] = field(default_factory=dict)  # adapter name -> saved adapter directory
    routes: dict[str, str | None] = field(default_factory=dict)  # agent -> adapter name (None: base)
    shared: bool = False
    agents: list[str] | None = None  # shared plan: whose calls train it

    @property
    def lora(self) -> LoRA:
        """The first trained adapter's settings (the shared one's)."""
        return next(iter(self.trained.values()))

    def adapter_specs(self) -> dict[str, Any]:
        """Adapter name -> settings or saved directory, for engines built with ``adapters=``."""
        return {**self.trained, **self.frozen}

    def trained_agents(self) -> list[str] | None:
        """The agents whose calls are trained (``None``: every agent's)."""
        return self.agents if self.shared else list(self.agent_policy())

    def agent_policy(self) -> dict[str, str]:
        """Trained agent -> the policy its calls train (empty for the shared plan: every call's is it)."""
        return {a: self.owners[n] for a, n in self.routes.items() if n in self.owners}


def single_plan(lora: LoRA, agents: Sequence[str] | None) -> PolicyPlan:
    """The plan of ``lora=``/``agents=``: one shared adapter."""
    return PolicyPlan(
        {DEFAULT: lora},
        {DEFAULT: DEFAULT},
        shared=True,
        agents=list(agents) if agents is not None else None,
    )


def plan_for(
    policies: Mapping[str, Any] | None, lora: LoRA | None, agents: Sequence[str] | None
) -> PolicyPlan:
    """The plan of the trainer's ``policies=``, or of ``lora=``/``agents=`` (one shared adapter)."""
    if policies is None:
        return single_plan(lora if lora is not None else LoRA(), agents)
    if agents is not None:
        raise ValueError(
            "give policies= or agents=, not both: policies= already says which agents are trained "
            "(an agent it does not name is frozen)"
        )
    if lora is not None:
        raise ValueError(
            "with policies=, each agent's LoRA settings go in policies (e.g. policies={'writer': "
            "agl.LoRA(r=16)}); lora= is the single shared policy's"
        )
    return plan_policies(policies)


def _adapter_name(agent: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", agent) or "_"


def plan_policies(policies: Mapping[str, Any]) -> PolicyPlan:
    """Check ``policies=`` and turn it into adapters and routes (clear errors for what cannot work)."""
    if not isinstance(policies, Mapping) or not policies:
        raise ValueError("policies must map agent names to agl.LoRA(...) (e.g. {'writer': agl.LoRA(r=16)})")
    plan = PolicyPlan({}, {})
    names: dict[str, str] = {}

    def adapter_of(agent: str) -> str:
        name = _adapter_name(agent)
        if names.setdefault(name, agent) != agent:
            raise ValueError(f"agents {names[name]!r} and {agent!r} map to the same adapter name {name!r}")
        return name

    for agent, spec in policies.items():
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"policies keys are agent names (non-empty strings), got {agent!r}")
        if isinstance(spec, LoRA):
            name = adapter_of(agent)
            plan.trained[name], plan.owners[name], plan.routes[agent] = spec, agent, name
    for agent, spec in policies.items():
        if isinstance(spec, LoRA):
            continue
        if spec is None:
            plan.routes[agent] = None
        elif isinstance(spec, str) and spec in policies:
            if not isinstance(policies[spec], LoRA):
                raise ValueError(
                    f"policies[{agent!r}] = {spec!r} shares agent {spec!r}'s adapter, but {spec!r} has no "
                    "agl.LoRA(...) of its own to share"
                )
            plan.routes[agent] = _adapter_name(spec)
        elif isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            if not os.path.isfile(os.path.join(path, "adapter_config.json")):
                raise ValueError(
                    f"policies[{agent!r}] = {spec!r} is neither another agent of policies nor a directory "
                    "holding a saved peft adapter (adapter_config.json)"
                )
            name = adapter_of(agent)
            plan.frozen[name], plan.routes[agent] = path, name
        else:
            raise TypeError(
                f"policies[{agent!r}] must be agl.LoRA(...), another agent's name, a saved adapter's "
                f"directory or None, got {type(spec).__name__}"
            )
    if not plan.trained:
        raise ValueError("policies names no agl.LoRA(...): there is nothing to train")
    if len({lo.load_in_4bit for lo in plan.trained.values()}) > 1:
        raise ValueError("every policy shares one base model: load_in_4bit must be the same for all of them")
    return plan


def adapter_params(model: Any, adapter: str | None) -> list[torch.nn.Parameter]:
    """The weights of one peft adapter (``...lora_A.<adapter>.weight``...), whatever is active;
    ``None``: every trainable weight (the model's only adapter)."""
    if adapter is None:
        return [p for p in model.parameters() if p.requires_grad]
    out = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if any(parts[i].startswith("lora_") and parts[i + 1] == adapter for i in range(len(parts) - 1)):
            out.append(p)
    return out


def make_optimizer(
    algorithm: WeightUpdate, params: list[torch.nn.Parameter], model: Any, device: torch.device
) -> tuple[torch.optim.Optimizer, ValueHead | None]:
    """AdamW over ``params``, and a fresh value head when the algorithm needs values."""
    groups: list[dict[str, Any]] = [{"params": params, "lr": algorithm.lr}]
    head = None
    if algorithm.needs_values:  # PPO
        head = ValueHead(int(model.config.hidden_size)).to(device)
        groups.append({"params": list(head.parameters()), "lr": algorithm.value_head_lr()})
    return torch.optim.AdamW(groups, weight_decay=algorithm.weight_decay), head


def build_policies(
    plan: PolicyPlan, model: Any, algorithm: WeightUpdate, device: torch.device
) -> list[Policy]:
    """One :class:`Policy` per trained adapter, each with its own optimiser (and value head)."""
    out = []
    for adapter, owner in plan.owners.items():
        name = None if plan.shared else adapter
        params = adapter_params(model, name)
        if not params:
            raise RuntimeError(f"the training model has no weights for adapter {adapter!r}")
        opt, head = make_optimizer(algorithm, params, model, device)
        agents = plan.agents if plan.shared else [a for a, n in plan.routes.items() if n == adapter]
        out.append(Policy(owner, name, agents, opt, head))
    return out
