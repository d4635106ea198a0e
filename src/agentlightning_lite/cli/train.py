"""``agl-lite train``: run ``Trainer.fit`` on an agent given as ``module:function``, or on an environment."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ._common import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    Out,
    add_parser_flags,
    air_rules,
    fmt_num,
    json_default,
    name_list,
    parse_credit,
    parser_options,
    print_error,
)


def add_parser(sub: Any) -> None:
    train = sub.add_parser(
        "train",
        help="train an agent (module:function) on a dataset file with GRPO or PPO on LoRA",
        description=(
            "Train an agent with agl.Trainer(...).fit(agent, dataset). AGENT is 'module:function' "
            "(imported with the current directory on sys.path), 'path/to/file.py:function', or the name "
            "of a benchmark package under benchmarks/ that provides `agent` and `load_dataset(split, "
            "data_dir=None)`. A `prepare(tasks)` function next to the agent, when there is one, runs "
            "once before training (to build an index, say). The agent is a function (task, llm) -> "
            "reward or an agl.LitAgent. The dataset is a JSONL file (one task per line) or a JSON list. "
            "With --env KIND:NAME (reasoning_gym:basic_arithmetic, textarena:GuessTheNumber-v0, "
            "nemo_gym:http://127.0.0.1:8000 with --data rows.jsonl, openenv:http://127.0.0.1:8000, "
            "verifiers:my_tasks.py:load_taskset) an environment supplies the tasks and "
            "the reward, and its default agent plays them unless AGENT is given (docs/environments.md)."
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument(
        "agent",
        metavar="AGENT",
        nargs="?",
        default=None,
        help="module:function, file.py:function, or a benchmark name (optional with --env)",
    )
    train.add_argument(
        "--env",
        default=None,
        metavar="KIND:NAME",
        help=(
            "an environment: reasoning_gym:DATASET, textarena:GAME, nemo_gym:URL (tasks in --data), "
            "openenv:URL (reset arguments in --data, else seeds) or verifiers:TASKSET (pkg.module:name, "
            "file.py:name or a verifiers taskset id)"
        ),
    )
    train.add_argument(
        "--env-size", type=int, default=100, help="--env: training tasks to generate (default 100)"
    )
    train.add_argument(
        "--action-from-reply",
        default=None,
        metavar="MODULE:FUNCTION",
        help="--env openenv:URL: the function (module:function or file.py:function) that makes the "
        "model's reply into the action dict, for an action that is not one text field",
    )
    train.add_argument(
        "--unreadable-reward",
        type=float,
        default=None,
        metavar="R",
        help="--env openenv:URL: a reply that makes no valid action ends its episode with reward R "
        "(counted) instead of failing the rollout",
    )
    train.add_argument("--data", default=None, help="training tasks: a .jsonl file or a .json list")
    train.add_argument("--val-data", default=None, help="held-out tasks: success rate before and after")
    train.add_argument("--data-dir", default=None, help="benchmarks: where their data files are")
    train.add_argument("--limit", type=int, default=None, help="use only the first N training tasks")
    train.add_argument("--val-limit", type=int, default=None, help="use only the first N held-out tasks")
    train.add_argument("--model", default="smollm2-135m", help="policy model (default: smollm2-135m)")
    train.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo", help="default: grpo")
    train.add_argument("--steps", type=int, default=None, help="training steps (default: one epoch)")
    train.add_argument("--batch-size", type=int, default=8, help="tasks per step (default 8)")
    train.add_argument("--group-size", type=int, default=4, help="rollouts per task (default 4)")
    train.add_argument(
        "--lr", type=float, default=None, help="learning rate of the adapter (default: the algorithm's)"
    )
    train.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    train.add_argument("--qlora", action="store_true", help="4-bit base weights (QLoRA; CUDA GPU only)")
    train.add_argument("--engine", choices=("auto", "hf", "vllm"), default="auto", help="default: auto")
    train.add_argument(
        "--url",
        nargs="+",
        default=None,
        metavar="URL",
        help="vllm: attach to these running vLLM servers (http://host:port) instead of starting one; they "
        "read the adapters this run writes, so share its --output-dir path",
    )
    train.add_argument(
        "--backend-api-key",
        default=os.environ.get("AGL_BACKEND_API_KEY"),
        help="with --url: the servers' API key (default: $AGL_BACKEND_API_KEY, else none)",
    )
    train.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine option (VALUE read as JSON, else as text), e.g. max_model_len=4096, "
        "gpu_memory_utilization=0.5, check_version=false; repeat for several",
    )
    add_parser_flags(train)
    train.add_argument("--agents", nargs="+", metavar="NAME", help="train only these agents' calls")
    train.add_argument(
        "--credit", type=parse_credit, default=None, metavar="RULE", help="final|discounted[:g]"
    )
    train.add_argument("--tool-success", type=float, default=None, help="AIR: reward for a tool that worked")
    train.add_argument("--tool-error", type=float, default=None, help="AIR: reward for a tool that failed")
    train.add_argument(
        "--concurrency", type=int, default=None, help="rollouts at once (default: a step's, batch x group)"
    )
    train.add_argument(
        "--rollout-timeout",
        type=seconds_or_auto,
        default="auto",
        help="seconds per rollout; auto (default): sized to the engine and the agent's max tokens",
    )
    train.add_argument("--eval-every", type=int, default=0, help="validate every N steps (0 = at the end)")
    train.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0 = never)")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    train.add_argument("--no-baseline", action="store_true", help="skip the evaluation before training")
    train.add_argument(
        "--runners",
        default=None,
        metavar="[HOST:]PORT",
        help="queue rollouts for remote runners (agl-lite runner ... --server http://HOST:PORT) instead of "
        "running the agent in this process; HOST defaults to 127.0.0.1",
    )
    train.add_argument(
        "--api-key",
        default=os.environ.get("AGL_API_KEY"),
        help="with --runners: the key runners must send (default: $AGL_API_KEY, else none)",
    )
    train.add_argument("--prompts", default=None, help="the prompts.json of an agl-lite apo run")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--output-dir", default="runs/agl", help="runs.db, metrics, curve, adapter")
    train.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


# -- agent and dataset loading ----------------------------------------------------------------------
def seconds_or_auto(value: str) -> float | str:
    """``--rollout-timeout``'s value: ``"auto"`` or a number of seconds.

    >>> seconds_or_auto("auto"), seconds_or_auto("60")
    ('auto', 60.0)
    """
    if value == "auto":
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or seconds, got {value!r}") from None


def load_agent(spec: str) -> tuple[Any, Any]:
    """Import ``module:function``, ``file.py:function`` or a benchmark name; returns (agent, module)."""
    from ..rl.rollouts import LitAgent

    if ":" in spec:
        where, _, attr = spec.rpartition(":")
    else:
        where, attr = f"benchmarks.{spec}", "agent"
    agent, module = import_attr(where, attr, f"agent {spec!r}")
    if isinstance(agent, type) and issubclass(agent, LitAgent):
        agent = agent()
    if not callable(agent):
        raise CLIError(f"agent {spec!r} is not callable", EXIT_USAGE)
    return agent, module


def load_function(spec: str, flag: str) -> Any:
    """The function ``module:function`` or ``file.py:function`` names, for option ``flag``."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise CLIError(f"{flag} takes module:function or file.py:function, got {spec!r}", EXIT_USAGE)
    function = import_attr(where, attr, f"{flag} {spec!r}")[0]
    if not callable(function):
        raise CLIError(f"{flag} {spec!r} is not callable", EXIT_USAGE)
    return function


