"""One LoRA adapter per agent on one base model: routing, separate updates, a frozen agent, checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import grads_at_step, lora_weights

TARGETS = ["q_proj", "v_proj", "down_proj"]
LR = 1e-2


@pytest.fixture
def engine(tiny_llama: Any) -> Iterator[Any]:
    from agentlightning_lite.serving.engines import HFEngine

    eng = HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), seed=0, model_name="tiny", max_batch_size=16)
    yield eng
    eng.close()


def ask(llm: agl.LLM, agent: str, text: str, temperature: float) -> Any:
    return (
        llm.for_agent(agent)
        .openai_client()
        .chat.completions.create(
            model=llm.model,
            max_tokens=6,
            temperature=temperature,
            logprobs=True,
            messages=[{"role": "user", "content": text}],
        )
    )


def writer_rewriter_checker(task: dict, llm: agl.LLM) -> float:
    draft = ask(llm, "writer", task["q"], 1.0).choices[0].message.content or ""
    ask(llm, "checker", "check: " + task["q"], 0.0)  # frozen: the base model, greedy
    final = ask(llm, "rewriter", "rewrite: " + draft, 1.0).choices[0].message.content or ""
    # a spread within every group, so both policies learn: a group's rewards are equal only when its
    # sampled texts are (counting distinct characters alone, 4 rollouts sometimes tied: no update ran)
    text = draft + final
    return (len(set(text)) + sum(map(ord, text)) % 101 / 101) / 13.0


def test_two_agents_with_separate_adapters_train_separately_and_the_frozen_agent_is_untouched(
    engine: Any, tmp_path: Path
) -> None:
    trainer = agl.Trainer(
        engine=engine,
        policies={
            "writer": agl.LoRA(r=4, alpha=8, target_modules=TARGETS),
            "rewriter": agl.LoRA(r=2, alpha=4, target_modules=TARGETS),
        },
        algorithm=agl.GRPO(group_size=4, lr=LR),
        batch_size=1,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
        seed=0,
    )
    model = trainer.policy
    assert sorted(engine.adapters) == ["rewriter", "writer"]
    assert trainer.policies == {"writer": ["writer"], "rewriter": ["rewriter"]}
    assert engine.adapter_for("writer") == "writer" and engine.adapter_for("checker") is None
    before = {a: lora_weights(model, a) for a in ("writer", "rewriter")}
    assert all(len(w) == 2 * 3 * 2 for w in before.values())  # A and B, 3 modules, 2 layers

    # what the frozen checker says before training, read back through the server
    with trainer.rollouts.serving():
        ro = trainer.store.start_rollout("probe", mode="trace")
        probe_before = ask(trainer.rollouts.server.llm(ro.rollout_id), "checker", "check: 2+2?", 0.0)

    # record which samples and which gradients each policy's update saw
    seen: list[tuple[str, list[Any], dict[str, torch.Tensor | None]]] = []
    original = trainer.learner.optimise

    def spy(samples: list[Any], policy: Any = None, m: Any = None, **kw: Any) -> dict[str, float]:
        named = [(n, p) for n, p in m.named_parameters() if "lora_" in n]
        with grads_at_step(policy.optimizer, named) as at_step:  # the step zeroes them after
            out = original(samples, policy, m, **kw)
        seen.append((policy.name, list(samples), {n: at_step.get(n) for n, _ in named}))
        return out

    trainer.learner.optimise = spy  # type: ignore[method-assign]
    out = trainer.fit(writer_rewriter_checker, [{"q": "Say hi."}], steps=1)
    assert [name for name, _, _ in seen] == ["writer", "rewriter"]
    for name, samples, grads in seen:
        assert {s.agent for s in samples} == {name} and len(samples) == 4  # one call per rollout
        mine = {n: g for n, g in grads.items() if f".{name}." in n}
        others = {n: g for n, g in grads.items() if f".{name}." not in n}
        # only this policy's adapter got a gradient in its update (the other's is cleared or absent)
        assert all(g is not None for g in mine.values()) and any(
            float(g.abs().max()) > 0 for g in mine.values()
        )
        if name == "writer":
            assert all(g is None for g in others.values())
        # each adapter moved by its own gradient: AdamW's first step is exactly -lr * g / (|g| + eps)
        after = lora_weights(model, name)
        for n, g in mine.items():
            assert g is not None
            torch.testing.assert_close(
                after[n] - before[name][n], -LR * g / (g.abs() + 1e-8), rtol=1e-4, atol=1e-7
            )
        assert sum(int((after[n] != before[name][n]).sum()) for n in after) > 0

    # per-policy metrics
    for name in ("writer", "rewriter"):
        assert out[f"{name}/train/samples"] == 4.0 and out[f"{name}/grpo/groups"] == 1.0
        assert out[f"{name}/train/grad_norm"] > 0
    assert "train/loss" in out

    # the server served each call with the agent's adapter, and recorded it on the span
    spans = [s for r in trainer.store.rollouts(mode="train") for s in trainer.store.spans(r.rollout_id)]
    llm_spans = [s for s in spans if s.kind == "llm"]
    assert len(llm_spans) == 12
    assert {(s.agent, s.attributes["adapter"]) for s in llm_spans} == {
        ("writer", "writer"),
        ("rewriter", "rewriter"),
        ("checker", None),
    }

    # the frozen agent's outputs are bit-identical after the step
    with trainer.rollouts.serving():
        ro = trainer.store.start_rollout("probe", mode="trace")
        probe_after = ask(trainer.rollouts.server.llm(ro.rollout_id), "checker", "check: 2+2?", 0.0)
    lp = [t.logprob for t in probe_before.choices[0].logprobs.content]
    assert lp == [t.logprob for t in probe_after.choices[0].logprobs.content] and len(lp) > 0
    assert probe_before.choices[0].message.content == probe_after.choices[0].message.content
    # ...while the trained writer's are not
    w_before = {n: before["writer"][n] for n in before["writer"]}
    assert any(not torch.equal(w_before[n], p) for n, p in lora_weights(model, "writer").items())

    # a saved adapter per policy, and a checkpoint that restores both
    saved = trainer.save()
    assert sorted(p.name for p in saved.iterdir()) == ["rewriter", "writer"]
    assert (saved / "writer" / "adapter_config.json").is_file()
    ckpt = trainer.save_checkpoint()
    assert (ckpt / "policies" / "rewriter" / "optimizer.pt").is_file()
    trained = {a: lora_weights(model, a) for a in ("writer", "rewriter")}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(1.0)
    from agentlightning_lite.rl.checkpoint import load_checkpoint

    load_checkpoint(ckpt, model, None, policies=trainer.learner.states())
    for a in ("writer", "rewriter"):
        assert all(torch.equal(trained[a][n], w) for n, w in lora_weights(model, a).items())
    trainer.close()


def test_shared_and_frozen_adapter_policies(engine: Any, tmp_path: Path, tiny_llama: Any) -> None:
    """``{"writer": LoRA, "rewriter": "writer"}`` is one adapter; a saved adapter is served frozen."""
    import peft

    frozen_dir = tmp_path / "checker-adapter"
    donor = peft.get_peft_model(tiny_llama(), agl.LoRA(r=2, target_modules=TARGETS).to_peft_config())
    with torch.no_grad():
        for n, p in donor.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    donor.save_pretrained(str(frozen_dir))

    trainer = agl.Trainer(
        engine=engine,
        policies={
            "writer": agl.LoRA(r=4, target_modules=TARGETS),
            "rewriter": "writer",
            "checker": str(frozen_dir),
        },
        algorithm=agl.GRPO(group_size=2, lr=LR),
        batch_size=1,
        store=agl.MemoryStore(),
        output_dir=tmp_path / "run",
        logging_config=LoggingConfig(loggers=[]),
    )
    assert trainer.policies == {"writer": ["writer", "rewriter"]}
    assert (engine.adapter_for("rewriter"), engine.adapter_for("checker")) == ("writer", "checker")
    frozen_before = lora_weights(trainer.policy, "checker")
    assert frozen_before and any(float(w.abs().max()) > 0 for n, w in frozen_before.items() if "lora_B" in n)
    out = trainer.fit(writer_rewriter_checker, [{"q": "Say hi."}], steps=1)
    assert out["writer/train/samples"] == 4.0  # the writer's and the rewriter's calls, 2 rollouts
    assert all(torch.equal(frozen_before[n], w) for n, w in lora_weights(trainer.policy, "checker").items())
    adapters = {
        (s.agent, s.attributes["adapter"])
        for r in trainer.store.rollouts(mode="train")
        for s in trainer.store.spans(r.rollout_id)
        if s.kind == "llm"
    }
    assert adapters == {("writer", "writer"), ("rewriter", "writer"), ("checker", "checker")}
    trainer.close()


def test_bad_policies_are_clear_errors(tmp_path: Path) -> None:
    from agentlightning_lite.serving.engines import ScriptedEngine

    lora = agl.LoRA(r=4)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"policies": {"writer": lora}, "agents": ["writer"]}, ValueError, "policies= or agents=, not both"),
        ({"policies": {"writer": lora}, "lora": agl.LoRA()}, ValueError, "lora= is the single shared"),
        ({"policies": {}}, ValueError, "policies must map agent names"),
        ({"policies": {"writer": None}}, ValueError, "nothing to train"),
        ({"policies": {"writer": lora, "rewriter": "checker"}}, ValueError, "neither another agent"),
        ({"policies": {"writer": lora, "a": None, "b": "a"}}, ValueError, "has no agl.LoRA"),
        ({"policies": {"writer": 16}}, TypeError, "must be agl.LoRA"),
        ({"policies": {"a.b": lora, "a_b": lora}}, ValueError, "same adapter name"),
        (
            {"policies": {"writer": lora}, "engine": ScriptedEngine(["x"], tokenizer="bytes")},
            TypeError,
            "cannot .pass engine='hf'",
        ),
    ]
    for kwargs, exc, match in cases:
        kwargs.setdefault("engine", "hf")
        with pytest.raises(exc, match=match):
            agl.Trainer(
                store=agl.MemoryStore(),
                output_dir=tmp_path,
                logging_config=LoggingConfig(loggers=[]),
                **kwargs,
            )


def test_hf_engine_batches_requests_by_adapter(engine: Any) -> None:
    """Requests of different agents decoded in one engine batch give what each gives alone."""
    from agentlightning_lite.serving.engines.base import GenRequest

    engine.add_adapter("a", agl.LoRA(r=2, target_modules=TARGETS))
    engine.add_adapter("b", agl.LoRA(r=2, target_modules=TARGETS))
    with torch.no_grad():
        for n, p in engine.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    engine.set_routes({"alice": "a", "bob": "b"})  # anyone else: the base model
    prompt = ByteTokenizer().encode("hello there")
    reqs = [GenRequest(prompt, max_tokens=5, temperature=0.0, agent=who) for who in ("alice", "bob", "carol")]
    alone = [engine.generate([r])[0] for r in reqs]
    engine.reset_stats()
    engine.expect(3)
    together = engine.generate(reqs)
    assert engine.stats["batches"] == 1  # one engine batch, decoded one adapter at a time
    assert [r.adapter for r in together] == ["a", "b", None]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert len({tuple(r.token_ids) for r in alone}) > 1  # the adapters really differ
    with pytest.raises(KeyError, match="unknown adapter"):
        engine.set_routes({"alice": "nope"})
