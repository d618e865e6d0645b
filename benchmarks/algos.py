"""Benchmark agentrl.algos against straightforward per-sample Python loops.

    python benchmarks/algos.py --batch 1024 --seq 8192      # full size (8M tokens, fp32)
    python benchmarks/algos.py --quick                      # 64 x 512
    python benchmarks/algos.py --only gae,advantages        # cases whose name has a substring

Builds one synthetic batch (multi-turn response masks with environment-token holes, GRPO
groups with shuffled, non-contiguous ids), runs every advantage estimator and policy loss in
its vectorised form and in a naive reference form written here (per-sample loops over time
steps; groups gathered through dicts of lists), checks that both agree (allclose) and prints
the times and speedups (vectorised: best of --repeats; naive: best of up to 3 within 2 s).
Sequence-level estimators (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline) return one
advantage per row, (B, 1), which is what training consumes; the naive loops build the (B, T)
per-token tensor as they always do, and agreement is checked on the masked per-token values
(``token_level``), outside the timed region. One more GRPO case starts from (B, T) token
rewards (the driver's input) against a loop that sums them first, as verl's core_algos does.
GAE is timed without whitening and losses forward only. ``check_agreement`` is the same
comparison on a small batch, for tests.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import Tensor

from agentrl.algos import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageConfig,
    AdvantageInputs,
    Aggregation,
    PolicyLossConfig,
)
from agentrl.algos.advantages import group_normalized_scores, leave_one_out_scores, token_level

GAMMA, LAM = 0.99, 0.95


@dataclass
class Batch:
    mask: Tensor  # (B, T) multi-turn: generated tokens with env-token holes
    prefix_mask: Tensor  # (B, T) single-turn: ones then zeros
    token_rewards: Tensor  # (B, T)
    values: Tensor  # (B, T)
    scores: Tensor  # (B,)
    baseline: Tensor  # (B,)
    group_ids: Tensor  # (B,)
    logprobs: Tensor  # (B, T)
    old_logprobs: Tensor  # (B, T)
    advantages: Tensor  # (B, T)


def make_batch(b: int, t: int, group_size: int, seed: int = 0, device: str = "cpu") -> Batch:
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(t)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    prefix = pos[None, :] < lengths[:, None]
    offset = torch.randint(0, 512, (b, 1), generator=g)
    period = max(t // 16, 8)
    holes = (pos[None, :] + offset) % period < period // 8  # env tokens between turns
    mask = prefix & ~holes
    scores = torch.randint(0, 3, (b,), generator=g).float()
    n_groups = -(-b // group_size)
    ids = torch.randperm(10 * n_groups, generator=g)[:n_groups] * 7 - 100  # arbitrary ints
    group_ids = ids.repeat_interleave(group_size)[:b][torch.randperm(b, generator=g)]
    old = -torch.rand(b, t, generator=g) * 3
    batch = Batch(
        mask=mask,
        prefix_mask=prefix,
        token_rewards=torch.randn(b, t, generator=g) * 0.01,
        values=torch.randn(b, t, generator=g),
        scores=scores,
        baseline=torch.randint(0, 3, (b,), generator=g).float(),
        group_ids=group_ids,
        logprobs=old + torch.randn(b, t, generator=g) * 0.1,
        old_logprobs=old,
        advantages=torch.randn(b, t, generator=g),
    )
    for f in fields(batch):
        setattr(batch, f.name, getattr(batch, f.name).to(device))
    return batch


# ---------------------------------------------------------------- naive references


def naive_gae(
    r: Tensor, v: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Per sample, per time step (backwards), skipping mask-0 tokens."""
    adv = torch.zeros_like(r)
    for i in range(r.shape[0]):
        rr, vv, mm = r[i].tolist(), v[i].tolist(), mask[i].tolist()
        out = [0.0] * len(rr)
        last, next_v = 0.0, 0.0
        for t in reversed(range(len(rr))):
            if not mm[t]:
                continue
            delta = rr[t] + gamma * next_v - vv[t]
            last = delta + gamma * lam * last
            out[t] = last
            next_v = vv[t]
        adv[i] = torch.tensor(out)
    return adv, (adv + v) * mask


