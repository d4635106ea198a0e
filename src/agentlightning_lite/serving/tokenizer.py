"""A tiny deterministic byte-level tokenizer with a ChatML template, for fast tests without a model.

It mimics the parts of a Hugging Face tokenizer the engines use: ``encode``, ``decode``,
``apply_chat_template``, ``eos_token_id``, ``convert_ids_to_tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Bytes 0-255 are tokens 0-255; ``<|im_start|>`` is 256 and ``<|im_end|>`` (the EOS) is 257.

    >>> tok = ByteTokenizer()
    >>> ids = tok.encode("hé<|im_end|>")
    >>> ids
    [104, 195, 169, 257]
    >>> tok.decode(ids, skip_special_tokens=True), tok.decode(ids)
    ('hé', 'hé<|im_end|>')
    """

    special_tokens: tuple[str, ...] = ("<|im_start|>", "<|im_end|>")
    chat_template = "chatml (built in; no tools)"

    def __init__(self) -> None:
        self._special = {t: 256 + i for i, t in enumerate(self.special_tokens)}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self.special_tokens) + ")")
        self.bos_token, self.eos_token = self.special_tokens[:2]
        self.bos_token_id, self.eos_token_id = 256, 257
        self.pad_token, self.pad_token_id = self.eos_token, self.eos_token_id
        self.vocab_size = 256 + len(self.special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special-token strings map to their ids."""
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._special:
                ids.append(self._special[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD, as in byte-level BPE tokenizers)."""
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens:
                out.append(self.special_tokens[i - 256])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        """The token string(s) of id(s)."""
        if isinstance(ids, int):
            return self.decode([ids])
        return [self.decode([i]) for i in ids]

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **_: Any,
    ) -> Any:
        """ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message."""
        text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text
