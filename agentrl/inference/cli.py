"""``agentrl serve PATH``: run an inference server for a local Hugging Face model directory.

    agentrl serve PATH [--port] [--host] [--dtype] [--max-batch-size] [--seed] [--backend]
        -> backend "embedded": agentrl.inference.server.main (FastAPI + uvicorn, this process)

The command is a plain typer function; the ``agentrl`` app registers it with
``app.command("serve")(serve)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentrl.errors import ConfigError

BACKENDS = ("embedded", "sglang", "vllm")


def serve(
    path: Annotated[Path, typer.Argument(help="Local Hugging Face model directory.")],
    port: Annotated[int, typer.Option(help="TCP port.")] = 30000,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    max_batch_size: Annotated[int, typer.Option(help="Most requests decoded together.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed for requests without their own seed.")] = 0,
    backend: Annotated[str, typer.Option(help="embedded | sglang | vllm.")] = "embedded",
    device: Annotated[str, typer.Option(help="torch device for the embedded backend.")] = "cpu",
    num_threads: Annotated[int, typer.Option(help="torch threads; 0 = torch default.")] = 0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
) -> None:
    """Serve a model over HTTP (SGLang /generate + OpenAI endpoints)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if backend != "embedded":
        raise ConfigError(
            f"--backend {backend} is not available yet; use --backend embedded, or start "
            f"{backend} yourself and point the client at its URL."
        )
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is not a directory; expected a Hugging Face model dir.")
    from agentrl.inference.server import main

    main(["--model", str(path), "--port", str(port), "--host", host, "--dtype", dtype,
          "--max-batch-size", str(max_batch_size), "--seed", str(seed), "--device", device,
          "--num-threads", str(num_threads), "--log-level", log_level])  # fmt: skip