def naive_returns(r: Tensor, mask: Tensor, gamma: float) -> Tensor:
    ret = torch.zeros_like(r)
    for i in range(r.shape[0]):
        rr, mm = r[i].tolist(), mask[i].tolist()
        out, run = [0.0] * len(rr), 0.0
        for t in reversed(range(len(rr))):
            if mm[t]:
                run = rr[t] + gamma * run
                out[t] = run
        ret[i] = torch.tensor(out)
    return ret


def _groups(scores: Tensor, ids: Tensor) -> dict[int, list[Tensor]]:
    by_id: dict[int, list[Tensor]] = defaultdict(list)
    for i in range(scores.shape[0]):
        by_id[int(ids[i])].append(scores[i])
    return by_id


def naive_group_scores(scores: Tensor, ids: Tensor, kind: str, eps: float = 1e-6) -> Tensor:
    """Classic form: a dict from group id to its scores, then a loop over samples. (B,)"""
    stats: dict[int, tuple[Tensor, Tensor, int]] = {}
    for gid, members in _groups(scores, ids).items():
        x = torch.stack(members)
        std = torch.std(x) if len(members) > 1 else torch.tensor(0.0)
        stats[gid] = (torch.mean(x), std, len(members))
    out = torch.zeros_like(scores)
    for i in range(scores.shape[0]):
        mean, std, n = stats[int(ids[i])]
        if kind == "grpo":
            out[i] = (scores[i] - mean) / (std + eps)
        elif kind == "rloo":
            out[i] = (scores[i] - mean) * n / (n - 1) if n > 1 else 0.0
        else:  # dr_grpo, reinforce_plus_plus_baseline
            out[i] = scores[i] - mean
    return out


def naive_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    vals = x[mask.bool()]
    return (x - vals.mean()) / torch.sqrt(vals.var() + eps) * mask


