"""AgentLoop: the one class users subclass to drive a rollout, and the context it runs in.

    Sample -> AgentLoop.run(sample, ctx) -> ctx.generate() / ctx.step() / ctx.call_tools()
           -> RolloutContext (messages + TokenLedger + reward + metrics) -> Trajectory

``run`` returns None; the context builds the ``Trajectory`` (messages, token ledger, reward,
turns, timings, metrics). A loop that wants to adjust the result may instead return
``ctx.trajectory()`` after editing it. Example::

    class Answer(AgentLoop):
        async def run(self, sample, ctx):
            await ctx.reset()                   # env observation -> messages
            reply = await ctx.generate()        # prompt delta (mask 0) + completion (mask 1)
            await ctx.step(reply.message)       # env reward, observation

The context does the bookkeeping a loop must never get wrong: token-in-token-out ledger,
loss mask, logprobs and weight versions, limits, timings. When a limit is hit, ``generate``
raises ``RolloutStop`` (the machinery catches it and records ``truncated_max_turns`` or
``truncated_length``), so code after it does not run: use try/finally for cleanup.
Failures become statuses (``status_for``): InferenceError -> error_inference, EnvError or any
exception inside the env -> error_env, SandboxError -> error_sandbox, ToolError ->
error_tool, RewardError -> error_reward, cancellation/deadline/abort -> aborted.

Each step of a turn is a named hook of ``RolloutContext`` that a subclass may override;
``AgentLoop.context_class`` picks the subclass the collector builds for a loop::

    ctx.act() -> generate: should_stop -> build_prompt -> call_model -> parse_actions
              -> call_tools: run_tools -> observe("tools")       (act(tools=True) only)
              -> add_parse_errors: observe("parse_errors")     (a reply with parse errors)
    ctx.reset() / ctx.step() -> observe("reset" / "step")
"""

from __future__ import annotations

import dataclasses
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from agentrl.chat import ChatTemplate, LedgerCheck
from agentrl.env import Env, Info
from agentrl.errors import (
    AbortedError,
    EnvError,
    InferenceError,
    RewardError,
    SandboxError,
    ToolError,
)
from agentrl.inference.protocol import Completion, Generator, SamplingParams
from agentrl.registry import MODULES_HINT, Registry
from agentrl.rollout.ledger import TokenLedger
from agentrl.splits import reset_sample
from agentrl.tool import ToolSet
from agentrl.tool_parsers import ToolParser, format_error_observation
from agentrl.types import Message, RolloutStatus, Sample, ToolCall, Trajectory, Turn


