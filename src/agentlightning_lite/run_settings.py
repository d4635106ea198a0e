"""The settings a training run made its samples with (credit rule, AIR rules, algorithm), recorded with
each of its rollouts so that a later reader of the store (``agl-lite ui``, ``agl-lite transitions``)
shows the transitions the run trained on, not the defaults.

They travel in each training rollout's ``metadata["agl.run"]`` as JSON. A rule this module cannot
write down (a custom callable) is recorded by name only and left out when read back.

>>> from agentlightning_lite import air, credit
>>> spec = describe(credit.Discounted(0.9), [air.ToolStatus(success=0.1, error=-0.1)], "GRPO")
>>> spec["credit"], spec["algorithm"]
({'rule': 'Discounted', 'gamma': 0.9}, 'GRPO')
>>> rules(spec)
(Discounted(gamma=0.9), [ToolStatus(success=0.1, error=-0.1, tools=None)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .air import AIRRule, ToolStatus
from .credit import CreditRule, Discounted, FinalReward
from .store.base import Store

__all__ = ["KEY", "describe", "recorded", "rules"]

#: the rollout metadata key the settings travel under
KEY = "agl.run"


def _credit_spec(rule: CreditRule | None) -> dict[str, Any] | None:
    if rule is None or isinstance(rule, FinalReward):
        return {"rule": "FinalReward", "add_intermediate": bool(getattr(rule, "add_intermediate", False))}
    if isinstance(rule, Discounted):
        return {"rule": "Discounted", "gamma": rule.gamma}
    return {"rule": "custom", "name": getattr(rule, "__name__", type(rule).__name__)}


def _air_spec(rule: AIRRule) -> dict[str, Any]:
    if isinstance(rule, ToolStatus):
        tools = list(rule.tools) if rule.tools is not None else None
        return {"rule": "ToolStatus", "success": rule.success, "error": rule.error, "tools": tools}
    return {"rule": "custom", "name": getattr(rule, "__name__", type(rule).__name__)}


def describe(
    credit: CreditRule | None, air: Sequence[AIRRule] | None, algorithm: str | None = None
) -> dict[str, Any]:
    """The JSON record of a run's settings (``algorithm``: its name, e.g. ``"GRPO"``)."""
    return {
        "credit": _credit_spec(credit),
        "air": [_air_spec(r) for r in (air or [])],
        "algorithm": algorithm,
    }


def rules(spec: Mapping[str, Any]) -> tuple[CreditRule | None, list[AIRRule] | None]:
    """The credit rule and AIR rules of a record made by :func:`describe` (custom ones left out)."""
    c = spec.get("credit") or {}
    credit: CreditRule | None = None
    if c.get("rule") == "FinalReward":
        credit = FinalReward(add_intermediate=bool(c.get("add_intermediate", False)))
    elif c.get("rule") == "Discounted":
        credit = Discounted(float(c.get("gamma", 1.0)))
    air: list[AIRRule] = []
    for a in spec.get("air") or []:
        if a.get("rule") == "ToolStatus":
            tools = tuple(a["tools"]) if a.get("tools") is not None else None
            air.append(ToolStatus(success=float(a["success"]), error=float(a["error"]), tools=tools))
    return credit, (air or None)


def recorded(store: Store) -> dict[str, Any] | None:
    """The settings recorded by the newest training rollout of ``store`` (``None``: none recorded)."""
    for ro in reversed(store.rollouts(mode="train")):
        spec = ro.metadata.get(KEY) if isinstance(ro.metadata, dict) else None
        if isinstance(spec, dict):
            return spec
    return None
