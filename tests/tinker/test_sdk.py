"""The official ``tinker`` SDK (0.38) against the server: training, sampling and checkpoints unchanged.

The SDK runs in a Python that has it: this one when ``import tinker`` works (``nox -s tinker``), else the
interpreter named by ``$AGL_TINKER_PYTHON`` (a virtualenv with ``pip install tinker==0.38.0``); without
either the tests are skipped. The tiny model stands in for SmolLM2 under SmolLM2's names (it has its
tokenizer), so ``create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct")`` runs
as a user would write it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.tinker import TinkerServer
from agentlightning_lite.tinker.peft_backend import PeftBackend


def sdk_python() -> str | None:
    """A Python that has the SDK: this one, else ``$AGL_TINKER_PYTHON``; ``None`` without either."""
    if importlib.util.find_spec("tinker") is not None:
        return sys.executable
    return os.environ.get("AGL_TINKER_PYTHON") or None


SDK_PYTHON = sdk_python()
if SDK_PYTHON is None:
    pytest.skip(
        "the tinker SDK is not installed here: run `nox -s tinker`, or set AGL_TINKER_PYTHON to a Python "
        "with `pip install tinker==0.38.0`",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def smol_server(tiny_smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    from agentlightning_lite.serving.engines import HFEngine

    engine = HFEngine(str(tiny_smol), num_threads=1, seed=0)
    backend = PeftBackend(engine, ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"], str(tiny_smol))
    server = TinkerServer(backend, tmp_path_factory.mktemp("tinker-sdk"), api_key="tml-test-key").start()
    yield server
    server.close()


def run_sdk(server: TinkerServer, body: str, timeout: float = 240) -> dict[str, Any]:
    """Run ``body`` (it has ``tinker``, ``types``, ``sc`` the ServiceClient and ``out``, a dict it fills)
    with the SDK's Python; ``out`` comes back."""
    script = "import json, sys, warnings\nwarnings.simplefilter('ignore')\n"
    script += "import tinker\nfrom tinker import types\n"
    script += f"sc = tinker.ServiceClient(base_url={server.url!r}, api_key='tml-test-key')\nout = {{}}\n"
    script += textwrap.dedent(body) + "\nsc.close('success')\n"
    script += "print('RESULT ' + json.dumps(out), flush=True)\n"
    # the SDK's background threads can abort the interpreter as it finalises (SIGABRT after every result
    # was printed): the client's work is done by then, so the script leaves without finalising
    script += "import os\nos._exit(0)\n"
    env = {**os.environ, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("TINKER_BASE_URL", None)
    proc = subprocess.run(
        [str(SDK_PYTHON), "-c", script], capture_output=True, text=True, timeout=timeout, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return dict(json.loads(lines[-1][len("RESULT ") :]))


TRAIN = """
tc = sc.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=4).result()
tok = tc.get_tokenizer()
out["eos"] = tok.eos_token_id
ids = tok.encode("The quick brown fox jumps over the lazy dog")
datum = types.Datum(
    model_input=types.ModelInput.from_ints(ids[:-1]),
    loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
)
out["losses"], out["n_logprobs"] = [], []
for _ in range(5):
    fb = tc.forward_backward([datum], "cross_entropy")
    step = tc.optim_step(types.AdamParams(learning_rate=1e-3))
    result = fb.result()
    step.result()
    out["losses"].append(result.metrics["loss:sum"])
    out["n_logprobs"].append(len(result.loss_fn_outputs[0]["logprobs"].tolist()))
out["n_targets"] = len(ids) - 1
"""


def test_sdk_trains_with_cross_entropy_and_reads_the_tokenizer(smol_server: TinkerServer) -> None:
    out = run_sdk(smol_server, TRAIN)
    assert out["eos"] == 2  # SmolLM2's <|im_end|>, from the tokenizer get_info names
    assert out["n_logprobs"] == [out["n_targets"]] * 5
    losses = out["losses"]
    assert all(b < a for a, b in itertools.pairwise(losses)) and losses[-1] < losses[0] - 0.5, losses


SAMPLE = """
tc = sc.create_lora_training_client(base_model="smollm2-135m", rank=4).result()  # the short name
out["base"] = tc.get_info().model_data.model_name
sampler = tc.save_weights_and_get_sampling_client()
prompt = types.ModelInput.from_ints([1, 504, 3, 28, 9])
params = types.SamplingParams(max_tokens=5, seed=11, temperature=1.0)
res = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
out["seqs"] = [[s.tokens, s.stop_reason, len(s.logprobs), s.sequence_id] for s in res.sequences]
stop = types.SamplingParams(max_tokens=40, seed=1, stop=["e"])
out["stopped"] = [[s.tokens, s.stop_reason] for s in sampler.sample(prompt, 1, stop).result().sequences]
out["prompt_logprobs"] = sampler.compute_logprobs(prompt).result()
"""


def test_sdk_samples_from_a_snapshot_and_computes_logprobs(smol_server: TinkerServer) -> None:
    out = run_sdk(smol_server, SAMPLE)
    assert out["base"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    seqs = out["seqs"]
    assert [(len(t), why, n) for t, why, n, _ in seqs] == [(5, "length", 5)] * 3
    assert len({sid for *_, sid in seqs}) == 3
    tokens, why = out["stopped"][0]
    text = smol_server.backend.engine.decode(tokens)  # type: ignore[attr-defined]
    assert why == "stop" and "e" in text
    assert out["prompt_logprobs"][0] is None and len(out["prompt_logprobs"]) == 5


CHECKPOINTS = """
tc = sc.create_lora_training_client(base_model="smollm2-135m", rank=4).result()
ids = [1, 504, 3, 28, 9, 31]
rl = types.Datum(
    model_input=types.ModelInput.from_ints(ids[:-1]),
    loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [-11.0] * 5, "advantages": [1.0] * 5},
)
out["is_loss"] = tc.forward_backward([rl], "importance_sampling").result().metrics["loss:sum"]
tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
saved = tc.save_state("step-1").result().path
out["path"] = saved
lp = tc.forward([rl], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].tolist()
resumed = sc.create_training_client_from_state_with_optimizer(saved).result()
out["resumed_info"] = resumed.get_info().lora_rank
again = resumed.forward([rl], "importance_sampling").result()
out["same_logprobs"] = again.loss_fn_outputs[0]["logprobs"].tolist() == lp
sampler_path = tc.save_weights_for_sampler("final").result().path
out["sampler_path"] = sampler_path
sampler = sc.create_sampling_client(model_path=sampler_path)
res = sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(max_tokens=3)).result()
out["sampled"] = len(res.sequences[0].tokens)
try:
    tc.forward_backward([rl], "dro").result()
except tinker.RequestFailedError as exc:
    out["error"] = str(exc)
"""


def test_sdk_saves_resumes_and_gets_errors_that_name_the_cause(smol_server: TinkerServer) -> None:
    out = run_sdk(smol_server, CHECKPOINTS)
    assert out["is_loss"] < 0  # -sum(exp(lp - old) * A) with A = 1
    assert out["path"].startswith("tinker://") and out["path"].endswith("/weights/step-1")
    assert out["resumed_info"] == 4 and out["same_logprobs"] is True
    assert out["sampler_path"].endswith("/sampler_weights/final") and out["sampled"] == 3
    assert "loss_fn 'dro' is not served here" in out["error"]
