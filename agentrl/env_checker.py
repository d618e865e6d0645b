"""Check that an env keeps the Env contract: agentrl's checks plus Gymnasium's.

    report = check_env("games/GuessNumber-v0")          # or an Env instance
    print(report)                                       # one line per check: ok / FAIL / skip
    check_env(env, raise_on_failure=True)               # EnvCheckError listing the failures

Checks, in order (each becomes a ``CheckResult``):
  spaces        observation_space / action_space are gymnasium Spaces
  reset         reset(seed) returns (non-empty list[Message] in the space, dict)
  determinism   two episodes with the same seed and the same actions (sampled ones, then the
                env's demonstration when it has one) agree on every observation, reward and
                end, for up to DETERMINISM_STEPS steps (skipped if nondeterministic)
  step          step(sampled action) returns (list[Message], finite float, bool, bool, dict)
  tools         every tool schema is a valid OpenAI function tool (JSON schema of an object)
  demonstration demonstration() replays to terminated with a positive reward, and the
                observations it contains are the ones the env returns
  sync_async    reset/step and areset/astep agree, e.g. for a SyncEnv that overrides astep
                (skipped if nondeterministic)
  gymnasium     gymnasium.utils.env_checker.check_env (render check skipped; determinism
                parts skipped for nondeterministic envs); its warnings go to report.warnings

The checker drives the sync API (``reset``/``step``, which run an async env's ``areset``/``astep``
in an event loop of their own); called from inside a running loop it moves itself to a worker
thread. An env built by ``make_env`` keeps its spec; Gymnasium's checker sees it. The CLI uses
``list_envs`` and ``check_env_cli``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from agentrl.env import ENVS, Env, StepResult, make_env
from agentrl.errors import EnvCheckError
from agentrl.types import Message

logger = logging.getLogger(__name__)

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    name: str
    passed: bool
    message: str = ""
    skipped: bool = False

    def __str__(self) -> str:
        tag = "skip" if self.skipped else ("ok" if self.passed else "FAIL")
        return f"[{tag:>4}] {self.name}" + (f": {self.message}" if self.message else "")


@dataclass(kw_only=True)
class EnvCheckReport:
    """What ``check_env`` found: one result per check, plus Gymnasium's warnings."""

    env_id: str
    results: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def __str__(self) -> str:
        head = f"env {self.env_id}: {'passed' if self.passed else f'{len(self.failed)} check(s) failed'}"
        lines = [head, *(f"  {r}" for r in self.results)]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        if not self.passed:
            details = "; ".join(f"{r.name}: {r.message}" for r in self.failed)
            raise EnvCheckError(f"env {self.env_id} failed {len(self.failed)} check(s): {details}")


