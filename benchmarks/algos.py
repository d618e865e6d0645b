"""Benchmark agentrl.algos against verl 0.9.1's own ``core_algos`` functions, same inputs, same run.

    python benchmarks/algos.py --setup-verl              # once: benchmarks/.venv-verl (git-ignored)
    python benchmarks/algos.py --threads 1               # 1024 x 8192 fp32 tokens, every case
    python benchmarks/algos.py --quick --only gae,grpo   # 64 x 512, cases whose name has a substring
    python benchmarks/algos.py --check                   # agreement only, small batches (tests)
    python benchmarks/algos.py --huge-pages              # both sides on huge-page allocations

verl lives in its own venv, ``benchmarks/.venv-verl``: ``--setup-verl`` makes it with this
interpreter, points it at this interpreter's site-packages (so both sides run on the very same
torch and numpy builds) and installs ``verl==0.9.1 --no-deps`` plus the two small packages its
``core_algos`` imports that agentrl does not have (codetiming, orjson). Without ``--setup-verl``
the script re-runs itself in that venv; nothing of verl is copied into this repository.

One synthetic batch: multi-turn response masks with environment-token holes (float32, as
``TrainBatch.loss_mask``), token rewards (a score on the last generated token minus a small
per-token KL term), critic values, dense group ids (groups of ``--group-size``), logprobs.
Each case calls verl's function and ours on the same tensors, checks that their outputs agree
on mask-1 tokens (untimed), and times both, interleaved: the best of ``--repeats`` runs each.
Sequence-level estimators return (B, 1) in agentrl; the ``dense`` cases add ``token_level`` so
both sides write the same (B, T) tensor that verl returns. Losses are timed forward only, and
forward + backward. The last line is one JSON object: the worst ratio against its goal.

Allocation: on CPU a fresh (B, T) tensor costs a page fault per 4 KiB page as it is first
written, often more than the arithmetic that fills it. agentrl's estimators put their large
results on transparent huge pages (``agentrl.algos.ops.empty_output``); verl's functions use
torch's default allocator, as they do for their users. ``--huge-pages`` runs both sides with
torch's own ``THP_MEM_ALLOC_ENABLE=1`` (every allocation of 2 MB or more on huge pages), which
separates what the allocation buys from what the arithmetic does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    AdvantageInputs,
    Aggregation,
    PolicyLossConfig,
    kl_penalty,
    token_level,
)

VENV = Path(__file__).resolve().parent / ".venv-verl"
VERL = "verl==0.9.1"
VERL_EXTRAS = ("codetiming", "orjson")  # imported by verl.utils, not agentrl dependencies
GAMMA, LAM = 0.99, 0.95
RECURSION_GOAL, DEFAULT_GOAL = 10.0, 1.0


# ---------------------------------------------------------------- the verl venv


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def setup_verl() -> None:
    """Create benchmarks/.venv-verl on this interpreter's packages and install verl into it."""
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    (VENV / ".gitignore").write_text("*\n")  # git ignores the whole venv
    here = sysconfig.get_paths()["purelib"]
    purelib = subprocess.check_output(
        [str(_venv_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    # addsitedir (not a plain path) so the editable install of agentrl is found there too
    Path(purelib, "agentrl-host.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    pip = [str(_venv_python()), "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, "--no-deps", VERL, *VERL_EXTRAS])
    subprocess.check_call([str(_venv_python()), "-c", "import verl.trainer.ppo.core_algos"])
    print(f"verl installed in {VENV}")


def _in_verl_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def _reexec_in_venv(*, huge_pages: bool = False) -> None:
    """Run this script in the verl venv (and, for ``huge_pages``, with THP_MEM_ALLOC_ENABLE=1,
    which torch reads once, at its first allocation: hence a fresh process)."""
    if huge_pages and os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    elif _in_verl_venv():
        return
    if not _venv_python().exists():
        raise SystemExit(
            f"no {VENV.name}: run `python benchmarks/algos.py --setup-verl` first "
            f"(it installs {VERL} --no-deps into {VENV})."
        )
    os.execv(str(_venv_python()), [str(_venv_python()), __file__, *sys.argv[1:]])


def _verl() -> tuple[Any, Any, Any]:
    """verl's core_algos module and its config classes (ActorConfig, AlgoConfig)."""
    try:
        from verl.trainer.config import AlgoConfig
        from verl.trainer.ppo import core_algos
        from verl.workers.config import ActorConfig
    except ImportError as e:
        raise SystemExit(f"verl's core_algos does not import here ({e}); see --setup-verl") from e
    return core_algos, ActorConfig, AlgoConfig


# ---------------------------------------------------------------- data


@dataclass
class Batch:
    mask: Tensor  # (B, T) float, multi-turn: generated tokens with env-token holes
    prefix_mask: Tensor  # (B, T) float, single-turn: ones then zeros
    token_rewards: Tensor  # (B, T) score on the last generated token - 0.01 * |noise|
    values: Tensor  # (B, T)
    baseline: Tensor  # (B,) greedy reward (remax)
    group_ids: Tensor  # (B,) int64, dense 0..G-1 (verl's vectorised estimators need dense ids)
    logprobs: Tensor  # (B, T)
    old_logprobs: Tensor  # (B, T)
    ref_logprobs: Tensor  # (B, T)
    advantages: Tensor  # (B, T)


def make_batch(b: int, t: int, group_size: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(t)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    prefix = pos[None, :] < lengths[:, None]
    offset = torch.randint(0, 512, (b, 1), generator=g)
    period = max(t // 16, 8)
    mask = prefix & ((pos[None, :] + offset) % period >= period // 8)  # env tokens between turns
    mask[:, 0] = True  # every row has a generated token
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    scores = torch.randint(0, 3, (b,), generator=g).float()
    kl = torch.randn(b, t, generator=g).abs() * 0.01
    old = -torch.rand(b, t, generator=g) * 3
    return Batch(
        mask=mask.float(),
        prefix_mask=prefix.float(),
        token_rewards=(torch.where(last, scores[:, None], 0.0) - kl) * mask,
        values=torch.randn(b, t, generator=g),
        baseline=torch.randint(0, 3, (b,), generator=g).float(),
        group_ids=(torch.arange(b) // group_size)[torch.randperm(b, generator=g)],
        logprobs=old + torch.randn(b, t, generator=g) * 0.1,
        old_logprobs=old,
        ref_logprobs=old + torch.randn(b, t, generator=g) * 0.1,
        advantages=torch.randn(b, t, generator=g),
    )


# ---------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    ours: Callable[[], Tensor]
    verl: Callable[[], Tensor]
    mask: Tensor  # outputs are compared on its mask-1 tokens (scalars: as they are)
    goal: float = DEFAULT_GOAL


def _adv(name: str, cfg: AdvantageConfig, dense: bool, **kw: Tensor) -> Callable[[], Tensor]:
    def run() -> Tensor:
        adv = ADV_ESTIMATORS.get(name)(AdvantageInputs(**kw), cfg)[0]
        return token_level(adv, kw["response_mask"]) if dense else adv

    return run


def _loss(
    ours: str, verl_fn: Callable[..., Any], d: Batch, pcfg: PolicyLossConfig, vcfg: Any, agg: str
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    def run_ours() -> Tensor:
        fn = POLICY_LOSSES.get(ours)
        return fn(
            d.logprobs, d.old_logprobs, d.advantages, d.mask, pcfg, agg=Aggregation(mode=agg)
        )[0]  # type: ignore[no-any-return]

    def run_verl() -> Tensor:
        return verl_fn(  # type: ignore[no-any-return]
            old_log_prob=d.old_logprobs,
            log_prob=d.logprobs,
            advantages=d.advantages,
            response_mask=d.mask,
            loss_agg_mode=agg,
            config=vcfg,
        )[0]

    return run_ours, run_verl


def _backward(run: Callable[[], Tensor], d: Batch) -> Callable[[], Tensor]:
    """Forward and backward of a loss: the gradient with respect to ``d.logprobs``."""

    def fwd_bwd() -> Tensor:
        d.logprobs.grad = None
        run().backward()
        assert d.logprobs.grad is not None
        return d.logprobs.grad

    return fwd_bwd


def cases(d: Batch) -> list[Case]:
    ca, actor_config, algo_config = _verl()
    cfg = AdvantageConfig(gamma=GAMMA, lam=LAM)
    m, r, v, ids = d.mask, d.token_rewards, d.values, d.group_ids
    ids_np = ids.numpy()
    tok = {"token_rewards": r, "values": v}
    grp = {"response_mask": m, "token_rewards": r, "group_ids": ids}
    vrl_algo = algo_config(gamma=GAMMA)
    out = [
        Case(
            "gae, single-turn, whitened",
            _adv("gae", cfg, False, response_mask=d.prefix_mask, **tok),
            lambda: ca.compute_gae_advantage_return(r, v, d.prefix_mask, GAMMA, LAM)[0],
            d.prefix_mask,
            RECURSION_GOAL,
        ),
        Case(
            "gae, multi-turn, whitened",
            _adv("gae", cfg, False, response_mask=m, **tok),
            lambda: ca.compute_gae_advantage_return(r, v, m, GAMMA, LAM)[0],
            m,
            RECURSION_GOAL,
        ),
        Case(
            "reinforce_plus_plus",
            _adv("reinforce_plus_plus", cfg, False, response_mask=m, token_rewards=r),
            lambda: ca.compute_reinforce_plus_plus_outcome_advantage(r, m, config=vrl_algo)[0],
            m,
            RECURSION_GOAL,
        ),
        Case(
            "remax (gamma 1)",
            _adv(
                "remax",
                AdvantageConfig(),
                False,
                response_mask=m,
                token_rewards=r,
                baseline_rewards=d.baseline,
            ),
            lambda: ca.compute_remax_outcome_advantage(r, d.baseline, m)[0],
            m,
        ),
    ]
    for ours, theirs, std in (
        ("grpo", ca.compute_grpo_vectorized_outcome_advantage, True),
        ("dr_grpo", ca.compute_grpo_vectorized_outcome_advantage, False),
        ("rloo", ca.compute_rloo_vectorized_outcome_advantage, None),
    ):
        kw = {} if std is None else {"norm_adv_by_std_in_grpo": std}

        def fn(f: Callable[..., Any] = theirs, kw: dict[str, bool] = kw) -> Tensor:
            return f(r, m, ids_np, **kw)[0]  # type: ignore[no-any-return]

        out.append(Case(f"{ours}, dense (B, T) out", _adv(ours, cfg, True, **grp), fn, m))
        out.append(Case(f"{ours}, (B, 1) out", _adv(ours, cfg, False, **grp), fn, m))
    out.append(
        Case(
            "reinforce_plus_plus_baseline, dense",
            _adv("reinforce_plus_plus_baseline", cfg, True, **grp),
            lambda: ca.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, ids_np)[0],
            m,
        )
    )
    one = torch.ones((), dtype=torch.float32)
    vcfg = actor_config(strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=8)
    losses = [
        ("ppo_clip", ca.compute_policy_loss_vanilla, PolicyLossConfig(), vcfg, "token-mean"),
        (
            "gspo",
            ca.compute_policy_loss_gspo,
            PolicyLossConfig(),
            actor_config(
                strategy="fsdp",
                rollout_n=8,
                ppo_micro_batch_size_per_gpu=8,
                clip_ratio_low=3e-4,
                clip_ratio_high=4e-4,
            ),
            "seq-mean-token-mean",
        ),
        (
            "cispo",
            ca.compute_policy_loss_cispo,
            PolicyLossConfig(cispo_clip_low=0.2, cispo_clip_high=0.28),
            actor_config(
                strategy="fsdp",
                rollout_n=8,
                ppo_micro_batch_size_per_gpu=8,
                clip_ratio_low=0.2,
                clip_ratio_high=0.28,
            ),
            "token-mean",
        ),
    ]
    for name, fn_v, pcfg, vc, agg in losses:
        ours_fn, verl_fn = _loss(name, fn_v, d, pcfg, vc, agg)
        out.append(Case(f"{name} loss, forward", ours_fn, verl_fn, one))
        out.append(Case(f"{name} loss, fwd + bwd", _backward(ours_fn, d), _backward(verl_fn, d), m))
    lp, ref = d.logprobs.detach(), d.ref_logprobs
    out.append(
        Case(
            "kl k3 / low_var_kl",
            lambda: kl_penalty(lp, ref, "k3"),
            lambda: ca.kl_penalty(lp, ref, "low_var_kl"),
            m,
        )
    )
    return out


def _agree(a: Tensor, b: Tensor, mask: Tensor) -> tuple[bool, float]:
    a, b = a.detach().double(), b.detach().double()
    if a.dim() == 0:
        err = float((a - b).abs())
        return err <= 1e-5 + 1e-4 * float(b.abs()), err
    a, b = torch.broadcast_to(a, mask.shape), torch.broadcast_to(b, mask.shape)
    on = mask.bool()
    err = float((a[on] - b[on]).abs().max())
    return bool(torch.allclose(a[on], b[on], rtol=1e-4, atol=2e-5)), err


def check_agreement(
    batch: int = 16, seq: int = 96, group_size: int = 4, seed: int = 0
) -> dict[str, tuple[bool, float]]:
    """Run every case both ways on a small batch; name -> (agree, max abs error on the mask)."""
    d = make_batch(batch, seq, group_size, seed)
    d.logprobs.requires_grad_(True)
    return {c.name: _agree(c.ours(), c.verl(), c.mask) for c in cases(d)}


# ---------------------------------------------------------------- timing


def _time_once(fn: Callable[[], Tensor]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_pair(c: Case, repeats: int, budget_s: float) -> tuple[float, float, Tensor, Tensor]:
    """Best of ``repeats`` for each side, interleaved; a slow side stops after ``budget_s``."""
    ours_out, verl_out = c.ours(), c.verl()  # warm-up, and the outputs we compare
    best_o = best_v = math.inf
    spent_v = 0.0
    for _ in range(repeats):
        best_o = min(best_o, _time_once(c.ours))
        if spent_v < budget_s:
            took = _time_once(c.verl)
            best_v, spent_v = min(best_v, took), spent_v + took
    return best_o, best_v, ours_out, verl_out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup-verl", action="store_true", help=f"create {VENV.name} with {VERL}")
    p.add_argument("--check", action="store_true", help="agreement on small batches, no timing")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per side (best is kept)")
    p.add_argument("--quick", action="store_true", help="64 x 512 instead of --batch x --seq")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--only", default="", help="comma-separated substrings of case names")
    p.add_argument(
        "--huge-pages",
        action="store_true",
        help="both sides with THP_MEM_ALLOC_ENABLE=1 (torch puts allocations >= 2 MB on huge "
        "pages), to separate allocation from arithmetic",
    )
    args = p.parse_args()
    if args.setup_verl:
        setup_verl()
        return
    _reexec_in_venv(huge_pages=args.huge_pages)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.check:
        results = {f"{s}": check_agreement(*s) for s in ((16, 96, 4, 0), (9, 130, 3, 1))}
        bad = {k: {n: e for n, (ok, e) in r.items() if not ok} for k, r in results.items()}
        print(json.dumps({"cases": len(next(iter(results.values()))), "disagree": bad}))
        raise SystemExit(1 if any(bad.values()) else 0)
    b, t = (64, 512) if args.quick else (args.batch, args.seq)
    d = make_batch(b, t, args.group_size)
    d.logprobs.requires_grad_(True)
    import verl

    print(
        f"batch {b} x {t} fp32 ({int(d.mask.sum())} generated tokens), group size "
        f"{args.group_size}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"verl {verl.__version__}, load average {os.getloadavg()[0]:.1f}, allocator: "
        + (
            "THP_MEM_ALLOC_ENABLE=1 (both sides)"
            if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
            else "torch default (agentrl advises huge pages for its results)"
        )
    )
    print(f"{'':38s} {'agentrl':>10s} {'verl':>10s} {'speedup':>8s} {'goal':>5s}  agree (max err)")
    wanted = [w for w in args.only.split(",") if w]
    rows, failed = [], []
    for c in cases(d):
        if wanted and not any(w in c.name for w in wanted):
            continue
        ours_s, verl_s, ours_out, verl_out = _time_pair(c, args.repeats, budget_s=10.0)
        ok, err = _agree(ours_out, verl_out, c.mask)
        failed += [] if ok else [c.name]
        rows.append((c, verl_s / ours_s))
        print(
            f"{c.name:38s} {ours_s * 1e3:8.2f}ms {verl_s * 1e3:8.2f}ms {verl_s / ours_s:7.1f}x "
            f"{c.goal:4g}x  {ok} ({err:.1e})",
            flush=True,
        )
    if not rows:
        raise SystemExit(f"no case matches --only {args.only!r}")
    worst, ratio = min(rows, key=lambda row: row[1] / row[0].goal)
    print(
        json.dumps(
            {
                "benchmark": f"agentrl.algos vs verl core_algos, {b}x{t} fp32, "
                f"{torch.get_num_threads()} threads"
                + (
                    ", THP_MEM_ALLOC_ENABLE=1"
                    if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
                    else ""
                )
                + f", worst case against its goal: {worst.name}",
                "baseline": f"verl {verl.__version__} core_algos",
                "ours": "agentrl.algos",
                "ratio": round(ratio, 2),
                "goal": f">= {RECURSION_GOAL:g}x on gae / reinforce_plus_plus, "
                f">= {DEFAULT_GOAL:g}x elsewhere",
                "met": all(x >= c.goal for c, x in rows) and not failed,
            }
        )
    )
    if failed:
        raise SystemExit(f"results disagree for: {', '.join(failed)}")


if __name__ == "__main__":
    main()
