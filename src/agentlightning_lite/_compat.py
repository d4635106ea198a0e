"""Warnings of the libraries underneath that say nothing to a user of this package.

peft (0.21) reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model, so
transformers (5.23) warns on every ``get_peft_model``/``PeftModel.from_pretrained``, whoever asked for
it; this package reads ``is_activation_checkpointing`` itself.
"""

from __future__ import annotations

import warnings

__all__ = ["quiet_upstream_warnings"]


def quiet_upstream_warnings() -> None:
    """Filter the warnings above (only those messages; idempotent).

    >>> quiet_upstream_warnings()
    """
    warnings.filterwarnings(
        "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
