"""Collect rollouts: run AgentLoops concurrently and stream finished groups.

    Sample --(group_size copies, same uid)--> AgentLoop.run(sample, ctx)
           <-> Generator.generate (HTTP)  <-> Env.areset/astep, ToolSet
           --> Trajectory (status, ledger, reward, timings) --> TrajectoryGroup (as it finishes)

Everything runs on one asyncio event loop: a rollout is a coroutine, not a thread, so
thousands fit in one process. ``max_concurrency`` bounds the trajectories in flight (a
semaphore); samples are pulled lazily, so a long dataset never becomes a long task list.
``stream`` yields each ``TrajectoryGroup`` the moment its last member finishes (no whole-batch
barrier). A rollout never raises out of the collector: every failure becomes a
``RolloutStatus`` on its trajectory (see ``agentrl.agent.status_for``), and one failing
member never cancels its siblings (an unknown or doubly registered AgentLoop name is a
configuration error: ``run_group`` raises it once). Each trajectory records the AgentLoop's
name (``Trajectory.agent``). An optional ``Rubric`` scores each finished group
(group-aware reward functions see all members); its failure is ``error_reward``. The
context of a rollout is an instance of the loop's ``AgentLoop.context_class``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl.agent import AGENTS, AgentLoop, Limits, RolloutContext, make_agent, status_for
from agentrl.chat import ChatTemplate
from agentrl.env import Env, make_env
from agentrl.errors import ConfigError, EnvError
from agentrl.inference.protocol import Generator, SamplingParams
from agentrl.reward import Rubric
from agentrl.rollout.metrics import rollout_metrics
from agentrl.tool_parsers import TOOL_PARSERS, ToolParser, get_tool_parser
from agentrl.types import RolloutStatus, Sample, Trajectory, TrajectoryGroup

logger = logging.getLogger(__name__)

__all__ = ["CollectorConfig", "RolloutCollector", "rollout_metrics"]


@dataclass(kw_only=True)
class CollectorConfig:
    group_size: int = 4
    """Rollouts per sample (the GRPO group); they share the sample's uid."""
    max_concurrency: int = 256
    """Trajectories in flight at once."""
    max_turns: int = 8
    """Assistant turns per rollout; one more ends it as truncated_max_turns."""
    max_tokens: int = 4096
    """Context length of one segment (prompt + completions); full -> truncated_length."""
    max_new_tokens: int = 512
    """Tokens per assistant turn (capped by what is left of max_tokens)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    tool_parser: str | None = "hermes"
    """Tool-call parser (agentrl.tool_parsers); None: replies are plain text."""
    agent: str = "tool_calling"
    """AgentLoop for samples that do not name one (Sample.agent)."""
    agent_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``agent`` (over its registered defaults), e.g. for ``gateway``:
    ``{command: "python my_agent.py", timeout_s: 900, grade: workspace}``."""
    timeout_s: float = 600.0
    """Wall-clock limit per rollout; past it the rollout is aborted."""
    check_ledger: bool = False
    """Compare every ledger with a full render (slow); mismatches -> metric ledger_mismatch."""

    def validate(self) -> None:
        for name in ("group_size", "max_concurrency", "max_turns", "max_tokens", "max_new_tokens"):
            v = getattr(self, name)
            if v < 1:
                raise ConfigError(f"rollout.{name} must be >= 1, got {v}")
        if self.timeout_s <= 0:
            raise ConfigError(f"rollout.timeout_s must be > 0, got {self.timeout_s}")


