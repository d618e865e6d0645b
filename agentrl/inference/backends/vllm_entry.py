"""``python -m agentrl.inference.backends.vllm_entry [vllm flags]``: vLLM's API server with
agentrl's ``agentrl_file`` weight-transfer engine registered.

    register agentrl_file in WeightTransferEngineFactory (this process)
        -> vllm.entrypoints.launchers.api_server.entry.main() (reads sys.argv, as
           ``python -m vllm.entrypoints.openai.api_server`` does)
        -> engine core and workers are forked from here and inherit the registry

vLLM forks its engine processes by default (``VLLM_WORKER_MULTIPROC_METHOD=fork``). Where it
spawns them instead, register the engine as a vLLM general plugin
(entry point group ``vllm.general_plugins`` -> ``agentrl.inference.backends.vllm_engine:register``).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from agentrl.inference.backends.vllm_engine import register

    register()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    vllm_main()


if __name__ == "__main__":
    main()