def check_env(
    env_or_id: Env | str,
    *,
    seeds: Sequence[int] = (0, 1),
    skip_determinism: bool | None = None,
    raise_on_failure: bool = False,
    env_kwargs: dict[str, Any] | None = None,
) -> EnvCheckReport:
    """Run every check on an env (an instance, or a registered id built with ``env_kwargs``).

    ``skip_determinism`` defaults to the env's ``nondeterministic`` flag. Unknown ids raise
    ``UnknownEnvError`` (with "did you mean"); failed checks raise ``EnvCheckError`` only when
    ``raise_on_failure`` is set.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        report = _check(env_or_id, seeds, skip_determinism, env_kwargs or {})
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            report = pool.submit(
                _check, env_or_id, seeds, skip_determinism, env_kwargs or {}
            ).result()
    if raise_on_failure:
        report.raise_if_failed()
    return report


def _check(
    env_or_id: Env | str,
    seeds: Sequence[int],
    skip_determinism: bool | None,
    env_kwargs: dict[str, Any],
) -> EnvCheckReport:
    if isinstance(env_or_id, str):
        env_id = env_or_id
        env = make_env(env_or_id, **env_kwargs)  # UnknownEnvError propagates: a usage error
    else:
        env, env_id = env_or_id, type(env_or_id).__name__
    skip_det = env.nondeterministic if skip_determinism is None else skip_determinism
    report = EnvCheckReport(env_id=env_id)
    checks: list[tuple[str, Callable[[], str | None]]] = [
        ("spaces", lambda: _check_spaces(env)),
        ("reset", lambda: _check_reset(env, seeds)),
        ("determinism", lambda: None if skip_det else _check_determinism(env, seeds)),
        ("step", lambda: _check_step(env, seeds[0])),
        ("tools", lambda: _check_tools(env)),
        ("demonstration", lambda: _check_demonstration(env, seeds)),
        ("sync_async", lambda: None if skip_det else _check_sync_async(env, seeds[0])),
        ("gymnasium", lambda: _check_gymnasium(env, env_id, skip_det, report)),
    ]
    for name, fn in checks:
        if name in ("determinism", "sync_async") and skip_det:
            report.results.append(
                CheckResult(name=name, passed=True, skipped=True, message="nondeterministic env")
            )
            continue
        try:
            msg = fn()
        except _Skip as s:
            report.results.append(CheckResult(name=name, passed=True, skipped=True, message=str(s)))
            continue
        except Exception as e:
            logger.debug("check %s raised", name, exc_info=True)
            msg = f"{type(e).__name__}: {e}"
        report.results.append(CheckResult(name=name, passed=msg is None, message=msg or ""))
    try:
        env.close()
    except Exception as e:
        report.results.append(
            CheckResult(name="close", passed=False, message=f"close() raised {e!r}")
        )
    return report


class _Skip(Exception):
    pass


def _check_spaces(env: Env) -> str | None:
    for attr in ("observation_space", "action_space"):
        sp = getattr(env, attr, None)
        if not isinstance(sp, gym.spaces.Space):
            return f"env.{attr} must be a gymnasium.spaces.Space (e.g. agentrl.spaces.MessagesSpace), got {sp!r}"
    return None


def _obs_problem(obs: Any, env: Env, where: str) -> str | None:
    if not isinstance(obs, list) or not all(isinstance(m, Message) for m in obs):
        return f"{where} must return a list[Message] observation, got {_typename(obs)}"
    if obs not in env.observation_space:
        return f"{where} returned an observation outside observation_space {env.observation_space!r}: {obs!r:.200}"
    return None


def _typename(x: Any) -> str:
    if isinstance(x, list):
        return "list[" + ", ".join(sorted({type(m).__name__ for m in x})) + "]"
    return type(x).__name__


def _check_reset(env: Env, seeds: Sequence[int]) -> str | None:
    for seed in seeds:
        out = env.reset(seed=seed)
        if not isinstance(out, tuple) or len(out) != 2:
            return f"reset(seed={seed}) must return (observation, info), got {_typename(out)}"
        obs, info = out
        problem = _obs_problem(obs, env, f"reset(seed={seed})")
        if problem:
            return problem
        if not obs:
            return (
                f"reset(seed={seed}) returned no messages; the first observation is the task prompt"
            )
        if not isinstance(info, dict):
            return f"reset(seed={seed}) must return a dict info, got {_typename(info)}"
    return None


DETERMINISM_STEPS = 8
"""Steps of each same-seed episode pair that the determinism check compares."""

_DETERMINISM_FIX = (
    "derive all randomness (hidden state included) from self.np_random, "
    "or set the class attribute nondeterministic = True"
)


def _check_determinism(env: Env, seeds: Sequence[int]) -> str | None:
    """Replay each seed twice with the same actions; the episodes must agree step by step."""
    for seed in seeds:
        env.action_space.seed(seed)
        sampled = [env.action_space.sample() for _ in range(DETERMINISM_STEPS)]
        env.reset(seed=seed)
        demo = env.demonstration()
        plans = [("sampled", sampled)]
        if demo is not None:
            plans.append(("demonstration", [m for m in demo if m.role == "assistant"]))
        for kind, actions in plans:
            a, demo_a = _episode(env, seed, actions)
            b, demo_b = _episode(env, seed, actions)
            if demo_a != demo_b:
                return (
                    f"reset(seed={seed}) twice gave different demonstrations "
                    f"({demo_a!r:.120} vs {demo_b!r:.120}), so the hidden task differs; "
                    + _DETERMINISM_FIX
                )
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                if x != y:
                    where = f"reset(seed={seed})" if i == 0 else f"step {i} ({kind} actions)"
                    return (
                        f"two episodes with seed {seed} differ at {where}: "
                        f"{x!r:.160} vs {y!r:.160}; " + _DETERMINISM_FIX
                    )
            if len(a) != len(b):
                return (
                    f"two episodes with seed {seed} and the same {kind} actions ended after "
                    f"{len(a) - 1} and {len(b) - 1} steps; " + _DETERMINISM_FIX
                )
    return None


def _episode(
    env: Env, seed: int, actions: list[Message]
) -> tuple[list[tuple[Any, ...]], list[Message] | None]:
    """Reset with ``seed`` and step ``actions`` until the episode ends.

    Returns the reset observation and each step's (observation, reward, terminated,
    truncated) in order, and the demonstration the env offered after the reset.
    """
    obs, _ = env.reset(seed=seed)
    demo = env.demonstration()
    trace: list[tuple[Any, ...]] = [(obs,)]
    for action in actions:
        o, r, terminated, truncated, _ = env.step(action)
        trace.append((o, float(r), bool(terminated), bool(truncated)))
        if terminated or truncated:
            break
    return trace, demo


def _step_problem(out: Any, env: Env, where: str) -> str | None:
    if not isinstance(out, tuple) or len(out) != 5:
        return (
            f"{where} must return (obs, reward, terminated, truncated, info), got {_typename(out)}"
        )
    obs, reward, terminated, truncated, info = out
    problem = _obs_problem(obs, env, where)
    if problem:
        return problem
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return f"{where} reward must be a finite float, got {reward!r}"
    for nm, v in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(v, bool):
            return f"{where} {nm} must be a bool, got {type(v).__name__}"
    if not isinstance(info, dict):
        return f"{where} info must be a dict, got {type(info).__name__}"
    return None


def _check_step(env: Env, seed: int) -> str | None:
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for i in range(3):
        action = env.action_space.sample()
        out = env.step(action)
        problem = _step_problem(out, env, f"step #{i + 1} (sampled action)")
        if problem:
            return problem
        if out[2] or out[3]:
            break
    return None


def _check_tools(env: Env) -> str | None:
    if env.tools is None:
        raise _Skip("env has no tools")
    seen: set[str] = set()
    for schema in env.tools.schemas():
        fn = schema.get("function") if isinstance(schema, dict) else None
        if (
            not isinstance(schema, dict)
            or schema.get("type") != "function"
            or not isinstance(fn, dict)
        ):
            return f"tool schema must look like {{'type': 'function', 'function': {{...}}}}, got {schema!r:.200}"
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name) or name in seen:
            return f"tool name {name!r} must be unique and match {_TOOL_NAME.pattern}"
        seen.add(name)
        if not isinstance(fn.get("description"), str) or not fn["description"]:
            return f"tool {name!r} needs a description (the function's docstring)"
        problem = _parameters_problem(name, fn.get("parameters"))
        if problem:
            return problem
    return None


def _parameters_problem(name: str, params: Any) -> str | None:
    if not isinstance(params, dict) or params.get("type") != "object":
        return f"tool {name!r} parameters must be a JSON schema with type 'object', got {params!r:.200}"
    props = params.get("properties", {})
    required = params.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list):
        return f"tool {name!r}: 'properties' must be an object and 'required' a list"
    missing = [r for r in required if r not in props]
    if missing:
        return f"tool {name!r}: required {missing} are not in properties"
    try:
        import jsonschema
    except ImportError:  # the structural checks above still ran
        return None
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as e:
        return f"tool {name!r} parameters are not a valid JSON schema: {e.message}"
    return None


def _check_demonstration(env: Env, seeds: Sequence[int]) -> str | None:
    ran = False
    for seed in seeds:
        env.reset(seed=seed)
        demo = env.demonstration()
        if demo is None:
            raise _Skip("demonstration() returns None")
        ran = True
        problem = replay_demonstration(env, demo, where=f"seed={seed}")
        if problem:
            return problem
    return None if ran else "no seeds given"


def replay_demonstration(env: Env, demo: list[Message], *, where: str = "") -> str | None:
    """Step the demo's assistant messages (the env is already reset); a problem or None."""
    expected: list[Message] = []
    last: StepResult | None = None
    i = 0
    while i < len(demo):
        msg = demo[i]
        if msg.role != "assistant":
            return f"demonstration ({where}) message {i} is {msg.role!r}; expected an assistant message"
        if last is not None and (last[2] or last[3]):
            return f"demonstration ({where}) continues after the episode ended at message {i}"
        j = i + 1
        while j < len(demo) and demo[j].role != "assistant":
            j += 1
        expected = demo[i + 1 : j]
        last = env.step(msg)
        problem = _step_problem(last, env, f"demonstration step at message {i}")
        if problem:
            return problem
        if last[0] != expected:
            return (
                f"demonstration ({where}) after message {i} expects {expected!r:.200} "
                f"but the env returned {last[0]!r:.200}"
            )
        i = j
    if last is None or not last[2]:
        return f"demonstration ({where}) did not reach terminated=True"
    if last[1] <= 0:
        return f"demonstration ({where}) ended with reward {last[1]}; an oracle should earn > 0"
    return None


