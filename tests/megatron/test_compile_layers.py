"""``compile_layers`` on CPU: one graph for the decoder (or per layer), same results as eager.

A tiny fp32 GPTModel (local spec, SDPA core attention) is built twice with the same weights;
one copy has its decoder compiled (``aot_eager``: the traced ATen graph runs as it is, no C
compiler needed). Forward and backward must agree with the eager copy, and dynamo must capture
the decoder (scope "decoder") or each layer (scope "layer") whole: no graph breaks, and one
graph in all (a split region runs as several compiled pieces, each paying host time in forward
and in backward).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

LAYERS, SEQ, BATCH, VOCAB = 3, 16, 2, 256
SCOPES = ("decoder", "layer")


class _CountingBackend:
    """``aot_eager``, counting the graphs dynamo hands it."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        from torch._dynamo.backends.debugging import aot_eager

        self.graphs += 1
        return aot_eager(gm, inputs)


def _dynamo_works() -> bool:
    try:
        fn = torch.compile(lambda x: x * 2 + 1, backend="aot_eager", fullgraph=True)
        return bool(torch.equal(fn(torch.ones(2)), torch.full((2,), 3.0)))
    except Exception:  # torch.compile unsupported on this Python / platform
        return False


def _model(seed: int) -> torch.nn.Module:
    from trainers.engines.megatron.model import (
        ModelShape,
        Parallelism,
        build_model,
        transformer_config,
    )

    shape = ModelShape(
        arch="LlamaForCausalLM",
        num_layers=LAYERS,
        hidden_size=64,
        ffn_hidden_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rope_theta=10000.0,
        norm_eps=1e-6,
        qkv_bias=False,
        qk_norm=False,
        tie_embeddings=False,
    )
    config = transformer_config(
        shape, dtype=torch.float32, parallel=Parallelism(), recompute=False, cpu_init=True
    )
    model = build_model(shape, config, vocab_multiple=8)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(
                torch.randn(p.shape, generator=gen) * 0.05 if p.dim() > 1 else torch.ones_like(p)
            )
    return model


def _step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    logits = model(ids, pos, None)  # (b, s, vocab)
    (logits.float().pow(2).mean()).backward()
    return logits.detach()


@pytest.mark.skipif(not _dynamo_works(), reason="torch.compile does not run on this platform")
@pytest.mark.parametrize("scope", SCOPES)
def test_compiled_decoder_matches_eager_in_one_graph(megatron_group: None, scope: str) -> None:
    from torch._dynamo.utils import counters

    from trainers.engines.megatron.model import compile_layers

    eager, compiled = _model(0), _model(0)
    torch._dynamo.reset()
    counters.clear()
    backend = _CountingBackend()
    compile_layers(compiled, backend=backend, scope=scope)
    decoder: Any = compiled.decoder
    wrapped = [m for m in compiled.modules() if getattr(m, "_compiled_call_impl", None)]
    assert wrapped == ([decoder] if scope == "decoder" else list(decoder.layers))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # the second call runs the cached graph
        eager.zero_grad(set_to_none=True)
        compiled.zero_grad(set_to_none=True)
        torch.testing.assert_close(_step(compiled, ids), _step(eager, ids), rtol=1e-5, atol=1e-6)
    grads = dict(eager.named_parameters())
    for name, p in compiled.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)

    breaks = {reason.splitlines()[0]: n for reason, n in counters["graph_break"].items()}
    assert breaks == {}, f"graph breaks inside the compiled {scope}: {breaks}"
    # decoder: one graph for the stack; layer: one graph shared by every layer (no recompile
    # per layer). Either way, a second step reuses it.
    assert backend.graphs == 1


@pytest.mark.skipif(not _dynamo_works(), reason="torch.compile does not run on this platform")
@pytest.mark.parametrize("scope", SCOPES)
def test_varying_sequence_lengths_compile_twice_not_per_length(
    megatron_group: None, scope: str
) -> None:
    """RL batches are padded to each batch's longest sequence, so the length changes every step:
    the first length compiles a static graph, the second a dynamic one that serves the rest
    (a recompile per length would stall steps and hit dynamo's cache limit)."""
    from torch._dynamo.utils import counters

    from trainers.engines.megatron.model import compile_layers

    model = _model(0)
    torch._dynamo.reset()
    counters.clear()
    backend = _CountingBackend()
    compile_layers(model, backend=backend, scope=scope)
    gen = torch.Generator().manual_seed(2)
    for seq in (16, 24, 40, 13, 33):
        _step(model, torch.randint(0, VOCAB, (BATCH, seq), generator=gen))
    assert dict(counters["graph_break"]) == {}
    assert backend.graphs == 2


