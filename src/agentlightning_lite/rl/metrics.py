"""Training metrics: a JSONL file always; TensorBoard, W&B and MLflow when installed; a reward-curve PNG."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "plot_reward_curve"]

logger = logging.getLogger(__name__)


class MetricsLogger:
    """Append ``{"step": ..., ...}`` rows to ``metrics.jsonl`` and forward them to the installed trackers.

    ``backends`` names which optional trackers to use: ``"tensorboard"``, ``"wandb"``, ``"mlflow"``
    (``"auto"``: TensorBoard when importable; W&B and MLflow only when their run is configured
    through ``WANDB_PROJECT`` / ``MLFLOW_TRACKING_URI``).
    """

    def __init__(self, output_dir: str | os.PathLike[str], backends: str | list[str] = "auto") -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._tb: Any = None
        self._wandb: Any = None
        self._mlflow: Any = None
        names = self._resolve(backends)
        if "tensorboard" in names:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir / "tensorboard"))
            except Exception as exc:  # tensorboard not installed: JSONL still has everything
                logger.info("TensorBoard logging off: %s", exc)
        if "wandb" in names:
            try:
                import wandb

                self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentlightning-lite"))
            except Exception as exc:
                logger.warning("W&B logging off: %s", exc)
        if "mlflow" in names:
            try:
                import mlflow

                mlflow.start_run()
                self._mlflow = mlflow
            except Exception as exc:
                logger.warning("MLflow logging off: %s", exc)

    @staticmethod
    def _resolve(backends: str | list[str]) -> set[str]:
        if backends != "auto":
            return {backends} if isinstance(backends, str) else set(backends)
        names = {"tensorboard"}
        if os.environ.get("WANDB_PROJECT"):
            names.add("wandb")
        if os.environ.get("MLFLOW_TRACKING_URI"):
            names.add("mlflow")
        return names

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        numeric = {
            k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("/", "_"): v for k, v in numeric.items()}, step=step)

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def plot_reward_curve(
    rows: list[dict[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> Path | None:
    """Draw train reward per step (and validation reward/success where logged) into a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib not installed: no reward curve")
        return None
    train = [(r["step"], r["train/reward_mean"]) for r in rows if "train/reward_mean" in r]
    val = [(r["step"], r["val/reward_mean"]) for r in rows if "val/reward_mean" in r]
    succ = [(r["step"], r["val/success_rate"]) for r in rows if "val/success_rate" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="train reward (mean)", color="#4C72B0", alpha=0.8)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="val reward (mean)", color="#DD8452")
    if succ:
        ax.plot(*zip(*succ, strict=True), "s--", label="val success rate", color="#55A868")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_title(title or "reward curve")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
