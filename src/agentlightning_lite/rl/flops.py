"""What an update computes, in model FLOPs: the figure its achieved FLOP/s (and so its share of the
machine's measured matrix throughput) is taken from."""

from __future__ import annotations

from typing import Any

__all__ = ["UpdateFlops", "update_flops"]


class UpdateFlops:
    """The matrix FLOPs per token of a decoder's linear layers and of its output layer.

    Counted as model FLOPs (as MFU is): a forward pass is ``2 * params`` per token through the
    decoder's linear layers, plus ``2 * hidden * vocab`` per position the output layer scores; the
    backward pass of a frozen base with LoRA computes input gradients only, as many FLOPs again
    (the adapters' own gradients are negligible). Attention's score and value products and the
    recomputation of gradient checkpointing are not counted.

    >>> f = UpdateFlops(linear_params=1000, head_params=100)
    >>> f.forward(tokens=10, scored=2), f.forward_backward(tokens=10, scored=2)
    (20400, 40800)
    """

    def __init__(self, linear_params: int, head_params: int) -> None:
        self.linear_params = linear_params
        self.head_params = head_params

    def forward(self, tokens: int, scored: int) -> int:
        return 2 * self.linear_params * tokens + 2 * self.head_params * scored

    def forward_backward(self, tokens: int, scored: int) -> int:
        return 2 * self.forward(tokens, scored)


def update_flops(model: Any) -> UpdateFlops:
    """The FLOP counts of ``model`` (a peft model or not; its LoRA weights are not counted)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    embed = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    skip = {id(p) for m in (head, embed) if m is not None for p in m.parameters()}
    linear = sum(p.numel() for n, p in base.named_parameters() if id(p) not in skip and "lora_" not in n)
    head_params = int(head.weight.numel()) if head is not None and hasattr(head, "weight") else 0
    return UpdateFlops(int(linear), head_params)