class RolloutStop(Exception):
    """Raised by ``RolloutContext.generate`` when a limit ends the rollout; carries the status."""

    def __init__(self, status: RolloutStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def status_for(exc: BaseException) -> RolloutStatus:
    """The RolloutStatus an exception escaping a rollout stands for."""
    if isinstance(exc, RolloutStop):
        return exc.status
    for cls, status in (
        (AbortedError, RolloutStatus.ABORTED),
        (InferenceError, RolloutStatus.ERROR_INFERENCE),
        (SandboxError, RolloutStatus.ERROR_SANDBOX),
        (RewardError, RolloutStatus.ERROR_REWARD),
        (ToolError, RolloutStatus.ERROR_TOOL),
        (EnvError, RolloutStatus.ERROR_ENV),
    ):
        if isinstance(exc, cls):
            return status
    return RolloutStatus.ERROR_ENV  # an unexpected exception in env or loop code


ObservationSource = Literal["reset", "step", "tools", "parse_errors"]
"""Where observation messages come from (``RolloutContext.observe``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Per-rollout limits. ``max_tokens`` is the context length of one segment."""

    max_turns: int = 8
    max_tokens: int = 4096
    max_new_tokens: int = 512


@dataclass(frozen=True, slots=True)
class Reply:
    """One assistant turn: the parsed message, parse errors and how the completion ended."""

    message: Message
    errors: list[str]
    finish_reason: str
    completion: Completion

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.message.tool_calls

    @property
    def text(self) -> str:
        return self.message.text

    @property
    def ok(self) -> bool:
        """True when the completion parsed cleanly (no tool-call parse errors)."""
        return not self.errors


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What ``ctx.step`` got from the env (its observation is already in the conversation)."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: Info

    @property
    def done(self) -> bool:
        """The episode is over (the env terminated or truncated it)."""
        return self.terminated or self.truncated


class RolloutContext:
    """Everything an AgentLoop uses: generation, the env and its tools, limits, the ledger.

    Hooks a subclass may override (see the module docstring for the order): ``should_stop``,
    ``build_prompt``, ``call_model``, ``parse_actions``, ``run_tools``, ``observe``.
    """

    def __init__(
        self,
        *,
        sample: Sample,
        generator: Generator,
        template: ChatTemplate,
        env: Env | None = None,
        tools: ToolSet | None = None,
        tool_parser: ToolParser | None = None,
        sampling: SamplingParams | None = None,
        limits: Limits | None = None,
        session_id: str | None = None,
    ) -> None:
        self.sample = sample
        self.env = env
        self.generator = generator
        self.template = template
        self.tool_parser = tool_parser
        self.limits = limits or Limits()
        self.sampling = sampling or SamplingParams(
            max_new_tokens=self.limits.max_new_tokens, stop_token_ids=template.stop_token_ids
        )
        self.messages: list[Message] = []
        self.turns: list[Turn] = []
        self.reward = 0.0
        self.reward_components: dict[str, float] = {}
        self.metrics: dict[str, float] = {
            "tool_calls": 0.0,
            "tool_errors": 0.0,
            "parse_errors": 0.0,
        }
        self.llm_time_s = 0.0
        self.env_time_s = 0.0
        self.env_truncated = False
        self.report: dict[str, Any] = {}
        self.session_id = session_id
        self._turn_of_message: dict[int, int] = {}
        self._tools = tools if tools is not None else (env.tools if env is not None else None)
        self.ledger = TokenLedger.for_template(template, self._schemas())

    # --- tools ----------------------------------------------------------------------------
    @property
    def tools(self) -> ToolSet | None:
        """The tools shown to the model (the env's by default)."""
        return self._tools

    @tools.setter
    def tools(self, tools: ToolSet | None) -> None:
        if self.ledger.segments:
            raise RuntimeError("set ctx.tools before the first generate(): the prompt shows them")
        self._tools = tools
        self.ledger.tools = self._schemas()

    def _schemas(self) -> list[Any] | None:
        return self._tools.schemas() if self._tools is not None and len(self._tools) else None

    # --- conversation ---------------------------------------------------------------------
    def add_messages(self, messages: Iterable[Message | dict[str, Any]]) -> None:
        """Append env/tool/user messages; they become prompt tokens at the next generate()."""
        self.messages.extend(Message.coerce(m) for m in messages)

    def new_segment(self) -> None:
        """Start a new training segment: the next prompt is a full render of the conversation."""
        self.ledger.new_segment()

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    # --- generation -----------------------------------------------------------------------
    async def generate(
        self,
        messages: Sequence[Message] | None = None,
        *,
        prompt_ids: list[int] | None = None,
        max_new_tokens: int | None = None,
    ) -> Reply:
        """Generate the next assistant turn and append it to the conversation and the ledger.

        ``messages`` are appended first (same as ``add_messages``). ``prompt_ids`` appends
        those token ids verbatim instead of the template's delta (token mode). Raises
        ``RolloutStop`` when the turn or context limit is already reached. Parse errors are
        counted in ``metrics["parse_errors"]`` and returned; ``act`` also shows them to the
        model. The steps are the hooks ``should_stop``, ``build_prompt``, ``call_model`` and
        ``parse_actions``.
        """
        if messages:
            self.add_messages(messages)
        stop = self.should_stop()
        if stop is not None:
            raise stop
        lim = self.limits
        input_ids = self.build_prompt(prompt_ids)
        if input_ids is None:
            why = f"context full (max_tokens={lim.max_tokens})"
            refused = self.ledger.refused
            if refused is not None and refused[1]:
                why += (
                    f": the prompt would be {refused[0]} tokens, {refused[1]} of them for its "
                    "new images; raise rollout.max_tokens or lower the image processor's "
                    "max_pixels (fewer tokens per image)"
                )
            raise RolloutStop(RolloutStatus.TRUNCATED_LENGTH, why)
        n_new = min(max_new_tokens or self.sampling.max_new_tokens, lim.max_tokens - len(input_ids))
        sampling = self.sampling
        if n_new != sampling.max_new_tokens:
            sampling = dataclasses.replace(sampling, max_new_tokens=n_new)
        t0 = time.perf_counter()
        c = await self._model_completion(input_ids, sampling)
        llm_time_s = c.latency_s or time.perf_counter() - t0
        message, errors = self.parse_actions(
            self.template.completion_text(c.output_ids), c.finish_reason
        )
        self.messages.append(message)
        self._turn_of_message[len(self.messages) - 1] = len(self.turns)
        versions = c.output_versions or c.weight_version
        self.ledger.add_completion(c.output_ids, c.output_logprobs, versions, len(self.messages))
        self.turns.append(
            Turn(
                prompt_len=len(input_ids),
                completion_ids=c.output_ids,
                completion_logprobs=c.output_logprobs,
                finish_reason=c.finish_reason,
                weight_version=c.weight_version,
                llm_time_s=llm_time_s,
            )
        )
        self.metrics["parse_errors"] += len(errors)
        return Reply(message=message, errors=errors, finish_reason=c.finish_reason, completion=c)

    async def act(self, *, tools: bool = False) -> Reply:
        """One turn with its parse errors handled: the shared step of the built-in loops.

        ``generate``, then (with ``tools=True``) ``call_tools`` on the calls that parsed, then
        ``add_parse_errors`` for the ones that did not, so the model sees the results of its
        good calls first and the parser's error observation last. ``reply.ok`` is False when
        the reply had parse errors; such a reply should not go to ``env.step``.
        """
        reply = await self.generate()
        if tools and reply.tool_calls:
            await self.call_tools(reply.tool_calls)
        if reply.errors:
            self.add_parse_errors(reply.errors)
        return reply

    async def _model_completion(self, input_ids: list[int], sampling: SamplingParams) -> Completion:
        t0 = time.perf_counter()
        try:
            c = await self.call_model(input_ids, sampling)
        except InferenceError:
            raise
        except Exception as e:
            raise InferenceError(f"generate() failed: {type(e).__name__}: {e}") from e
        dt = time.perf_counter() - t0
        self.llm_time_s += dt
        if c.finish_reason == "abort":
            raise AbortedError("the server aborted the request (finish_reason='abort')")
        if len(c.output_logprobs) != len(c.output_ids):
            raise InferenceError(
                f"server returned {len(c.output_ids)} tokens but {len(c.output_logprobs)} logprobs; "
                f"request logprobs (return_logprob=True) from the backend."
            )
        return c

    # --- hooks: override in a subclass, chosen with AgentLoop.context_class ---------------
    def should_stop(self) -> RolloutStop | None:
        """Checked before each turn; override to add budgets (the default stops at max_turns)."""
        if len(self.turns) >= self.limits.max_turns:
            return RolloutStop(
                RolloutStatus.TRUNCATED_MAX_TURNS, f"reached max_turns={self.limits.max_turns}"
            )
        return None

    def build_prompt(self, prompt_ids: list[int] | None = None) -> list[int] | None:
        """Conversation -> model input ids (None: context full); override to edit or compact it."""
        return self.ledger.prompt(self.messages, raw_ids=prompt_ids, limit=self.limits.max_tokens)

    async def call_model(self, input_ids: list[int], sampling: SamplingParams) -> Completion:
        """One model request; override to route, cache or retry requests. A prompt with images
        sends them along (``ledger.prompt_images()``, in placeholder order)."""
        images = self.ledger.prompt_images()
        if images:
            return await self.generator.generate(
                input_ids, sampling, session_id=self.session_id, images=images
            )
        return await self.generator.generate(input_ids, sampling, session_id=self.session_id)

    def parse_actions(self, text: str, finish_reason: str) -> tuple[Message, list[str]]:
        """Completion text -> (assistant message, parse errors); override for another format."""
        if self.tool_parser is not None and self._tools is not None:
            return self.tool_parser.parse_to_message(text, finish_reason)
        return Message(role="assistant", content=text), []

    async def run_tools(self, tool_calls: list[ToolCall]) -> list[Message]:
        """Run tool calls, count them in metrics, return tool messages; override to run elsewhere."""
        if self._tools is None:
            raise ToolError("the model called tools but this rollout has no ToolSet (ctx.tools)")
        out = []
        injected: dict[str, Any] = {"env": self.env, "sample": self.sample}
        sandbox = getattr(self.env, "sandbox", None)
        if sandbox is not None:
            injected["sandbox"] = sandbox
        t0 = time.perf_counter()
        try:
            for tc in tool_calls:
                res = await self._tools.call(tc, **injected)
                self.metrics["tool_calls"] += 1
                self.metrics["tool_errors"] += float(res.is_error)
                out.append(self._tools.to_message(tc, res))
        finally:
            self._add_env_time(time.perf_counter() - t0)
        return out

    def observe(self, messages: list[Message], source: ObservationSource) -> list[Message]:
        """Add env/tool observations to the conversation; override to filter or truncate them."""
        self.messages.extend(messages)
        return messages

    # --- env and tools --------------------------------------------------------------------
    def _require_env(self) -> Env:
        if self.env is None:
            raise EnvError(f"sample {self.sample.uid} has no env; this AgentLoop needs one")
        return self.env

    async def reset(self, *, options: dict[str, Any] | None = None) -> list[Message]:
        """Reset the env with the sample's seed; its observation is added to the conversation.

        A sample with a ``split`` gets a task of that split (``agentrl.splits.reset_in_split``).
        """
        env = self._require_env()
        t0 = time.perf_counter()
        try:
            obs, _info = await reset_sample(env, self.sample, options=options)
        except (EnvError, SandboxError, InferenceError):
            raise
        except Exception as e:
            raise EnvError(f"{self.sample.env_id}.reset() failed: {type(e).__name__}: {e}") from e
        finally:
            self._add_env_time(time.perf_counter() - t0)
        return self.observe([Message.coerce(m) for m in obs], "reset")

    async def step(self, action: Message) -> StepOutcome:
        """Step the env with an assistant message; adds its observation and reward."""
        env = self._require_env()
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = await env.astep(action)
        except (EnvError, SandboxError, InferenceError):
            raise
        except Exception as e:
            raise EnvError(f"{self.sample.env_id}.step() failed: {type(e).__name__}: {e}") from e
        finally:
            self._add_env_time(time.perf_counter() - t0)
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise EnvError(
                f"{self.sample.env_id}.step() returned reward {reward!r}; expected a float"
            ) from None
        if not math.isfinite(reward):  # would poison the advantages of the whole batch
            raise EnvError(
                f"{self.sample.env_id}.step() returned a non-finite reward ({reward}); the "
                "trajectory is kept as error_env and masked out of the loss"
            )
        raw = [Message.coerce(m) for m in obs]
        obs = self.observe(raw, "step")
        if action.tool_calls:  # the env ran them; tool.py reports failures as "Error: ..."
            self.metrics["tool_calls"] += len(action.tool_calls)
            self.metrics["tool_errors"] += sum(
                m.role == "tool" and m.text.startswith("Error") for m in raw
            )
        self.reward += float(reward)
        self.env_truncated = self.env_truncated or bool(truncated)
        if "success" in info:
            self.metrics["success"] = float(bool(info["success"]))
        if isinstance(info.get("report"), dict):  # a grader's or checker's report
            self.report = info["report"]
        for k, v in (info.get("reward_components") or {}).items():
            self.reward_components[k] = self.reward_components.get(k, 0.0) + float(v)
        return StepOutcome(obs, float(reward), bool(terminated), bool(truncated), info)

    async def call_tools(self, tool_calls: Iterable[ToolCall]) -> list[Message]:
        """Run tool calls with ``ctx.tools`` and append their tool messages."""
        calls = list(tool_calls)
        if not calls:
            return []
        return self.observe(await self.run_tools(calls), "tools")

    def add_parse_errors(self, errors: list[str]) -> Message:
        """Append the error observation for unparseable tool calls and return it."""
        hint = self.tool_parser.format_hint if self.tool_parser is not None else ""
        msg = format_error_observation(errors, hint=hint)
        self.observe([msg], "parse_errors")
        return msg

    def _add_env_time(self, dt: float) -> None:
        self.env_time_s += dt
        if self.turns:
            self.turns[-1].env_time_s += dt

    def check_ledger(self) -> list[tuple[int, LedgerCheck]]:
        """Compare each ledger segment with a full render of its conversation (slow; debug)."""

        def raw_text(i: int) -> str:
            return self.template.completion_text(
                self.turns[self._turn_of_message[i]].completion_ids
            )

        return self.ledger.check(self.messages, raw_text)

    # --- result ---------------------------------------------------------------------------
    def final_status(self) -> RolloutStatus:
        """Status of a loop that returned normally."""
        if self.turns and self.turns[-1].finish_reason == "length":
            return RolloutStatus.TRUNCATED_LENGTH
        if self.env_truncated:
            return RolloutStatus.TRUNCATED_MAX_TURNS
        return RolloutStatus.COMPLETED

    def trajectory(
        self, status: RolloutStatus | None = None, error: str | None = None
    ) -> Trajectory:
        """The Trajectory so far (the machinery fills status, error and wall time)."""
        metrics = dict(self.metrics)
        metrics["turns"] = float(len(self.turns))
        metrics.setdefault("success", float(self.reward > 0))
        return Trajectory(
            sample=self.sample,
            messages=self.messages,
            segments=self.ledger.segments,
            turns=self.turns,
            reward=self.reward,
            reward_components=self.reward_components,
            status=status or self.final_status(),
            error=error,
            metrics=metrics,
            llm_time_s=self.llm_time_s,
            env_time_s=self.env_time_s,
            report=self.report,
        )


class AgentLoop(ABC):
    """Drives one rollout. Subclass and implement ``run``; see the module docstring."""

    context_class: ClassVar[type[RolloutContext]] = RolloutContext
    """The context the collector builds for this loop: a subclass overrides its hooks."""

    @abstractmethod
    async def run(self, sample: Sample, ctx: RolloutContext) -> Trajectory | None:
        """Play one episode through ``ctx``; return None (the context builds the Trajectory)."""


AGENTS: Registry[AgentLoop] = Registry(
    "agent loop",
    entry_point_group="agentrl.agents",
    hint="Built-in loops: single_turn, tool_calling, env_driver. For a loop registered in "
    f"your own code, {MODULES_HINT}.",
)


def register_agent(
    id: str, entry_point: Any, *, description: str = "", override: bool = False, **defaults: Any
) -> None:
    """Register an AgentLoop class (or a lazy ``"module:Class"`` string) under ``id``.

    ``defaults`` are passed to the class when a rollout makes one (one instance per rollout),
    so constructor arguments are given here: ``register_agent("critic3", CriticLoop, rounds=3)``.
    """
    AGENTS.register(id, entry_point, description=description, override=override, **defaults)


def make_agent(id: str, **kwargs: Any) -> AgentLoop:
    return AGENTS.make(id, **kwargs)