def test_unknown_compile_scope_is_refused(megatron_group: None) -> None:
    from agentrl.errors import ConfigError
    from trainers.engines.megatron.model import compile_layers

    with pytest.raises(ConfigError, match="compile scope must be one of"):
        compile_layers(_model(0), backend="aot_eager", scope="block")


def test_megatron_warnings_still_fire_in_eager_code(megatron_group: None) -> None:
    """The shim only hides warnings from dynamo: eager callers of ``megatron.core.utils`` still
    get the warning, attributed to their own line."""
    import megatron.core.utils as mcore_utils

    from trainers.engines.megatron.model import compile_layers

    compile_layers(_model(0), backend="aot_eager")
    with pytest.warns(DeprecationWarning, match="tp_group is None") as record:
        mcore_utils.get_tensor_model_parallel_group_if_none(None)
    assert record[0].filename == __file__
    compile_layers(_model(0), backend="aot_eager")  # a second engine: no shim on the shim
    assert mcore_utils.warnings.warn is not __import__("warnings").warn
    assert mcore_utils.warnings.catch_warnings is __import__("warnings").catch_warnings


@pytest.mark.skipif(not _dynamo_works(), reason="torch.compile does not run on this platform")
@pytest.mark.parametrize("with_entropy", [False, True])
def test_compiled_logprob_chunks_match_eager(megatron_group: None, with_entropy: bool) -> None:
    """Compiled chunks (checkpoint inside the graph) give the eager logprobs, entropy and
    gradients, over full chunks and a shorter last one, in training and in scoring."""
    from torch._dynamo.utils import counters

    from trainers.engines.megatron.logprobs import vocab_parallel_logprobs

    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(11, 8, generator=gen)
    weight = torch.randn(16, 8, generator=gen)
    targets = torch.randint(0, 13, (11,), generator=gen)
    torch._dynamo.reset()
    counters.clear()
    results, counting = [], _CountingBackend()
    for backend in (None, counting):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        kw = dict(true_vocab=13, tp_rank=0, tp_size=1, with_entropy=with_entropy, chunk_tokens=4)
        logp, ent = vocab_parallel_logprobs(
            h, w, targets, temperature=0.7, compile_backend=backend, **kw
        )  # type: ignore[arg-type]
        (logp.sum() + (ent.sum() if ent is not None else 0)).backward()
        with torch.no_grad():
            scored, _ = vocab_parallel_logprobs(h, w, targets, compile_backend=backend, **kw)  # type: ignore[arg-type]
        results.append((logp, ent, h.grad, w.grad, scored))
    for eager, compiled in zip(*results, strict=True):
        if eager is None:
            assert compiled is None
            continue
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert dict(counters["graph_break"]) == {}
    # compiled for real: a graph for training, one for scoring, one more for the short last chunk
    assert counting.graphs >= 2


def test_compiled_logprob_chunks_need_one_tensor_parallel_rank() -> None:
    from agentrl.errors import ConfigError
    from trainers.engines.megatron.logprobs import vocab_parallel_logprobs

    with pytest.raises(ConfigError, match="tensor_parallel_size 1"):
        vocab_parallel_logprobs(
            torch.zeros(2, 4),
            torch.zeros(8, 4),
            torch.zeros(2, dtype=torch.long),
            true_vocab=8,
            tp_rank=0,
            tp_size=2,
            compile_backend="aot_eager",
        )


def _inductor_works() -> bool:
    try:
        fn = torch.compile(lambda x: x * 2 + 1, backend="inductor", fullgraph=True)
        return bool(torch.equal(fn(torch.ones(2)), torch.full((2,), 3.0)))
    except Exception:  # no C++ compiler, or Inductor unsupported here
        return False


def test_inductor_decoder_matches_eager_across_lengths(megatron_group: None) -> None:
    """The engine's real backend (Inductor, here its C++ CPU code): outputs and gradients of the
    compiled decoder equal eager ones for the first length (a static graph) and for later
    lengths (the dynamic graph), in fp32."""
    from trainers.engines.megatron.model import compile_layers

    if not _inductor_works():  # asked here, not at collection: it compiles
        pytest.skip("Inductor cannot compile on this machine (no C++ compiler?)")
    eager, compiled = _model(0), _model(0)
    torch._dynamo.reset()
    compile_layers(compiled, backend="inductor")
    gen = torch.Generator().manual_seed(5)
    for seq in (16, 24, 13):
        ids = torch.randint(0, VOCAB, (BATCH, seq), generator=gen)
        eager.zero_grad(set_to_none=True)
        compiled.zero_grad(set_to_none=True)
        torch.testing.assert_close(_step(compiled, ids), _step(eager, ids), rtol=1e-5, atol=1e-5)
        grads = dict(eager.named_parameters())
        for name, p in compiled.named_parameters():
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