def _check_sync_async(env: Env, seed: int) -> str | None:
    env.action_space.seed(seed)
    action = env.action_space.sample()
    obs_s, _ = env.reset(seed=seed)
    step_s = env.step(action)

    async def run() -> tuple[list[Message], StepResult]:
        obs, _ = await env.areset(seed=seed)
        return obs, await env.astep(action)

    obs_a, step_a = asyncio.run(run())
    if obs_s != obs_a:
        return f"reset and areset disagree for seed {seed}: {obs_s!r:.120} vs {obs_a!r:.120}"
    if step_s[:4] != step_a[:4]:
        return (
            f"step and astep disagree for seed {seed}: {step_s[:4]!r:.160} vs {step_a[:4]!r:.160}"
        )
    return None


def _check_gymnasium(env: Env, env_id: str, skip_det: bool, report: EnvCheckReport) -> str | None:
    from gymnasium.utils.env_checker import check_env as gym_check_env

    inner = env.unwrapped
    old_spec = inner.spec
    # Gymnasium's checker reads spec.nondeterministic; an env built directly has no spec yet.
    if old_spec is not None:
        inner.spec = dataclasses.replace(old_spec, nondeterministic=skip_det)
    else:
        gym_id = env_id if "/" in env_id or "-v" in env_id else f"agentrl/{env_id}-v0"
        inner.spec = EnvSpec(
            id=gym_id,
            entry_point=f"{type(inner).__module__}:{type(inner).__qualname__}",
            nondeterministic=skip_det,
        )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gym_check_env(env, skip_render_check=True, skip_close_check=True)
    except AssertionError as e:
        return f"gymnasium check_env: {e}"
    finally:
        inner.spec = old_spec
    report.warnings += [str(w.message) for w in caught if "unwrapped" not in str(w.message)]
    return None


def list_envs() -> list[tuple[str, str, str]]:
    """Every registered env as ``(id, entry_point, description)``, sorted by id."""
    return [(s.id, s.entry_point_str, s.description) for s in ENVS]


def check_env_cli(env_id: str, env_kwargs: dict[str, Any] | None = None) -> EnvCheckReport:
    """``agentrl envs check ID``: the report for a registered id (UnknownEnvError: did you mean)."""
    return check_env(env_id, env_kwargs=env_kwargs)
