"""Fixtures for prompt optimisation: the scripted reflection model served on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("gepa")

from .helpers import ReflectionServer, propose_digits


@pytest.fixture
def reflector() -> Iterator[Callable[[Callable[[str], str]], ReflectionServer]]:
    made: list[ReflectionServer] = []

    def make(answer: Callable[[str], str] = propose_digits) -> ReflectionServer:
        made.append(ReflectionServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()
