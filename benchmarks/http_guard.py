"""Memory and time of refused request bodies, and the guard's cost per request, in one run.

    python benchmarks/http_guard.py [--bodies 10] [--mb 256] [--calls 2000]

Three servers, each its own process on loopback:

- ``guard``: ``agentrl tools serve`` (the tool server behind ``agentrl.http.HttpGuard``,
  with a bearer token and per-session tokens);
- ``unguarded``: the same tool server app with the guard taken out (no checks at all): the
  floor for the latency of calls;
- ``dependency``: the baseline for refused bodies, the same ``POST /sessions/{id}/call`` route
  in a bare FastAPI app with the bearer check as a FastAPI dependency, the wiring before the
  guard (FastAPI reads and parses a body before it runs a route's dependencies).

For ``guard`` and ``dependency``: the server's peak RSS (``VmHWM``) before and after
``--bodies`` unauthenticated JSON bodies of ``--mb`` MiB each (streamed from a generator, so
the client holds none; every other one without a Content-Length) and the seconds each took to
be refused. For every target: the p50/p99 latency of ``--calls`` sequential authenticated
calls with a small body (compare ``guard`` with ``unguarded`` for the guard's cost on requests
it lets through). Last, in this process, the guard's own CPU per request it lets through: a
trivial ASGI app called directly, bare and behind the guard (no token; token and a session
check), ``--inprocess`` times each; on a shared machine the HTTP latencies above vary more
between runs than this cost.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-0123456789"
SERVE_GUARD = "import typer; from agentrl.toolserver.cli import tools_serve; typer.run(tools_serve)"
MB = 1 << 20
PREFIX = b'{"name": "echo", "arguments": {"text": "'
SUFFIX = b'"}}'


def baseline_app() -> Any:
    """The call route with auth as a FastAPI dependency (how the servers checked it before)."""
    import hmac

    from fastapi import Depends, FastAPI, HTTPException, Request
    from pydantic import BaseModel

    class Call(BaseModel):
        name: str
        arguments: dict[str, object] = {}

    def bearer(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, f"Bearer {TOKEN}".encode()):
            raise HTTPException(401, "missing or wrong bearer token")

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/sessions", dependencies=[Depends(bearer)])
    def open_session() -> dict[str, str]:
        return {"session_id": "s", "session_token": ""}

    @app.post("/sessions/{sid}/call", dependencies=[Depends(bearer)])
    def call(sid: str, req: Call) -> dict[str, object]:
        return {"content": str(req.arguments.get("text", "")), "is_error": False}

    return app


def unguarded_app() -> Any:
    """The tool server's app with ``HttpGuard`` taken out of its middleware."""
    from agentrl.http import HttpGuard
    from agentrl.toolserver.server import ToolServer
    from tests.toolserver.toolsets import basic_toolset

    app = ToolServer(basic_toolset(), ToolServer.Config(sandbox="none")).app()
    app.user_middleware = [m for m in app.user_middleware if m.cls is not HttpGuard]
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(target: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if target == "guard":
        argv = [
            sys.executable,
            "-c",
            SERVE_GUARD,
            "tests.toolserver.toolsets:basic_toolset",
            "--sandbox",
            "none",
            "--port",
            str(port),
        ]
    else:
        argv = [sys.executable, __file__, "--serve", target, str(port)]
    env = {**os.environ, "AGENTRL_TOOL_TOKEN": TOKEN}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx2.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{target} server did not start")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def body(mb: int) -> Iterator[bytes]:
    chunk = b"a" * MB
    yield PREFIX
    for _ in range(mb):
        yield chunk
    yield SUFFIX


def measure(target: str, a: argparse.Namespace) -> dict[str, float]:
    proc, url = start(target)
    auth = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    try:
        with httpx2.Client(base_url=url, timeout=300) as c:
            s = c.post("/sessions", headers=auth).json()
            own = {**auth, "X-Session-Token": s["session_token"]}
            path = f"/sessions/{s['session_id']}/call"
            small = {"name": "echo", "arguments": {"text": "hi"}}
            for _ in range(50):  # warm up both paths
                c.post(path, json=small, headers=own)
                c.post(path, content=PREFIX + SUFFIX)
            before = peak_rss_mb(proc.pid)
            refused = []
            for i in range(a.bodies if target != "unguarded" else 0):
                size = len(PREFIX) + a.mb * MB + len(SUFFIX)
                headers = {"content-length": str(size)} if i % 2 == 0 else {}
                t0 = time.perf_counter()
                r = c.post(path, content=body(a.mb), headers=headers)
                refused.append(time.perf_counter() - t0)
                if r.status_code != 401:
                    raise RuntimeError(f"{target}: expected 401, got {r.status_code}")
            after = peak_rss_mb(proc.pid)
            lat = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                c.post(path, json=small, headers=own).raise_for_status()
                lat.append(time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.wait(30)
    lat.sort()
    return {
        "rss_before": before,
        "rss_after": after,
        "refuse_p50": statistics.median(refused or [0.0]),
        "refuse_max": max(refused, default=0.0),
        "call_p50_ms": lat[len(lat) // 2] * 1e3,
        "call_p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
    }


def inprocess_cost(n: int) -> dict[str, float]:
    """Microseconds per request through a trivial ASGI app, bare and behind the guard."""
    import asyncio

    from agentrl.http import SESSION_HEADER, HttpGuard, header, tokens_equal

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    body = b'{"name": "echo", "arguments": {"text": "hi"}}'
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/sessions/s/call",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (SESSION_HEADER.lower().encode(), b"session-token"),
        ],
    }

    def session_check(scope: Any) -> None:
        tokens_equal(header(scope, SESSION_HEADER.lower().encode()), "session-token")

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: object) -> None:
        pass

    apps: dict[str, Any] = {
        "bare": app,
        "guard, no token": HttpGuard(app),
        "guard, token + session": HttpGuard(
            app, HttpGuard.Config(token=TOKEN), authorize=session_check
        ),
    }

    async def run() -> dict[str, float]:
        out = {}
        for name, a in apps.items():
            t0 = time.perf_counter()
            for _ in range(n):
                await a(scope, receive, send)
            out[name] = (time.perf_counter() - t0) / n * 1e6
        return out

    return asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bodies", type=int, default=10, help="unauthenticated bodies per server")
    p.add_argument("--mb", type=int, default=256, help="MiB per body")
    p.add_argument("--calls", type=int, default=2000, help="authenticated small calls")
    p.add_argument("--targets", default="guard,unguarded,dependency")
    p.add_argument("--inprocess", type=int, default=200_000, help="requests per in-process app")
    p.add_argument("--serve", nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        import uvicorn

        sys.path.insert(0, str(ROOT))
        app = baseline_app() if a.serve[0] == "dependency" else unguarded_app()
        uvicorn.run(
            app, host="127.0.0.1", port=int(a.serve[1]), log_level="warning", loop="asyncio"
        )
        return
    print(
        f"{a.bodies} unauthenticated bodies of {a.mb} MiB; {a.calls} authenticated small "
        f"calls; load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'target':<12}{'peak RSS MB':>18}{'refused in s (p50, max)':>26}"
        f"{'call ms (p50, p99)':>22}"
    )
    for target in a.targets.split(","):
        m = measure(target, a)
        rss = f"{m['rss_before']:.0f} -> {m['rss_after']:.0f}"
        refused = f"{m['refuse_p50']:.3f}, {m['refuse_max']:.3f}" if m["refuse_max"] else "-"
        call = f"{m['call_p50_ms']:.2f}, {m['call_p99_ms']:.2f}"
        print(f"{target:<12}{rss:>18}{refused:>26}{call:>22}")
    if a.inprocess:
        costs = inprocess_cost(a.inprocess)
        print("in process, us per request: " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))


if __name__ == "__main__":
    main()
