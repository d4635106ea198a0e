"""Recipes: :class:`~.command.CommandAgent` set up for Claude Code, Codex and opencode.

Each writes the config its harness reads into the rollout's own HOME, points it at the rollout's
endpoint, turns telemetry and update checks off, and names the harness's side ("small") model
``<model>@side`` so that its calls are recorded but not trained on. What each harness sends was
observed against a recording server (Claude Code 2.1.197, Codex 0.171.0, opencode 1.18.33).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .command import CommandAgent, HarnessRun

__all__ = ["claude_code", "codex", "opencode"]

#: Switches that keep a harness from calling anything but its model endpoint.
OFFLINE_ENV = {
    # Claude Code
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    # opencode
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
}


#: opencode 1.18's own tools (``tools=`` keeps some: the others are switched off in its config)
OPENCODE_TOOLS = ("bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")


def _chain(*steps: Callable[[HarnessRun], None] | None) -> Callable[[HarnessRun], None]:
    def setup(run: HarnessRun) -> None:
        for step in steps:
            if step is not None:
                step(run)

    return setup


def opencode(
    *,
    executable: str = "opencode",
    context: int = 8192,
    max_output: int = 1024,
    title: str | None = "task",
    system_prompt: str | None = None,
    tools: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    setup: Callable[[HarnessRun], None] | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> CommandAgent:
    """opencode (``opencode-ai`` on npm): ``opencode run -m agl/<model> --auto``, the task on stdin.

    Writes ``$XDG_CONFIG_HOME/opencode/opencode.json`` with a provider ``agl``
    (``@ai-sdk/openai-compatible``, bundled with opencode) at the rollout's ``/v1``, the model with
    ``limit.context``/``limit.output`` (opencode asks ``max_tokens`` = ``limit.output``; its default,
    32000, leaves no room in a small context), ``small_model`` = the side model. ``title``: passed as
    ``--title`` (no title call is made); ``None`` lets opencode make its title call with the side
    model (recorded, not trained). ``system_prompt``: replaces the build agent's prompt (opencode's
    own is about 2 k tokens, its tools about 5 k more). ``options``: more :class:`CommandAgent` arguments.

    >>> agent = opencode(network="host")
    >>> agent.command[:3], agent.task_via
    (['opencode', 'run', '--auto'], 'stdin')
    """

    def write_config(run: HarnessRun) -> None:
        name = run.model
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"agl/{name}",
            "small_model": f"agl/{run.side_model}",
            "provider": {
                "agl": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "agl",
                    "options": {"baseURL": run.base_url, "apiKey": run.api_key},
                    "models": {
                        m: {"name": m, "limit": {"context": context, "output": max_output}}
                        for m in (name, run.side_model)
                    },
                }
            },
        }
        if system_prompt is not None:
            config["agent"] = {"build": {"prompt": system_prompt}}
        if tools is not None:
            config["tools"] = {t: t in tools for t in OPENCODE_TOOLS}
        path = run.home / ".config" / "opencode" / "opencode.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        run.args += ["-m", f"agl/{name}"]
        if title is not None:
            run.args += ["--title", title]
        run.args += list(extra_args)

    return CommandAgent(
        [executable, "run", "--auto"],
        task_via="stdin",
        setup=_chain(write_config, setup),
        env={**OFFLINE_ENV, **(env or {})},
        **options,
    )


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


#: Codex switches that shorten its request for a small context: no sub-agent, goal, app or memory
#: tools (its prompt is then about 6 k tokens with the default instructions)
CODEX_SMALL = {"multi_agent": False, "goals": False, "apps": False, "memories": False}


def codex(
    *,
    executable: str = "codex",
    context: int | None = None,
    instructions: str | None = None,
    features: Mapping[str, bool] | None = CODEX_SMALL,
    settings: Mapping[str, Any] | None = None,
    config: str = "",
    extra_args: Sequence[str] = (),
    setup: Callable[[HarnessRun], None] | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> CommandAgent:
    """Codex CLI (``@openai/codex`` on npm): ``codex exec`` with the task as its argument.

    Writes ``$CODEX_HOME/config.toml`` (``CODEX_HOME`` under the rollout's HOME) with a provider
    ``agl`` at the rollout's ``/v1`` (``wire_api = "responses"``: Codex speaks only the Responses
    API, which the PolicyServer serves), its key in ``AGL_API_KEY``, analytics, feedback,
    OpenTelemetry, web search and the update check off, and retries at 0 (a refused call fails the
    run at once). Codex makes no side calls.

    Size: Codex's own request is about 10 k tokens; ``features`` (default :data:`CODEX_SMALL`) drops
    the sub-agent, goal, app and memory tools, and ``instructions`` replaces its base instructions
    (written to a file named by ``model_instructions_file``). ``context``: ``model_context_window``
    (Codex refuses to send a request it counts as larger). ``settings``: more top-level keys;
    ``config``: more TOML appended (tables).

    >>> codex(network="host").command[:2]
    ['codex', 'exec']
    """

    def write_config(run: HarnessRun) -> None:
        codex_home = run.home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        top: dict[str, Any] = {
            "model": run.model,
            "model_provider": "agl",
            "approval_policy": "never",
            "check_for_update_on_startup": False,
            "web_search": "disabled",
        }
        if context is not None:
            top["model_context_window"] = int(context)
        if instructions is not None:
            path = codex_home / "instructions.md"
            path.write_text(instructions)
            top["model_instructions_file"] = str(path)
        top.update(settings or {})
        lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
        lines += [
            "[analytics]",
            "enabled = false",
            "[feedback]",
            "enabled = false",
            "[otel]",
            'exporter = "none"',
        ]
        if features:
            lines += ["[features]"] + [f"{k} = {_toml(v)}" for k, v in features.items()]
        lines += [
            "[model_providers.agl]",
            'name = "agl"',
            f"base_url = {json.dumps(run.base_url)}",
            'wire_api = "responses"',
            'env_key = "AGL_API_KEY"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
        ]
        (codex_home / "config.toml").write_text("\n".join(lines) + "\n" + config)
        run.env["CODEX_HOME"] = str(codex_home)
        run.args += list(extra_args)

    return CommandAgent(
        [
            executable,
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--color",
            "never",
            "-C",
            "{workdir}",
            "--dangerously-bypass-approvals-and-sandbox",
        ],
        task_via="arg",
        setup=_chain(write_config, setup),
        env={**OFFLINE_ENV, **(env or {})},
        **options,
    )


def claude_code(
    *,
    executable: str = "claude",
    bare: bool = True,
    max_output: int = 1024,
    max_retries: int = 0,
    extra_args: Sequence[str] = (),
    setup: Callable[[HarnessRun], None] | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> CommandAgent:
    """Claude Code (``@anthropic-ai/claude-code`` on npm): ``claude -p TASK`` against the rollout.

    Sets ``ANTHROPIC_BASE_URL`` (the rollout's URL without ``/v1``; it calls ``/v1/messages``, so the
    server must serve the Messages API), the key as ``ANTHROPIC_AUTH_TOKEN`` (sent as a bearer
    token), the model for every tier, the side model for ``ANTHROPIC_SMALL_FAST_MODEL``, thinking,
    prompt caching, the attribution header and experimental betas off, ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``
    = ``max_output`` and ``CLAUDE_CODE_MAX_RETRIES`` = ``max_retries``; as root it adds
    ``IS_SANDBOX=1`` (needed with ``--dangerously-skip-permissions``: the run is sandboxed).
    ``bare=True`` passes ``--bare`` (3 tools and a short system prompt: about 1 k tokens instead of
    about 19 k), which a small context needs.

    >>> claude_code(network="host").command[:2]
    ['claude', '-p']
    """

    def configure(run: HarnessRun) -> None:
        model, side = run.model, run.side_model
        run.env.update(
            {
                "ANTHROPIC_MODEL": model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": side,
                "ANTHROPIC_SMALL_FAST_MODEL": side,
                "CLAUDE_CODE_SUBAGENT_MODEL": model,
                "CLAUDE_CODE_DISABLE_THINKING": "1",
                "DISABLE_PROMPT_CACHING": "1",
                "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
                "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
                "CLAUDE_CODE_MAX_RETRIES": str(max_retries),
            }
        )
        run.env.pop("ANTHROPIC_API_KEY", None)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            run.env.setdefault("IS_SANDBOX", "1")
        run.args += ["--model", model, "--dangerously-skip-permissions"]
        if bare:
            run.args.append("--bare")
        run.args += list(extra_args)

    return CommandAgent(
        [executable, "-p", "{task}"],
        task_via="arg",
        setup=_chain(configure, setup),
        env={**OFFLINE_ENV, **(env or {})},
        **options,
    )