class RolloutCollector:
    """Runs AgentLoops for samples and streams ``TrajectoryGroup``s. See the module docstring."""

    Config = CollectorConfig

    def __init__(
        self,
        config: CollectorConfig,
        generator: Generator,
        template: ChatTemplate,
        *,
        rubric: Rubric | None = None,
    ) -> None:
        config.validate()
        AGENTS.get(config.agent)  # fail early on an unknown (or doubly registered) default loop
        if config.agent_options:
            self._make_agent(config.agent, config)  # and on options the loop does not take
        if config.tool_parser is not None:
            TOOL_PARSERS.spec(config.tool_parser)
        self.config = config
        self.generator = generator
        self.template = template
        self.rubric = rubric
        self._parser: ToolParser | None = (
            get_tool_parser(config.tool_parser) if config.tool_parser is not None else None
        )
        self._limits = Limits(
            max_turns=config.max_turns,
            max_tokens=config.max_tokens,
            max_new_tokens=config.max_new_tokens,
        )
        self._sampling = SamplingParams(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            stop_token_ids=template.stop_token_ids,
        )
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._inflight: set[asyncio.Task[Trajectory]] = set()
        template.is_prefix_preserving()  # probe once, up front

    # --- public API -----------------------------------------------------------------------
    async def stream(
        self, samples: Iterable[Sample] | AsyncIterable[Sample]
    ) -> AsyncIterator[TrajectoryGroup]:
        """Yield each sample's group as soon as all its rollouts finish (completion order)."""
        source = _aiter(samples)
        cfg = self.config
        max_groups = math.ceil(cfg.max_concurrency / cfg.group_size) + 1
        pending: set[asyncio.Task[TrajectoryGroup]] = set()
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < max_groups:
                    try:
                        sample = await anext(source)
                    except StopAsyncIteration:
                        exhausted = True
                        break
                    pending.add(asyncio.create_task(self.run_group(sample)))
                if not pending:
                    return
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def collect(
        self, samples: Iterable[Sample] | AsyncIterable[Sample]
    ) -> list[TrajectoryGroup]:
        """All groups, in completion order."""
        return [g async for g in self.stream(samples)]

    async def run_group(self, sample: Sample) -> TrajectoryGroup:
        """``group_size`` rollouts of one sample, run concurrently, then scored by the rubric."""
        AGENTS.get(sample.agent or self.config.agent)  # a bad name fails once, not per rollout
        tasks = [
            asyncio.create_task(self.run_trajectory(sample)) for _ in range(self.config.group_size)
        ]
        trajs = list(await asyncio.gather(*tasks))
        if self.rubric is not None:
            await self._score(trajs)
        return TrajectoryGroup(uid=sample.uid, trajectories=trajs)

    async def run_trajectory(self, sample: Sample) -> Trajectory:
        """One rollout; never raises (failures are statuses). ``abort()`` ends it as aborted."""
        async with self._sem:
            task = asyncio.current_task()
            if task is not None:
                self._inflight.add(task)  # type: ignore[arg-type]
            t0 = time.perf_counter()
            try:
                traj = await self._run(sample)
            finally:
                if task is not None:
                    self._inflight.discard(task)  # type: ignore[arg-type]
            traj.wall_time_s = time.perf_counter() - t0
            return traj

    def abort(self) -> int:
        """Cancel every rollout in flight; each ends with status ``aborted``. Returns how many."""
        n = 0
        for task in list(self._inflight):
            n += int(task.cancel())
        return n

    @staticmethod
    def metrics(groups: Iterable[TrajectoryGroup]) -> dict[str, float]:
        return rollout_metrics(t for g in groups for t in g.trajectories)

    # --- one rollout ----------------------------------------------------------------------
    async def _run(self, sample: Sample) -> Trajectory:
        env: Env | None = None
        ctx: RolloutContext | None = None
        timeout = asyncio.timeout(self.config.timeout_s)
        agent_name = sample.agent or self.config.agent
        try:
            agent = self._make_agent(agent_name, self.config)
            env = self._make_env(sample)
            ctx = agent.context_class(
                sample=sample,
                generator=self.generator,
                template=self.template,
                env=env,
                tool_parser=self._parser,
                sampling=self._sampling,
                limits=self._limits,
                session_id=sample.uid,
            )
            async with timeout:
                result = await agent.run(sample, ctx)
            traj = result if result is not None else ctx.trajectory()
        except (Exception, asyncio.CancelledError) as e:
            traj = self._failed(sample, ctx, e, deadline=timeout.expired())
        finally:
            if env is not None:
                await _close(env)
        traj.agent = agent_name
        if self.config.check_ledger and ctx is not None:
            self._check_ledger(ctx, traj)
        return traj

    @staticmethod
    def _make_agent(name: str, cfg: CollectorConfig) -> AgentLoop:
        """The loop for one rollout; ``agent_options`` apply to the default loop only."""
        if name != cfg.agent or not cfg.agent_options:
            return make_agent(name)
        try:
            return make_agent(name, **cfg.agent_options)
        except TypeError as e:
            raise ConfigError(
                f"rollout.agent_options {sorted(cfg.agent_options)} do not fit agent loop "
                f"{name!r}: {e}. See that loop class's docstring for its options."
            ) from None

    def _make_env(self, sample: Sample) -> Env:
        try:
            return make_env(sample.env_id, **sample.env_kwargs)
        except Exception as e:
            raise EnvError(f"could not make env {sample.env_id!r}: {type(e).__name__}: {e}") from e

    def _failed(
        self, sample: Sample, ctx: RolloutContext | None, e: BaseException, *, deadline: bool
    ) -> Trajectory:
        if deadline:
            status = RolloutStatus.ABORTED
            msg = f"rollout exceeded timeout_s={self.config.timeout_s}"
        elif isinstance(e, asyncio.CancelledError):
            status, msg = RolloutStatus.ABORTED, "rollout cancelled"
        else:
            status = status_for(e)
            msg = f"{type(e).__name__}: {e}"
            if status.is_truncated:
                msg = str(e)
            elif status is RolloutStatus.ERROR_ENV and not isinstance(e, EnvError):
                logger.warning("rollout of %s raised %s", sample.env_id, msg, exc_info=e)
        if ctx is None:
            return Trajectory(sample=sample, status=status, error=msg)
        return ctx.trajectory(status=status, error=None if status.is_truncated else msg)

    def _check_ledger(self, ctx: RolloutContext, traj: Trajectory) -> None:
        bad = [(i, r) for i, r in ctx.check_ledger() if not r.ok]
        traj.metrics["ledger_mismatch"] = float(len(bad))
        for i, r in bad[:1]:
            logger.warning(
                "token ledger segment %d of %s differs from the render: %s", i, traj.id, r.mismatch
            )

    async def _score(self, trajs: list[Trajectory]) -> None:
        assert self.rubric is not None
        scored = [t for t in trajs if not t.status.is_infra_failure]
        if not scored:
            return
        infos = [{**t.sample.extra, "sample": t.sample, "env_reward": t.reward} for t in scored]
        try:
            results = await self.rubric.score_group(scored, infos)
        except Exception as e:
            results = None
            err = f"rubric failed: {type(e).__name__}: {e}"
        for i, t in enumerate(scored):
            r = results[i] if results is not None else None
            if r is None or r.error or not math.isfinite(r.total):
                t.status = RolloutStatus.ERROR_REWARD
                t.error = (
                    (r.error or f"rubric gave a non-finite reward ({r.total})")
                    if r is not None
                    else err
                )
                continue
            t.reward = r.total
            t.reward_components.update(r.components)
            t.metrics.update({f"reward/{k}": v for k, v in r.metrics.items()})


async def _close(env: Env) -> None:
    try:
        await env.aclose()
    except Exception as e:
        logger.warning("closing env %s failed: %s", type(env).__name__, e)


async def _aiter(samples: Iterable[Sample] | AsyncIterable[Sample]) -> AsyncIterator[Sample]:
    if isinstance(samples, AsyncIterable):
        async for s in samples:
            yield s
    else:
        for s in samples:
            yield s
