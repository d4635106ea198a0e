"""Progress bars of long runs (training, APO): tqdm's when it is installed, none otherwise."""

from __future__ import annotations

from typing import Any

__all__ = ["progress"]


def progress(total: int, desc: str, initial: int = 0) -> Any:
    """A tqdm bar (``None`` without tqdm).

    >>> bar = progress(3, "demo", initial=1)
    >>> bar is None or (bar.total, bar.n) == (3, 1)
    True
    >>> bar is None or bar.close()
    """
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=True)
    except ImportError:  # pragma: no cover
        return None
