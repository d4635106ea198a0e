"""What the Tinker server keeps track of: sessions, training models and their ids, sampling sessions,
and where ``tinker://`` paths live on disk.

Model ids follow the SDK's scheme ``<session_id>:train:<model_seq_id>`` (the SDK computes the id itself
when it creates a model by loading weights). ``tinker://<model_id>/weights/<name>`` (``save_state``)
and ``tinker://<model_id>/sampler_weights/<name>`` are directories under the output directory.

>>> import tempfile
>>> reg = Registry(Path(tempfile.mkdtemp()))
>>> sid = reg.new_session()
>>> reg.model_id(sid, 0) == f"{sid}:train:0"
True
>>> reg.directory("tinker://s1:train:0/weights/step-3").parts[-3:]
('s1%3Atrain%3A0', 'weights', 'step-3')
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .futures import OpError

__all__ = ["KINDS", "Registry", "SamplingSession"]

#: the checkpoint kinds of a ``tinker://`` path this server writes and reads
KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass
class SamplingSession:
    """A sampling session: the sampler weights it samples with (``None``: the base model)."""

    session_id: str
    sampler: str | None
    base_model: str
    model_path: str | None = None


class Registry:
    """Sessions, models and sampling sessions of one server; ``output_dir`` holds saved weights."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)
        self._lock = threading.Lock()
        self.sessions: set[str] = set()
        self.models: dict[str, str] = {}  # model id -> session id
        self.sampling: dict[str, SamplingSession] = {}
        self._ids = itertools.count(1)

    def new_session(self) -> str:
        with self._lock:
            sid = f"session-{uuid.uuid4().hex[:12]}"
            self.sessions.add(sid)
        return sid

    def check_session(self, session_id: object) -> str:
        """``session_id`` when this server made it; an :class:`OpError` otherwise."""
        if not isinstance(session_id, str) or session_id not in self.sessions:
            raise OpError(f"unknown session_id {session_id!r}: create a session first (/create_session)")
        return session_id

    def model_id(self, session_id: str, model_seq_id: object) -> str:
        """The id of a session's model number ``model_seq_id``, registered (an error if it exists)."""
        if isinstance(model_seq_id, bool) or not isinstance(model_seq_id, int) or model_seq_id < 0:
            raise OpError(f"model_seq_id must be an integer >= 0, got {model_seq_id!r}")
        model_id = f"{session_id}:train:{model_seq_id}"
        with self._lock:
            if model_id in self.models:
                raise OpError(f"model {model_id!r} already exists (model_seq_id {model_seq_id} is taken)")
            self.models[model_id] = session_id
        return model_id

    def check_model(self, model_id: object) -> str:
        if not isinstance(model_id, str) or model_id not in self.models:
            raise OpError(f"unknown model_id {model_id!r}: create it first (create_model or load_weights)")
        return model_id

    def add_sampling(self, sampler: str | None, base_model: str, model_path: str | None = None) -> str:
        with self._lock:
            sid = f"sampler-{next(self._ids)}"
            self.sampling[sid] = SamplingSession(sid, sampler, base_model, model_path)
        return sid

    def sampling_session(self, session_id: object) -> SamplingSession:
        found = self.sampling.get(session_id) if isinstance(session_id, str) else None
        if found is None:
            raise OpError(f"unknown sampling_session_id {session_id!r}")
        return found

    # -- tinker:// paths ------------------------------------------------------------------------
    @staticmethod
    def tinker_path(model_id: str, kind: str, name: str) -> str:
        return f"tinker://{model_id}/{kind}/{name}"

    @staticmethod
    def check_name(name: object) -> str:
        if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
            raise OpError(f"a checkpoint name is letters, digits, '.', '_' and '-', got {name!r}")
        return name

    def directory_of(self, model_id: str, kind: str, name: str) -> Path:
        return self.output_dir / quote(model_id, safe="") / kind / self.check_name(name)

    def parse(self, path: object) -> tuple[str, str, str]:
        """``(model_id, kind, name)`` of a ``tinker://`` path this server can read."""
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise OpError(f"a checkpoint path starts with tinker://, got {path!r}")
        parts = path[len("tinker://") :].split("/")
        if len(parts) != 3 or parts[1] not in KINDS:
            raise OpError(
                f"{path!r} is not tinker://<model_id>/weights/<name> or tinker://<model_id>/sampler_weights/"
                "<name> (external weights are not served here)"
            )
        return parts[0], parts[1], self.check_name(parts[2])

    def directory(self, path: object) -> Path:
        """Where the checkpoint at ``path`` lives (it may not exist)."""
        return self.directory_of(*self.parse(path))

    def existing(self, path: object) -> Path:
        """The directory of an existing checkpoint; an :class:`OpError` naming the path otherwise."""
        directory = self.directory(path)
        if not directory.is_dir():
            raise OpError(f"no checkpoint at {path} (looked in {directory})")
        return directory
