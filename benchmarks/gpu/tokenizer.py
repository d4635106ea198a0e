"""A byte-level tokenizer built in code for any vocabulary size: no download, a ``transformers`` tokenizer.

Ids 0-255 are the 256 bytes (GPT-2's byte-level alphabet), 256 is ``<|im_start|>``, 257 ``<|im_end|>``
(the EOS and padding token), and ids from 258 up to the model's vocabulary size are filler tokens
``<t258>``... that encoding never produces but a random-weight model can sample (they decode to their
name). A ChatML chat template makes it usable by the HF engine, the PolicyServer and TRL alike.

>>> tok = byte_tokenizer(300)
>>> len(tok), tok.eos_token_id, tok.pad_token_id
(300, 257, 257)
>>> ids = tok("hi", add_special_tokens=False).input_ids
>>> ids, tok.decode(ids + [299])
([104, 105], 'hi<t299>')
"""

from __future__ import annotations

from typing import Any

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(vocab_size: int) -> Any:
    """A ``PreTrainedTokenizerFast`` over bytes with ``vocab_size`` ids (at least 258)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 258:
        raise ValueError(f"vocab_size must be at least 258 (bytes + 2 special tokens), got {vocab_size}")
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab.update({"<|im_start|>": 256, "<|im_end|>": 257})
    vocab.update({f"<t{i}>": i for i in range(258, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # already in the vocabulary at 256 and 257: this marks them special (never split, skippable)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        padding_side="left",
    )
    fast.chat_template = CHATML
    return fast


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (what the ByteLevel pre-tokenizer emits)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}
