"""Train/eval splits decided by a task's content, never by its seed.

    split_of("Compute \"7 * 4\" with the calculator.")          -> "train" or "eval", stable
    obs, info = await reset_in_split(env, seed=12, split="eval") # redraws until the task is eval

Two seeds can draw the same task, so seeds alone cannot keep evaluation tasks out of training:
with one-digit operands ``arith/Calculator-v0`` has 81 tasks, and 128 "held-out" seeds repeat
tasks that SFT and RL also saw. Here a task's *content* decides its split: ``Env.task_key``
names the task (by default the text of its first observation), a keyed hash of that key maps it
to a number in [0, 1), and keys below ``eval_fraction`` are evaluation tasks. The hash is
BLAKE2b, so the split is the same on every machine, Python version and run.

``reset_in_split`` is the one place envs are reset for a split: SFT demonstrations, RL samples
and eval samples all go through it (``RolloutContext.reset`` and ``trainers.sft``). It resets
with the sample's seed and, while the task falls in the other split, with seeds derived from it
(deterministically), so the same sample always gives the same task. An env whose reset is
expensive (a sandbox, a repository) can read ``options["split"]`` and draw from the right split
itself; the check then passes at the first draw.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

from agentrl.errors import ConfigError, EnvError

if TYPE_CHECKING:
    from agentrl.env import Env, Info, Observation
    from agentrl.types import Sample

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")
DEFAULT_EVAL_FRACTION = 0.2
MAX_DRAWS = 256
"""Resets tried before giving up; at eval_fraction 0.2 an eval draw fails 256 times with
probability 0.8**256 (about 1e-25) unless the env's tasks really all fall in one split."""

_SALT = b"agentrl-split-v1"


def split_point(key: str) -> float:
    """The task key's position in [0, 1): a keyed BLAKE2b hash, the same everywhere."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=_SALT).digest()
    return int.from_bytes(digest, "big") / 2**64


def split_of(key: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Split:
    """``"eval"`` for the ``eval_fraction`` of task keys whose hash falls below it, else ``"train"``."""
    check_fraction(eval_fraction)
    return "eval" if split_point(key) < eval_fraction else "train"


def check_fraction(eval_fraction: float, key: str = "data.eval_fraction") -> None:
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(
            f"{key} must be in (0, 1), got {eval_fraction}; 0.2 puts a fifth of the tasks "
            "in the eval split"
        )


def check_split(split: str) -> Split:
    if split not in SPLITS:
        raise ConfigError(f"split must be 'train' or 'eval', got {split!r}")
    return split  # type: ignore[return-value]


def draw_seed(seed: int | None, draw: int) -> int | None:
    """The seed of the ``draw``-th reset for a sample seeded ``seed`` (draw 0: the seed itself)."""
    if draw == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{draw}".encode(), digest_size=4, key=_SALT).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


async def reset_in_split(
    env: Env,
    *,
    seed: int | None,
    split: Split,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    options: dict[str, Any] | None = None,
) -> tuple[Observation, Info]:
    """Reset ``env`` to a task of ``split``; deterministic for a given seed.

    Raises EnvError when ``MAX_DRAWS`` resets never land in the split (an env whose
    ``task_key`` is the same for every task, e.g. a hidden secret behind a fixed prompt:
    override ``Env.task_key`` to name the task).
    """
    check_split(split)
    check_fraction(eval_fraction)
    opts = {**(options or {}), "split": split, "eval_fraction": eval_fraction}
    keys: set[str] = set()
    for draw in range(MAX_DRAWS):
        obs, info = await env.areset(seed=draw_seed(seed, draw), options=opts)
        key = env.task_key(obs, info)
        if split_of(key, eval_fraction) == split:
            return obs, info
        keys.add(key)
    shown = next(iter(keys))[:80]
    raise EnvError(
        f"{type(env).__name__}: {MAX_DRAWS} resets from seed {seed} drew no {split!r} task "
        f"(eval_fraction={eval_fraction}; {len(keys)} distinct task keys seen, e.g. {shown!r}). "
        "If the env's tasks differ in hidden state (the first observation is always the "
        "same), override Env.task_key to name the task; if it has very few tasks, raise or "
        "lower data.eval_fraction."
    )


async def reset_sample(
    env: Env, sample: Sample, *, options: dict[str, Any] | None = None
) -> tuple[Observation, Info]:
    """Reset ``env`` for ``sample``: in its split when it has one, else with its seed as is."""
    if sample.split is None:
        return await env.areset(seed=sample.seed, options=options)
    return await reset_in_split(
        env,
        seed=sample.seed,
        split=check_split(sample.split),
        eval_fraction=sample.eval_fraction,
        options=options,
    )
