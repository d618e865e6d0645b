"""``agentrl view``: serve the trajectory viewer for run directories or trajectory JSONL files.

    agentrl view runs/quickstart                      # a run (followed while it trains)
    agentrl view runs/a runs/b --port 8600            # two runs, to compare
    agentrl view out/trajectories.jsonl --tokenizer runs/quickstart/sft_model

PATH -> Source -> TrajectoryIndex -> create_app -> uvicorn on ``--host:--port`` (loopback by
default; the page has no authentication, so binding elsewhere shows the data to that network).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

logger = logging.getLogger(__name__)


def view(
    paths: Annotated[
        list[Path], typer.Argument(help="Run directories or trajectories .jsonl files.")
    ],
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8600,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="Tokenizer dir for token texts (default: the run's own model)."),
    ] = None,
) -> None:
    """Browse trajectories: list and filters, conversations, tokens, groups, plots."""
    import uvicorn

    from agentrl.http.guard import is_loopback
    from agentrl.http.service import SERVER_LOOP
    from agentrl.viewer.app import create_app
    from agentrl.viewer.index import Source, TrajectoryIndex
    from agentrl.viewer.tokens import find_tokenizer, load_template

    sources = [Source(p) for p in paths]
    index = TrajectoryIndex(sources)
    tok_dir = tokenizer or next((t for p in paths if (t := find_tokenizer(p.resolve()))), None)
    template = load_template(tok_dir)
    if not is_loopback(host):
        logger.warning(
            "agentrl view has no authentication: anyone who reaches %s sees the data", host
        )
    typer.echo(
        f"agentrl view: {index.facets()['count']} trajectories in {len(sources)} source(s); "
        f"tokenizer: {tok_dir or 'none (token ids only)'}; open http://{host}:{port}/"
    )
    uvicorn.run(
        create_app(index, template), host=host, port=port, log_level="warning", loop=SERVER_LOOP
    )