def import_attr(where: str, attr: str, what: str) -> tuple[Any, Any]:
    """``attr`` of the module ``where`` (a dotted name, the current directory on ``sys.path``, or a
    ``.py`` file); returns (attribute, module)."""
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            if not path.is_file():
                raise CLIError(f"no such file: {path}", EXIT_USAGE)
            sys.path.insert(0, str(path.resolve().parent))
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[path.stem] = module
            mod_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise CLIError(f"cannot import {where!r} for {what}: {exc}", EXIT_USAGE) from None
    value = getattr(module, attr, None)
    if value is None:
        raise CLIError(f"{where!r} has no attribute {attr!r}", EXIT_USAGE)
    return value, module


def load_tasks(path: str | os.PathLike[str], limit: int | None = None) -> list[Any]:
    """Tasks from a JSONL file (one per line) or a JSON list."""
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"no such file: {p}", EXIT_USAGE)
    text = p.read_text(encoding="utf-8")
    try:
        stripped = text.lstrip()
        if stripped.startswith("["):
            tasks = json.loads(text)
        else:
            tasks = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise CLIError(f"{p} is neither JSONL nor a JSON list: {exc}", EXIT_USAGE) from None
    if not isinstance(tasks, list):
        raise CLIError(f"{p}: expected a JSON list of tasks", EXIT_USAGE)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise CLIError(f"{p} holds no tasks", EXIT_USAGE)
    return tasks


def prepare_tasks(module: Any, tasks: list[Any]) -> None:
    """Call the agent module's ``prepare(tasks)`` when it defines one, before any rollout runs.

    A benchmark builds what its rollouts share there (MuSiQue: the search index over the corpus),
    so that the first rollouts do not spend their time limit on it.

    >>> import types
    >>> seen = []
    >>> prepare_tasks(types.SimpleNamespace(__name__="m", prepare=seen.extend), [{"q": 1}])
    >>> seen
    [{'q': 1}]
    """
    prepare = getattr(module, "prepare", None)
    if callable(prepare):
        print_error(f"preparing {len(tasks)} tasks with {module.__name__}.prepare()")
        prepare(tasks)


