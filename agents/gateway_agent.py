"""GatewayAgentLoop: train a black-box agent that speaks OpenAI Chat Completions, unchanged.

    reset env -> task (observation) -> Gateway.open(ctx): base_url + key for this trajectory
      -> the agent runs (a Python callable, or a subprocess with OPENAI_BASE_URL and
         OPENAI_API_KEY in its environment) and calls the gateway as often as it likes
      -> every request goes through ctx (ledger, limits, logprobs, weight versions)
      -> the agent ends (or its timeout) -> reward: ``reward(env, messages)`` or the env's
         grade (``grade="final_answer"``: step with the last reply; ``"workspace"``: step with
         a user message, e.g. swe/Repo-v0 grades the workspace) -> an ordinary Trajectory

How a trajectory ends: the agent returned or exited 0 -> completed (or the limit a request hit:
``truncated_length`` / ``truncated_max_turns``, still graded); it ran past ``timeout_s`` ->
``truncated_time``, still graded; it raised or exited non-zero -> ``error_env`` with its
output's tail in ``error``; it never called the gateway -> ``error_env``; the model server
failed -> ``error_inference``. Only that trajectory is affected. The request/response log is in
``Trajectory.report["gateway"]`` (plus the subprocess's output tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from agentrl.agent import AgentLoop, RolloutContext, RolloutStop
from agentrl.env import Env
from agentrl.errors import ConfigError, EnvError, InferenceError
from agentrl.gateway import Gateway, GatewayContext
from agentrl.types import JSON, Message, RolloutStatus, Sample

FINISHED = Message(role="user", content="[the agent finished: the workspace is graded as it is]")


@dataclass(frozen=True, slots=True)
class GatewayTask:
    """What a Python agent gets: where to send requests, and the task."""

    base_url: str
    api_key: str
    model: str
    messages: list[JSON]  # the env's reset observation, as OpenAI messages
    env: Env | None
    sample: Sample

    @property
    def prompt(self) -> str:
        """The text of the last observation message (the task statement)."""
        return str(self.messages[-1].get("content") or "") if self.messages else ""


AgentFn = Callable[[GatewayTask], Any]
RewardFn = Callable[[Env | None, list[Message]], "float | Awaitable[float]"]


def _resolve(ref: str | Callable[..., Any] | None) -> Callable[..., Any] | None:
    if ref is None or callable(ref):
        return ref
    mod, _, name = ref.partition(":")
    if not name:
        raise ConfigError(f"gateway agent: expected 'module:function', got {ref!r}")
    return getattr(importlib.import_module(mod), name)  # type: ignore[no-any-return]


class GatewayAgentLoop(AgentLoop):
    """Runs ``agent`` (callable or ``"module:function"``) or ``command`` against a gateway.

    ``timeout_s``: wall time of the agent; ``honor_sampling``: use the request's temperature,
    top_p, top_k and seed (default: the rollout's sampling, as training expects; max_tokens
    and stop sequences are always honoured); ``grade``: how the env scores the end state when
    no ``reward`` function is given ("none": the reward stays 0); ``cwd``/``env_vars``: for
    the subprocess.
    """

    context_class = GatewayContext

    def __init__(
        self,
        agent: str | AgentFn | None = None,
        *,
        command: str | list[str] | None = None,
        timeout_s: float = 600.0,
        reward: str | RewardFn | None = None,
        grade: Literal["final_answer", "workspace", "none"] = "final_answer",
        honor_sampling: bool = False,
        model: str = "agentrl",
        cwd: str | None = None,
        env_vars: dict[str, str] | None = None,
    ) -> None:
        if (agent is None) == (command is None):
            raise ConfigError(
                "gateway agent: give exactly one of agent= (a callable or 'module:function') or "
                "command= (a command line); in a recipe: rollout.agent_options.agent or "
                f"rollout.agent_options.command (got agent={agent!r}, command={command!r})"
            )
        self.agent = _resolve(agent)
        self.command = shlex.split(command) if isinstance(command, str) else command
        self.timeout_s = timeout_s
        self.reward = _resolve(reward)
        self.grade = grade
        self.honor_sampling = honor_sampling
        self.model = model
        self.cwd = cwd
        self.env_vars = dict(env_vars or {})
        self._output: str | None = None  # the subprocess's output tail (one loop per rollout)

    async def run(self, sample: Sample, ctx: RolloutContext) -> None:
        if not isinstance(ctx, GatewayContext):
            raise ConfigError("GatewayAgentLoop needs a GatewayContext (its context_class)")
        task_messages: list[JSON] = []
        if ctx.env is not None:
            task_messages = [m.to_openai() for m in await ctx.reset()]
            ctx.messages.clear()  # the agent sends its own conversation
        gateway = await Gateway.shared()
        session = gateway.open(ctx, honor_sampling=self.honor_sampling, model=self.model)
        task = GatewayTask(
            session.base_url, session.key, self.model, task_messages, ctx.env, sample
        )
        failure: str | None = None
        timed_out = False
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    failure = await self._run_agent(task, ctx)
            except TimeoutError:
                timed_out = True
            finally:
                gateway.close(session)
            if session.failure is not None:
                raise InferenceError(str(session.failure))
            if failure is not None:
                raise EnvError(f"the agent failed: {failure}")
            if session.requests == 0:
                raise EnvError(
                    "the agent never called the gateway: check that it reads OPENAI_BASE_URL "
                    "and OPENAI_API_KEY (or the base_url/api_key it was given)"
                )
            await self._score(ctx)
        finally:  # after grading: an env's report replaces ctx.report
            ctx.report["gateway"] = session.report()
            if self._output is not None:
                ctx.report["agent_output"] = self._output
        if timed_out:
            raise RolloutStop(
                RolloutStatus.TRUNCATED_TIME, f"the agent ran past timeout_s={self.timeout_s:g}"
            )
        if session.stop is not None:
            raise session.stop

    async def _run_agent(self, task: GatewayTask, ctx: GatewayContext) -> str | None:
        """Run the agent; an error string if it failed."""
        if self.agent is not None:
            try:
                if inspect.iscoroutinefunction(self.agent):
                    await self.agent(task)
                else:  # a blocking agent must not block the loop the gateway serves from
                    out = await asyncio.to_thread(self.agent, task)
                    if inspect.isawaitable(out):
                        await out
            except Exception as e:
                return f"{type(e).__name__}: {e}"
            return None
        assert self.command is not None
        env = {
            **os.environ,
            **self.env_vars,
            "OPENAI_BASE_URL": task.base_url,
            "OPENAI_API_KEY": task.api_key,
            "AGENTRL_MODEL": task.model,
            "AGENTRL_TASK": task.prompt,
        }
        proc = await asyncio.create_subprocess_exec(
            *self.command,
            cwd=self.cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await proc.communicate()
        except BaseException:  # timeout or cancellation: the agent and its children go
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        tail = out.decode(errors="replace")[-4000:]
        self._output = tail
        if proc.returncode != 0:
            return f"exit status {proc.returncode}; output ends: {tail[-800:]}"
        return None

    async def _score(self, ctx: GatewayContext) -> None:
        if self.reward is not None:
            r = self.reward(ctx.env, list(ctx.messages))
            ctx.reward += float(await r if inspect.isawaitable(r) else r)
            return
        if self.grade == "none" or ctx.env is None:
            return
        if self.grade == "workspace":
            await ctx.step(FINISHED)
        else:
            last = next((m for m in reversed(ctx.messages) if m.role == "assistant"), None)
            await ctx.step(last or Message(role="assistant", content=""))
