"""The viewer's HTTP app: a static page and a JSON API over a ``TrajectoryIndex``.

    browser -> GET /                       static/index.html (+ app.js, style.css; no CDN)
            -> GET /api/info               runs, steps, envs, statuses, count, tokenizer
            -> GET /api/trajectories?...   one page of summaries (filters: viewer.index.Filters)
            -> GET /api/trajectories/{id}  the record without its token lists
            -> GET /api/trajectories/{id}/tokens   the token view (viewer.tokens)
            -> GET /api/group?key=...      one GRPO group, side by side
            -> GET /api/compare?a=run:step&b=run:step   two steps (or two runs) side by side
            -> GET /api/metrics            each run's metrics.jsonl, for the plots

Every request re-indexes what was appended (at most once a second), so a running run is
followed live. The page renders model, tool and env text with ``textContent`` only, and the
Content-Security-Policy allows scripts from this server alone, so a ``<script>`` in a
trajectory is shown, never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, Response

from agentrl.chat import ChatTemplate
from agentrl.viewer.index import Filters, TrajectoryIndex
from agentrl.viewer.tokens import token_view

STATIC = Path(__file__).parent / "static"
_STATIC_FILES = {"index.html", "app.js", "style.css"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_TOKEN_LISTS = ("segments", "trainer_logprobs")
MAX_PAGE = 500


def create_app(index: TrajectoryIndex, template: ChatTemplate | None = None) -> FastAPI:
    """The viewer app over ``index``; ``template`` decodes tokens and checks ledgers."""
    app = FastAPI(title="agentrl view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _headers(request: Any, call_next: Any) -> Response:
        resp: Response = await call_next(request)
        resp.headers["Content-Security-Policy"] = _CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}")
    def static(name: str) -> FileResponse:
        if name not in _STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(STATIC / name)

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        return {**index.facets(), "tokenizer": template is not None}

    @app.get("/api/trajectories")
    def trajectories(
        run: str | None = None,
        step: str | None = None,
        env: str | None = None,
        status: str | None = None,
        group: str | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        length_min: int | None = None,
        length_max: int | None = None,
        offset: int = Query(0, ge=0),
        limit: int = Query(50, ge=1, le=MAX_PAGE),
    ) -> dict[str, Any]:
        f = Filters(
            run=run or None,
            step=step or None,
            env=env or None,
            status=status or None,
            group=group or None,
            reward_min=reward_min,
            reward_max=reward_max,
            length_min=length_min,
            length_max=length_max,
        )
        try:
            total, page = index.query(f, offset, limit)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        return {"total": total, "offset": offset, "items": [e.summary() for e in page]}

    def _record(traj_id: str) -> tuple[Any, dict[str, Any]]:
        e = index.find(traj_id)
        if e is None:
            raise HTTPException(
                404, f"no trajectory {traj_id!r} (a training disk cap may have removed it)"
            )
        return e, index.record(e)

    @app.get("/api/trajectories/{traj_id}")
    def trajectory(traj_id: str) -> dict[str, Any]:
        e, d = _record(traj_id)
        for k in _TOKEN_LISTS:
            d.pop(k, None)
        for t in d.get("turns") or []:
            t.pop("completion_ids", None)
            t.pop("completion_logprobs", None)
        return {"summary": e.summary(), "record": d}

    @app.get("/api/trajectories/{traj_id}/tokens")
    def tokens(traj_id: str) -> dict[str, Any]:
        _, d = _record(traj_id)
        return token_view(d, template)

    @app.get("/api/group")
    def group(key: str) -> dict[str, Any]:
        members = index.group(key)
        if not members:
            raise HTTPException(404, f"no group {key!r}")
        out = []
        for e in members:
            d = index.record(e)
            msgs = [m for m in d.get("messages") or [] if m.get("role") == "assistant"]
            last = msgs[-1] if msgs else {}
            content = last.get("content")
            text = content if isinstance(content, str) else str(content or "")
            out.append({**e.summary(), "final": text[:4000], "error": d.get("error")})
        return {"key": key, "members": out}

    @app.get("/api/compare")
    def compare(a: str, b: str) -> dict[str, Any]:
        return {"a": _side(index, a), "b": _side(index, b)}

    @app.get("/api/metrics")
    def metrics() -> dict[str, Any]:
        return {"runs": index.metrics()}

    return app


def _side(index: TrajectoryIndex, spec: str) -> dict[str, Any]:
    """``run:step`` (or ``:step``, ``run:``) -> that step's stats and its first trajectories."""
    run, _, step_s = spec.rpartition(":") if ":" in spec else ("", "", spec)
    try:
        step = int(step_s) if step_s else None
    except ValueError:
        raise HTTPException(400, f"compare wants run:step, got {spec!r}") from None
    f = Filters(run=run or None, step=str(step) if step is not None else None)
    total, page = index.query(f, 0, 100)
    return {
        **index.step_stats(run or None, step),
        "total": total,
        "items": [e.summary() for e in page],
    }