def naive_group_from_tokens(token_rewards: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """GRPO from (B, T) token rewards, as verl's core_algos does it: sum, loop, broadcast."""
    return naive_group(token_rewards.sum(-1), ids, mask, "grpo")


def naive_group(scores: Tensor, ids: Tensor, mask: Tensor, kind: str) -> Tensor:
    adv = naive_group_scores(scores, ids, kind)[:, None] * mask
    return naive_whiten(adv, mask) if kind == "reinforce_plus_plus_baseline" else adv


def naive_ppo(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig) -> Tensor:
    """Token-mean PPO-clip with dual clip, one sample at a time."""
    total, count = torch.zeros(()), 0.0
    for i in range(lp.shape[0]):
        m = mask[i].bool()
        a, r = adv[i][m], torch.exp(lp[i][m] - old[i][m])
        loss = torch.maximum(-a * r, -a * r.clamp(1 - cfg.ppo_low, 1 + cfg.ppo_high))
        if cfg.clip_ratio_c is not None:
            loss = torch.where(a < 0, torch.minimum(loss, -a * cfg.clip_ratio_c), loss)
        total, count = total + loss.sum(), count + float(m.sum())
    return total / count


def naive_gspo(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig) -> Tensor:
    """Seq-mean-token-mean GSPO, one sample at a time."""
    per_seq = []
    for i in range(lp.shape[0]):
        m = mask[i].bool()
        if not m.any():
            continue
        s = torch.exp((lp[i][m] - old[i][m]).mean())
        a = adv[i][m]
        loss = torch.maximum(-a * s, -a * s.clamp(1 - cfg.gspo_clip_low, 1 + cfg.gspo_clip_high))
        per_seq.append(loss.mean())
    return torch.stack(per_seq).mean()


def naive_cispo(
    lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, cfg: PolicyLossConfig
) -> Tensor:
    total, count = torch.zeros(()), 0.0
    for i in range(lp.shape[0]):
        m = mask[i].bool()
        w = torch.exp(lp[i][m] - old[i][m]).clamp(max=1 + cfg.cispo_clip_high)
        total, count = total + (-w * adv[i][m] * lp[i][m]).sum(), count + float(m.sum())
    return total / count


# ---------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    fast: Callable[[], Tensor]
    naive: Callable[[], Tensor]
    mask: Tensor | None = None
    """Set for sequence-level (B, 1) outputs: compared as token_level(fast, mask), untimed."""

    def comparable(self, fast_out: Tensor) -> Tensor:
        return fast_out if self.mask is None else token_level(fast_out, self.mask)


def _adv(name: str, cfg: AdvantageConfig, **kw: Tensor) -> Callable[[], Tensor]:
    def run() -> Tensor:
        return ADV_ESTIMATORS.get(name)(AdvantageInputs(**kw), cfg)[0]

    return run


def _loss(name: str, d: Batch, agg: str, adv: Tensor | None = None) -> Callable[[], Tensor]:
    def run() -> Tensor:
        fn = POLICY_LOSSES.get(name)
        return fn(
            d.logprobs,
            d.old_logprobs,
            d.advantages if adv is None else adv,
            d.mask,
            PolicyLossConfig(),
            agg=Aggregation(mode=agg),
        )[0]

    return run


def _scores(kind: str, d: Batch) -> Callable[[], Tensor]:
    if kind == "rloo":
        return lambda: leave_one_out_scores(d.scores, d.group_ids)
    return lambda: group_normalized_scores(d.scores, d.group_ids, norm_by_std=kind == "grpo")


def cases(d: Batch) -> list[Case]:
    cfg = AdvantageConfig(gamma=GAMMA, lam=LAM, whiten=False)
    m, pm, pcfg = d.mask.float(), d.prefix_mask.float(), PolicyLossConfig()
    tok = {"token_rewards": d.token_rewards, "values": d.values}
    grp = {"response_mask": d.mask, "rewards": d.scores, "group_ids": d.group_ids}
    r, v, s, ids = d.token_rewards, d.values, d.scores, d.group_ids
    lp, old, a = d.logprobs, d.old_logprobs, d.advantages
    out = [
        Case(
            "gae (single-turn)",
            _adv("gae", cfg, response_mask=d.prefix_mask, **tok),
            lambda: naive_gae(r, v, pm, GAMMA, LAM)[0],
        ),
        Case(
            "gae (multi-turn)",
            _adv("gae", cfg, response_mask=d.mask, **tok),
            lambda: naive_gae(r, v, m, GAMMA, LAM)[0],
        ),
    ]
    for k in ("grpo", "dr_grpo", "rloo"):
        out.append(Case(f"{k} (B,) scores", _scores(k, d), partial(naive_group_scores, s, ids, k)))
    for k in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"):
        name = f"{k} advantages"
        out.append(Case(name, _adv(k, cfg, **grp), partial(naive_group, s, ids, m, k), d.mask))
    last = _last_token(s, m)  # what TrainBatch.token_rewards holds: the score on the last token
    out.append(
        Case(
            "grpo advantages, token_rewards in",
            _adv("grpo", cfg, response_mask=m, token_rewards=last, group_ids=ids),
            partial(naive_group_from_tokens, last, ids, m),
            d.mask,
        )
    )
    rpp = _adv("reinforce_plus_plus", cfg, response_mask=d.mask, token_rewards=r)
    remax = _adv("remax", cfg, response_mask=d.mask, rewards=s, baseline_rewards=d.baseline)
    out += [
        Case("reinforce_plus_plus", rpp, lambda: naive_whiten(naive_returns(r, m, GAMMA), m)),
        Case(
            "remax (gamma=0.99)",
            remax,
            lambda: naive_returns(_last_token(s, m), m, GAMMA) - d.baseline[:, None] * m,
        ),
        Case(
            "ppo_clip loss",
            _loss("ppo_clip", d, "token-mean"),
            partial(naive_ppo, lp, old, a, m, pcfg),
        ),
        Case(
            "gspo loss",
            _loss("gspo", d, "seq-mean-token-mean"),
            partial(naive_gspo, lp, old, a, m, pcfg),
        ),
        Case(
            "cispo loss", _loss("cispo", d, "token-mean"), partial(naive_cispo, lp, old, a, m, pcfg)
        ),
    ]
    row = d.advantages[:, :1]  # (B, 1) sequence-level advantages; the loop gets them per token
    row_dense = row * m
    out.append(
        Case(
            "ppo_clip loss, (B, 1) adv",
            _loss("ppo_clip", d, "token-mean", row),
            partial(naive_ppo, lp, old, row_dense, m, pcfg),
        )
    )
    return out


def _last_token(scores: Tensor, mask: Tensor) -> Tensor:
    out = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        idx = mask[i].nonzero()
        if len(idx):
            out[i, int(idx[-1])] = scores[i]
    return out


def _agree(a: Tensor, b: Tensor) -> tuple[bool, float]:
    err = float((a - b).abs().max())
    return bool(torch.allclose(a, b, rtol=1e-3, atol=1e-3)), err


def check_agreement(
    batch: int = 16, seq: int = 96, group_size: int = 4, seed: int = 0
) -> dict[str, tuple[bool, float]]:
    """Run every case both ways on a small batch; name -> (allclose, max abs error)."""
    d = make_batch(batch, seq, group_size, seed)
    return {c.name: _agree(c.comparable(c.fast()), c.naive()) for c in cases(d)}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn: Callable[[], Tensor], repeats: int) -> tuple[float, Tensor]:
    out = fn()  # warm-up (also the result we check)
    best = math.inf
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats of the vectorised form (best is kept)"
    )
    p.add_argument("--quick", action="store_true", help="64 x 512 instead of --batch x --seq")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="where the tensors live: cpu or cuda")
    p.add_argument(
        "--only", default="", help="comma-separated substrings: run the cases whose name has one"
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    b, t = (64, 512) if args.quick else (args.batch, args.seq)
    d = make_batch(b, t, args.group_size, device=args.device)
    print(
        f"batch {b} x {t} fp32 ({int(d.mask.sum())} generated tokens), group size {args.group_size}, "
        f"{args.device}, {torch.get_num_threads()} CPU threads"
    )
    print(f"{'':30s} {'vectorised':>12s} {'naive loop':>12s} {'speedup':>9s}  agree (max abs err)")
    failed = []
    wanted = [w for w in args.only.split(",") if w]
    for c in cases(d):
        if wanted and not any(w in c.name for w in wanted):
            continue
        fast_s, fast_out = _time(c.fast, args.repeats)
        naive_s, naive_out = _naive_time(c.naive)
        ok, err = _agree(c.comparable(fast_out), naive_out)
        failed += [] if ok else [c.name]
        print(
            f"{c.name:30s} {fast_s * 1e3:10.1f}ms {naive_s * 1e3:10.1f}ms {naive_s / fast_s:8.1f}x  {ok} ({err:.2e})"
        )
    if failed:
        raise SystemExit(f"results disagree for: {', '.join(failed)}")


def _naive_time(fn: Callable[[], Tensor], budget_s: float = 2.0) -> tuple[float, Tensor]:
    """Best of up to 3 runs, stopping once ``budget_s`` has been spent (slow loops run once)."""
    best, spent, out = math.inf, 0.0, None
    for _ in range(3):
        _sync()
        t0 = time.perf_counter()
        out = fn()
        _sync()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    assert out is not None
    return best, out


if __name__ == "__main__":
    main()
