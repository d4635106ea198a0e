"""The protobuf messages of the Tinker API: the ``forward_backward`` request body and the two results
sent as protobuf (``ForwardBackwardOutput``, ``SampleResponse``).

The schema is declared here, field numbers as in the SDK's ``tinker_public.proto`` (0.38), so the
server needs ``protobuf`` but not the SDK. Only what the server reads or writes is declared; a chunk
other than encoded text (an image) is still recognised, so that it can be refused by name.

>>> body = encode_forward_backward_request(
...     "m", 3, [Datum([1, 2], {"target_tokens": [2, 3], "weights": [1.0, 0.5]})], "cross_entropy"
... )
>>> req = decode_forward_backward_request(body)
>>> req.seq_id, req.loss_fn, req.data[0].tokens, req.data[0].inputs["weights"]
(3, 'cross_entropy', [1, 2], [1.0, 0.5])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .backend import Datum, ForwardBackwardResult, SampledSequence
from .futures import OpError

__all__ = [
    "ForwardBackwardRequest",
    "decode_forward_backward_request",
    "encode_forward_backward_output",
    "encode_forward_backward_request",
    "encode_sample_response",
]

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "agl_tinker_wire"

# message -> [(number, name, type, label, message type name or None)]
_SCHEMA: dict[str, list[tuple[int, str, int, int, str | None]]] = {
    "SparseCsr": [
        (1, "values", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (2, "crow_indices", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (3, "col_indices", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
    ],
    "Tensor": [
        (1, "dense", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (2, "sparse_csr", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "SparseCsr"),
        (3, "dtype", _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),  # the DType enum, read as its number
        (4, "shape", _F.TYPE_INT64, _F.LABEL_REPEATED, None),
    ],
    "EncodedTextChunk": [(1, "tokens", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None)],
    # image (2) and dmel (3) are messages in the SDK; read as bytes they are only recognised
    "Chunk": [
        (1, "encoded_text", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "EncodedTextChunk"),
        (2, "image", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (3, "dmel", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
    ],
    "InputEntry": [
        (1, "key", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "value", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "Tensor"),
    ],
    "Datum": [
        (1, "model_input", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Chunk"),
        (2, "loss_fn_inputs", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "InputEntry"),
    ],
    "ConfigEntry": [
        (1, "key", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "value", _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, None),
    ],
    "LossConfigValue": [
        (1, "number", _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, None),
        (2, "text", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "ConfigV2Entry": [
        (1, "key", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "value", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "LossConfigValue"),
    ],
    "ForwardBackwardRequest": [
        (1, "model_id", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "seq_id", _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        (3, "data", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Datum"),
        (4, "loss_fn", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (5, "loss_fn_config", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ConfigEntry"),
        (6, "forward_only", _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        (7, "loss_fn_config_v2", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ConfigV2Entry"),
    ],
    "BatchedTensor": [
        (1, "data", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (2, "offsets", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (3, "dtype", _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        (4, "trailing_shape", _F.TYPE_INT64, _F.LABEL_REPEATED, None),
    ],
    "FieldEntry": [
        (1, "key", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "value", _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "BatchedTensor"),
    ],
    "ArrayRecord": [
        (1, "type_tag", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "fields", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "FieldEntry"),
        (3, "num_datums", _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
    ],
    "MetricEntry": [
        (1, "key", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "value", _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, None),
    ],
    "ForwardBackwardOutput": [
        (1, "loss_fn_output_type", _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        (2, "loss_fn_outputs", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ArrayRecord"),
        (3, "metrics", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "MetricEntry"),
    ],
    "SampledSequence": [
        (1, "stop_reason", _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        (2, "tokens", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (3, "logprobs", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
    ],
    "SampleResponse": [
        (1, "sequences", _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "SampledSequence"),
        (2, "prompt_logprobs", _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        (4, "prompt_cache_hit_tokens", _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
    ],
}

# the DType enum of the schema
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
_NUMPY = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}
STOP_REASONS = {"stop": 0, "length": 1}


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="agl_tinker_wire.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _SCHEMA.items():
        msg = file.message_type.add(name=name)
        for number, fname, ftype, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name is not None:
                f.type_name = f".{_PACKAGE}.{type_name}"
        if name in ("Tensor", "Chunk", "LossConfigValue"):  # the oneofs of the schema
            msg.oneof_decl.add(name="kind")
            for f in msg.field:
                if (name, f.name) not in (("Tensor", "dtype"), ("Tensor", "shape")):
                    f.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _SCHEMA
    }


_MESSAGES = _build()


@dataclass
class ForwardBackwardRequest:
    """A decoded ``/forward_backward`` body."""

    model_id: str
    seq_id: int
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float]
    forward_only: bool


def _tensor_values(name: str, tensor: Any) -> list[float]:
    if tensor.WhichOneof("kind") == "sparse_csr":
        raise OpError(
            f"loss_fn_inputs[{name!r}] is a sparse tensor: this server takes dense 1-D loss inputs only"
        )
    dtype = _NUMPY.get(tensor.dtype)
    if dtype is None:
        raise OpError(f"loss_fn_inputs[{name!r}] has dtype {tensor.dtype}: float32, int64 or int32 expected")
    size = np.dtype(dtype).itemsize
    if len(tensor.dense) % size:
        raise OpError(
            f"loss_fn_inputs[{name!r}] holds {len(tensor.dense)} bytes: not a whole number of "
            f"{np.dtype(dtype).name} values ({size} bytes each)"
        )
    values = np.frombuffer(tensor.dense, dtype=dtype)
    if len(tensor.shape) > 1:
        raise OpError(
            f"loss_fn_inputs[{name!r}] has shape {list(tensor.shape)}: this server takes 1-D loss inputs only"
        )
    if len(tensor.shape) == 1 and tensor.shape[0] != len(values):
        raise OpError(
            f"loss_fn_inputs[{name!r}] has shape {list(tensor.shape)} but holds {len(values)} values"
        )
    if name == "target_tokens" and not np.issubdtype(values.dtype, np.integer):
        if not (np.isfinite(values).all() and (values == np.round(values)).all()):
            raise OpError("loss_fn_inputs['target_tokens'] must hold whole token ids")
    out: list[float] = [int(v) for v in values] if name == "target_tokens" else [float(v) for v in values]
    return out


def decode_forward_backward_request(body: bytes) -> ForwardBackwardRequest:
    """Parse a protobuf ``ForwardBackwardRequest``; an :class:`~.futures.OpError` names what it cannot
    take (image chunks, sparse or 2-D loss inputs, a body that is not the message)."""
    msg = _MESSAGES["ForwardBackwardRequest"]()
    try:
        msg.ParseFromString(body)
    except Exception as exc:
        raise OpError(f"the forward_backward body is not a protobuf ForwardBackwardRequest: {exc}") from exc
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("kind")
            if kind != "encoded_text":
                raise OpError(f"data[{i}] has a {kind or 'empty'} chunk: this server takes encoded text only")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise OpError(
                    f"data[{i}] has an encoded_text chunk of {len(raw)} bytes: not a whole number of int32 "
                    "token ids"
                )
            tokens.extend(int(t) for t in np.frombuffer(raw, dtype=np.int32))
        inputs = {e.key: _tensor_values(e.key, e.value) for e in d.loss_fn_inputs}
        data.append(Datum(tokens, inputs))
    config = {e.key: float(e.value) for e in msg.loss_fn_config}
    for e in msg.loss_fn_config_v2:
        if e.value.WhichOneof("kind") == "number":
            config[e.key] = float(e.value.number)
        else:
            raise OpError(f"loss_fn_config[{e.key!r}] is text ({e.value.text!r}): a number is expected")
    return ForwardBackwardRequest(
        msg.model_id, int(msg.seq_id), data, msg.loss_fn, config, bool(msg.forward_only)
    )


def encode_forward_backward_request(
    model_id: str,
    seq_id: int,
    data: list[Datum],
    loss_fn: str,
    loss_fn_config: dict[str, float] | None = None,
    forward_only: bool = False,
) -> bytes:
    """The protobuf body the SDK sends to ``/forward_backward`` (for tests and other clients);
    ``target_tokens`` go as int64, the other inputs as float32."""
    msg = _MESSAGES["ForwardBackwardRequest"](
        model_id=model_id, seq_id=seq_id, loss_fn=loss_fn, forward_only=forward_only
    )
    for d in data:
        datum = msg.data.add()
        datum.model_input.add().encoded_text.tokens = np.asarray(d.tokens, dtype=np.int32).tobytes()
        for key, values in d.inputs.items():
            entry = datum.loss_fn_inputs.add(key=key)
            dtype, code = (np.int64, DTYPE_INT64) if key == "target_tokens" else (np.float32, DTYPE_FLOAT32)
            entry.value.dense = np.asarray(values, dtype=dtype).tobytes()
            entry.value.dtype = code
            entry.value.shape.append(len(values))
    for key, value in (loss_fn_config or {}).items():
        msg.loss_fn_config.add(key=key, value=value)
    return bytes(msg.SerializeToString())


def encode_forward_backward_output(result: ForwardBackwardResult) -> bytes:
    """A ``ForwardBackwardOutput``: one batched ``ArrayRecord`` of float32 fields, and the metrics."""
    msg = _MESSAGES["ForwardBackwardOutput"](loss_fn_output_type="ArrayRecord")
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(result.outputs))
    names = list(result.outputs[0]) if result.outputs else []
    for name in names:
        arrays = [np.asarray(out[name], dtype=np.float32) for out in result.outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        field = record.fields.add(key=name)
        field.value.data = b"".join(a.tobytes() for a in arrays)
        field.value.offsets = offsets.tobytes()
        field.value.dtype = DTYPE_FLOAT32
    for key, value in result.metrics.items():
        msg.metrics.add(key=key, value=float(value))
    return bytes(msg.SerializeToString())


def encode_sample_response(
    sequences: list[SampledSequence], prompt_logprobs: list[float | None] | None = None
) -> bytes:
    """A ``SampleResponse``: int32 tokens and float32 logprobs per sequence; the prompt logprobs
    (NaN where there is none: the first token) when asked for."""
    msg = _MESSAGES["SampleResponse"]()
    for seq in sequences:
        msg.sequences.add(
            stop_reason=STOP_REASONS[seq.stop_reason],
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        values = [float("nan") if v is None else v for v in prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return bytes(msg.SerializeToString())


def decode_message(name: str, body: bytes) -> Any:
    """Parse ``body`` as the schema's message ``name`` (tests read results with it)."""
    msg = _MESSAGES[name]()
    msg.ParseFromString(body)
    return msg