def _engine_choice(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The engine name and ``engine_options`` of ``--engine``, ``--url``, ``--backend-api-key`` and
    ``--engine-option KEY=VALUE``.

    >>> ns = argparse.Namespace(engine="auto", url=["http://gpu:8000"], backend_api_key=None,
    ...                         engine_option=["max_model_len=4096", "check_version=false"])
    >>> _engine_choice(ns)
    ('vllm', {'max_model_len': 4096, 'check_version': False, 'url': ['http://gpu:8000']})
    """
    options: dict[str, Any] = {}
    for item in args.engine_option:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise CLIError(f"--engine-option takes KEY=VALUE, got {item!r}", EXIT_USAGE)
        try:
            options[key] = json.loads(text)
        except json.JSONDecodeError:
            options[key] = text
    engine = args.engine
    if args.url:
        if engine == "hf":
            raise CLIError("--url attaches to vLLM servers: use it with --engine vllm", EXIT_USAGE)
        engine = "vllm"
        options["url"] = list(args.url)
        if args.backend_api_key:
            options["api_key"] = args.backend_api_key
    return engine, options


def agent_tasks(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any] | None]:
    """AGENT with ``--data``/``--val-data`` (or a benchmark's own datasets): agent, tasks, held-out."""
    agent, module = load_agent(args.agent)
    if args.data is not None:
        tasks = load_tasks(args.data, args.limit)
    elif hasattr(module, "load_dataset"):
        tasks = list(module.load_dataset("train", data_dir=args.data_dir))[: args.limit]
    else:
        raise CLIError("--data FILE is required (a .jsonl file or a .json list of tasks)", EXIT_USAGE)
    val = None
    if args.val_data is not None:
        val = load_tasks(args.val_data, args.val_limit)
    elif args.data is None and hasattr(module, "load_dataset"):
        val = list(module.load_dataset("val", data_dir=args.data_dir))[: args.val_limit]
    prepare_tasks(module, tasks + (val or []))
    return agent, tasks, val


def env_tasks(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any] | None]:
    """``--env``: the environment's agent (or AGENT's), its training tasks and its held-out tasks.

    Held-out tasks come from ``--val-data``, else (reasoning-gym, TextArena, OpenEnv without
    ``--data``) ``--val-limit`` tasks generated from another seed, or (verifiers) the ``--val-limit``
    tasks that follow the training ones in the shuffled taskset, else none.
    """
    from ..envs import make

    kind = args.env.partition(":")[0].strip().lower().replace("-", "_")
    split = kind == "verifiers" and args.val_data is None and bool(args.val_limit)
    options = env_options(args, kind)
    try:
        size = args.env_size + (args.val_limit if split else 0)
        env = make(args.env, size=size, seed=args.seed, data=args.data, **options)
        held_out = env.tasks[args.env_size :] if split else None
        generated = kind not in ("nemo_gym", "verifiers") and not (kind == "openenv" and args.data)
        if args.val_data is None and args.val_limit and generated:
            held_out = make(args.env, size=args.val_limit, seed=args.seed + 1_000_003, **options).tasks
    except (ValueError, ImportError, RuntimeError, OSError, KeyError, TypeError) as exc:
        raise CLIError(f"--env {args.env}: {exc}", EXIT_USAGE) from None
    agent = env.agent if args.agent is None else load_agent(args.agent)[0]
    tasks = env.tasks[: args.env_size][: args.limit]
    val = load_tasks(args.val_data, args.val_limit) if args.val_data is not None else held_out
    if not tasks:
        raise CLIError(f"--env {args.env} gave no tasks", EXIT_USAGE)
    return agent, tasks, val


def env_options(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """The environment's options from ``--action-from-reply`` and ``--unreadable-reward`` (OpenEnv's).

    >>> env_options(argparse.Namespace(env="openenv:http://h:8000", unreadable_reward=-1.0), "openenv")
    {'unreadable_reward': -1.0}
    >>> env_options(argparse.Namespace(env="textarena:GuessTheNumber-v0"), "textarena")
    {}
    """
    given = {
        "--action-from-reply": getattr(args, "action_from_reply", None),
        "--unreadable-reward": getattr(args, "unreadable_reward", None),
    }
    if kind != "openenv":
        if flags := [flag for flag, value in given.items() if value is not None]:
            verb = "applies" if len(flags) == 1 else "apply"
            raise CLIError(f"{' and '.join(flags)} {verb} to --env openenv:URL, not {args.env}", EXIT_USAGE)
        return {}
    options: dict[str, Any] = {}
    if given["--action-from-reply"] is not None:
        options["action_from_reply"] = load_function(given["--action-from-reply"], "--action-from-reply")
    if given["--unreadable-reward"] is not None:
        options["unreadable_reward"] = given["--unreadable-reward"]
    return options


def train(args: argparse.Namespace) -> int:
    """Run ``agl-lite train``: evaluate, ``Trainer.fit``, evaluate again, save the adapter."""
    for name in ("steps", "batch_size", "group_size", "lora_r", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CLIError(f"--{name.replace('_', '-')} must be >= 1", EXIT_USAGE)
    parsers = parser_options(args)  # an unknown parser name fails before any task or model loads
    if args.env is not None:
        agent, tasks, val = env_tasks(args)
        args.agent = args.agent or args.env
    elif args.agent is None:
        raise CLIError("give AGENT (module:function) or --env KIND:NAME", EXIT_USAGE)
    else:
        agent, tasks, val = agent_tasks(args)

    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import CheckpointConfig, LoggingConfig, RolloutConfig

    algo_cls = agl.GRPO if args.algorithm == "grpo" else agl.PPO
    algorithm = algo_cls(group_size=args.group_size, **({} if args.lr is None else {"lr": args.lr}))
    args.lr = algorithm.lr
    print_error(
        f"training {args.agent} on {len(tasks)} tasks: {args.model}, {args.algorithm.upper()}, "
        f"group {args.group_size}, batch {args.batch_size}, lr {args.lr:g}, output in {args.output_dir}"
    )
    runners = None
    if args.runners is not None:
        host, _, port = args.runners.rpartition(":")
        if not port.isdigit():
            raise CLIError(f"--runners takes [HOST:]PORT, got {args.runners!r}", EXIT_USAGE)
        runners = agl.RemoteRunners(
            host=host.strip("[]") or "127.0.0.1", port=int(port), api_key=args.api_key
        )
        print_error(
            f"rollouts are queued for runners: agl-lite runner {args.agent} --server http://{args.runners}"
        )
    engine, engine_options = _engine_choice(args)
    t0 = time.time()
    trainer = agl.Trainer(
        runners=runners,
        model=args.model,
        algorithm=algorithm,
        lora=agl.LoRA(r=args.lora_r, alpha=2 * args.lora_r, load_in_4bit=args.qlora),
        engine=engine,
        engine_options=engine_options,
        agents=name_list(args.agents),
        credit=args.credit,
        air=air_rules(args),
        output_dir=args.output_dir,
        batch_size=args.batch_size,
        seed=args.seed,
        rollout_config=RolloutConfig(concurrency=args.concurrency, timeout=args.rollout_timeout),
        logging_config=LoggingConfig(eval_every=args.eval_every),
        checkpoint_config=CheckpointConfig(save_every=args.save_every),
        prompts=args.prompts,
        server_options=parsers,
    )
    try:
        before = None
        if val is not None and not args.no_baseline and not args.resume:
            before = trainer.evaluate(agent, val)
        last = trainer.fit(agent, tasks, steps=args.steps, resume=args.resume)
        after = trainer.evaluate(agent, val) if val is not None else None
        adapter = trainer.save()
        curve = trainer.plot()
    finally:
        trainer.close()
    out = {
        "agent": args.agent,
        "steps": trainer.step,
        "train_tasks": len(tasks),
        "before": before,
        "after": after,
        "last_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "output_dir": str(Path(args.output_dir)),
        "store": str(Path(args.output_dir) / "runs.db"),
        "metrics": str(Path(args.output_dir) / "metrics.jsonl"),
        "reward_curve": None if curve is None else str(curve),
        "adapter": str(adapter),
        "wall_s": round(time.time() - t0, 1),
    }
    if args.json:
        print(json.dumps(out, indent=2, default=json_default))
        return _done()
    o = Out()
    rows = [["steps", str(trainer.step), ""]]
    rows.append(["train reward (last step)", fmt_num(last.get("train/reward_mean")), ""])
    if after is not None:
        for key in ("success_rate", "mean_reward"):
            rows.append([f"held-out {key}", fmt_num(before[key]) if before else "-", fmt_num(after[key])])
    o.table("training done", ["", "before", "after"], rows)
    for label in ("store", "metrics", "reward_curve", "adapter"):
        o.line(f"{label:13s} {out[label]}")
    return _done()


def _done() -> int:
    """A successful run's exit code; under a launcher the process ends here with status 0, without
    the interpreter's teardown (where a gloo rank sometimes aborts: see ``leave_after_launch``)."""
    if "WORLD_SIZE" in os.environ:
        from ..rl.distributed import leave_after_launch

        leave_after_launch()
    return EXIT_OK
