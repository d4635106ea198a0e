"""The web view's pages: a Starlette app rendering Jinja2 templates, charts drawn by the vendored uPlot.

Routes: ``/`` (the rollouts, filtered, sorted, paginated), ``/rollouts/<id>`` (the span tree),
``/tokens/<id>`` (each call's response tokens shaded by what they were trained with), ``/run`` (the
training run's metrics, following ``metrics.jsonl`` while it grows), ``/api/metrics`` (its rows as
JSON) and ``/static/...``. With an API key every request needs it: ``Authorization: Bearer KEY``, or
``?key=KEY`` once in the browser (kept in an HTTP-only cookie).
"""

from __future__ import annotations

import datetime as _dt
import hmac
import json
import logging
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from .data import PAGE_SIZES, SORTS, RolloutQuery, RunData

__all__ = ["COOKIE", "make_app"]

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
COOKIE = "agl_ui_key"
_CHARTS = (  # (title, metric keys drawn on it)
    ("Reward", ("train/reward_mean", "val/reward_mean", "val/success_rate")),
    ("Loss", ("train/loss", "train/pg_loss", "ppo/value_loss", "sft/loss")),
    ("KL to the reference", ("train/kl",)),
    ("Entropy", ("train/entropy", "diag/entropy")),
    ("Response diversity", ("diag/distinct_responses", "diag/distinct_2")),
    ("LLM calls", ("diag/policy_calls", "diag/other_calls")),
)


def _fmt_num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.4g}"
    return str(x)


def _fmt_dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _preview(value: Any, width: int = 80) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _shade(value: float | None) -> str:
    """The background of a token: green for a positive value, red for a negative one, grey for none."""
    if value is None:
        return ""
    alpha = 0.12 + 0.6 * abs(value)
    rgb = "34, 139, 34" if value >= 0 else "200, 40, 40"
    return f"background: rgba({rgb}, {alpha:.2f})"


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(("html",)),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=_fmt_num,
        dur=_fmt_dur,
        time=_fmt_time,
        preview=_preview,
        pretty=_pretty,
        shade=_shade,
        q=lambda s: quote(str(s), safe=""),
        qs=lambda d: urlencode(d),
    )
    return env


def make_app(data: RunData, api_key: str | None = None) -> ASGIApp:
    """The web view of ``data`` (a :class:`~.data.RunData`) as an ASGI app; ``api_key`` guards every route."""
    env = _env()

    def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("output_dir", data.output_dir)
        return HTMLResponse(env.get_template(name).render(**context), status_code=status_code)

    async def rollouts(request: Request) -> Response:
        try:
            q = RolloutQuery.from_params(request.query_params)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        page = data.rollouts(q)
        return render(
            "rollouts.html",
            page=page,
            q=q,
            agents=data.agent_names(),
            modes=("train", "val", "trace"),
            statuses=("running", "succeeded", "failed", "timeout"),
            sorts=tuple(SORTS),
            page_sizes=PAGE_SIZES,
        )

    async def rollout(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        found = data.rollout(rid)
        if found is None:
            raise HTTPException(404, f"no rollout {rid!r} in this store")
        ro, spans = found
        ids = {s.span_id for s in spans}
        children: dict[str | None, list[Any]] = {}
        for s in spans:
            children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
        for kids in children.values():
            kids.sort(key=lambda s: s.start_time)
        ts, notes = data.transitions_of(ro, spans)
        tools = [s for s in spans if s.kind == "tool"]
        return render(
            "rollout.html",
            ro=ro,
            spans=spans,
            children=children,
            transitions=ts,
            notes=notes,
            n_llm=sum(1 for s in spans if s.kind == "llm"),
            n_tools=len(tools),
            n_tool_errors=sum(1 for s in tools if s.status == "error"),
            rewards=[s for s in spans if s.kind in ("reward", "signal")],
        )

    async def tokens(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        view = data.token_view(rid)
        if view is None:
            raise HTTPException(404, f"no rollout {rid!r} in this store")
        return render("tokens.html", **view)

    async def run(request: Request) -> Response:
        m = data.metrics()
        return render("run.html", metrics=m, charts=_CHARTS, candidates=data.prompt_candidates())

    async def api_metrics(request: Request) -> Response:
        try:
            since = int(request.query_params.get("since") or 0)
        except ValueError:
            raise HTTPException(400, "since must be a whole number") from None
        if since < 0:
            raise HTTPException(400, "since must be 0 or more")
        return JSONResponse(data.metrics(since), headers={"Cache-Control": "no-store"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return render("error.html", status_code=exc.status_code, code=exc.status_code, message=exc.detail)

    app = Starlette(
        routes=[
            Route("/", rollouts),
            Route("/rollouts/{rollout_id:path}", rollout),
            Route("/tokens/{rollout_id:path}", tokens),
            Route("/run", run),
            Route("/api/metrics", api_metrics),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        exception_handlers={HTTPException: http_error},
    )
    if api_key is None:
        return app
    return _KeyGuard(app, api_key, render)


class _KeyGuard:
    """ASGI middleware: a request without the API key gets a 401 (``?key=`` sets the cookie once)."""

    def __init__(self, app: Any, api_key: str, render: Any) -> None:
        self.app = app
        self.key = api_key.encode()
        self.render = render

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.key)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if (scheme.lower() == "bearer" and self._ok(token.strip())) or self._ok(request.cookies.get(COOKIE)):
            await self.app(scope, receive, send)
            return
        given = request.query_params.get("key")
        if given is not None and self._ok(given):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "key"]
            target = request.url.path + ("?" + urlencode(rest) if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        else:
            message = (
                "this view needs the API key: open it once as ?key=KEY (kept in a cookie), "
                "or send 'Authorization: Bearer KEY'"
            )
            if request.url.path.startswith("/api/"):
                response = JSONResponse({"error": message}, status_code=401)
            else:
                response = self.render("error.html", status_code=401, code=401, message=message)
        await response(scope, receive, send)
