"""TextArena's single-player games as an environment: the policy plays a whole game per rollout."""

from __future__ import annotations

from typing import Any

from .base import Environment, require
from .episode import EpisodeResult, EpisodeSpec, Hooks, Observation, Reply, StepResult, run_episode

__all__ = ["TextArena"]

EXTRA = "envs-textarena"
SYSTEM = (
    "You are playing a text game. Read the game's rules and the history so far, then reply with "
    "your next move in exactly the format the game asks for."
)


def _ta() -> Any:
    return require("textarena", EXTRA, "agl.envs.TextArena")


def _start(game: str, seed: int) -> Any:
    """A new game of ``game`` reset for one player with ``seed``; a clear error when it cannot start."""
    ta = _ta()
    try:
        env = ta.make(game)
    except ValueError as exc:
        raise ValueError(f"TextArena has no game {game!r} ({exc})") from exc
    try:
        env.reset(num_players=1, seed=seed)
    except AssertionError as exc:  # TextArena asserts the number of players
        raise ValueError(f"TextArena game {game!r} is not a single-player game: {exc}") from exc
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        raise RuntimeError(
            f"TextArena game {game!r} cannot start here ({reason}); word games download their word "
            "lists on first use, so run them once with network access, or pick a game that runs "
            "offline (GuessTheNumber-v0, TowerOfHanoi-v0, ...)"
        ) from exc
    return env


def _text(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    return "\n".join(str(part[1] if isinstance(part, tuple) else part) for part in observation or [])


class TextArena(Environment):
    """Single-player games of TextArena (``textarena.make(game)``), one game per rollout.

    The tasks are ``{"game": game, "seed": s}`` for ``size`` seeds from ``seed``. The default
    agent plays the whole game: each turn it sends the game's observation (TextArena's text of the
    rules and the game so far) as the user message, under a short system prompt, and steps the
    game with the reply, until the game is done or ``max_turns`` model calls (then reward 0.0).
    The reward is the game's own for player 0 (``env.close()``'s rewards). Every turn is one LLM
    call, so each becomes a transition. A game that is not single-player, or that cannot start
    here (word games fetch word lists on first use, and fail offline), raises at construction.
    Needs ``pip install "agentlightning-lite[envs-textarena]"``.

    >>> import agentlightning_lite as agl
    >>> env = agl.envs.TextArena("GuessTheNumber-v0", size=3, seed=10)
    >>> env.tasks[0]
    {'game': 'GuessTheNumber-v0', 'seed': 10}
    >>> # trainer.fit(env.agent, env.tasks)
    """

    def __init__(
        self,
        game: str,
        size: int = 100,
        seed: int = 0,
        *,
        max_turns: int = 30,
        max_tokens: int = 256,
        system_prompt: str = SYSTEM,
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
    ) -> None:
        self.game, self.max_turns, self.max_tokens, self.system_prompt = (
            game,
            max_turns,
            max_tokens,
            system_prompt,
        )
        _start(game, seed).close()  # fail here, with the reason, rather than in every rollout
        tasks = [{"game": game, "seed": seed + i} for i in range(size)]
        super().__init__(tasks, temperature=temperature, eval_temperature=eval_temperature)

    def play(self, task: dict[str, Any], llm: Any, temperature: float) -> float:
        """Play one game: a model call per turn; the game's reward for player 0."""
        spec = EpisodeSpec(
            "textarena",
            max_turns=self.max_turns,
            max_tokens=self.max_tokens,
            system_prompt=self.system_prompt,
        )
        return run_episode(_Game(task["game"], int(task["seed"])), spec, llm, temperature)

    def __repr__(self) -> str:
        return f"TextArena({self.game!r}, {len(self.tasks)} games)"


class _Game(Hooks):
    """One game's hooks: each turn the game's observation alone (under the system prompt), the reply
    stepped as the move; the game's reward for player 0 when it ended (0.0 when cut)."""

    def __init__(self, game: str, seed: int) -> None:
        self.game, self.seed = game, seed
        self.env: Any = None

    def _observation(self) -> Observation:
        _, observation = self.env.get_observation()
        return Observation.text(_text(observation), fresh=True)

    def reset(self) -> StepResult:
        self.env = _start(self.game, self.seed)
        return StepResult(self._observation())

    def act(self, reply: Reply) -> StepResult:
        done, _ = self.env.step(reply.text)
        return StepResult(None if done else self._observation(), done=bool(done))

    def reward(self, episode: EpisodeResult) -> float:
        rewards, _ = self.env.close()
        return float(rewards[0]) if episode.done and rewards else 0.0
