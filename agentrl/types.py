"""The data that flows through agentrl, from a dataset row to a finished trajectory.

Sample -> AgentLoop.run -> Trajectory (messages + token ledger + rewards + status)
       -> TrajectoryGroup (the GRPO group, the unit the trainer consumes)

Messages are OpenAI-format chat messages. The token ledger (``Segment``) is the training
contract: token ids exactly as the server produced them, a loss mask that is 1 only on
generated tokens, the server's per-token logprobs and the weight version of every token.
Only ``agentrl/batch.py`` turns these lists into tensors.

Everything here round-trips through plain JSON (``to_dict`` / ``from_dict``), which is how
trajectories are saved to JSONL or parquet and loaded back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from agentrl.splits import DEFAULT_EVAL_FRACTION

JSON = dict[str, Any]
Role = Literal["system", "user", "assistant", "tool"]


class RolloutStatus(StrEnum):
    """How a rollout ended. Failures are values: every status is kept for metrics."""

    COMPLETED = "completed"
    TRUNCATED_MAX_TURNS = "truncated_max_turns"
    TRUNCATED_LENGTH = "truncated_length"
    TRUNCATED_TIME = "truncated_time"  # a loop's wall-time budget ran out
    ERROR_TOOL = "error_tool"
    ERROR_ENV = "error_env"
    ERROR_SANDBOX = "error_sandbox"  # kept for metrics, masked out of the loss
    ERROR_INFERENCE = "error_inference"  # kept for metrics, masked out of the loss
    ERROR_REWARD = "error_reward"  # kept for metrics, masked out of the loss
    ABORTED = "aborted"

    @property
    def is_infra_failure(self) -> bool:
        """True for failures of the machinery rather than of the agent; masked out of the loss."""
        return self in _INFRA_FAILURES

    @property
    def is_truncated(self) -> bool:
        return self in (
            RolloutStatus.TRUNCATED_LENGTH,
            RolloutStatus.TRUNCATED_MAX_TURNS,
            RolloutStatus.TRUNCATED_TIME,
        )


_INFRA_FAILURES = frozenset(
    {
        RolloutStatus.ERROR_ENV,  # a crash or a non-finite reward in env (or loop) code
        RolloutStatus.ERROR_SANDBOX,
        RolloutStatus.ERROR_INFERENCE,
        RolloutStatus.ERROR_REWARD,
        RolloutStatus.ABORTED,
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """A tool call parsed from an assistant message."""

    name: str
    arguments: JSON
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")

    def to_openai(self) -> JSON:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, d: JSON) -> ToolCall:
        fn = d.get("function", d)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            import json

            args = json.loads(args) if args.strip() else {}
        return cls(
            name=fn["name"], arguments=args, id=d.get("id") or f"call_{uuid.uuid4().hex[:12]}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """One OpenAI-format chat message.

    ``content`` is text, or a list of OpenAI content parts (``{"type": "text", ...}``,
    ``{"type": "image_url", ...}``) for multimodal observations.
    """

    role: Role
    content: str | list[JSON] = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    @property
    def text(self) -> str:
        """The text of the message, with non-text content parts dropped."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")

    def to_openai(self) -> JSON:
        d: JSON = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        if self.reasoning_content is not None:
            d["reasoning_content"] = self.reasoning_content
        return d

    @classmethod
    def from_openai(cls, d: JSON) -> Message:
        content = d.get("content")
        return cls(
            role=d["role"],
            content="" if content is None else content,
            tool_calls=tuple(ToolCall.from_openai(tc) for tc in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            reasoning_content=d.get("reasoning_content"),
        )

    @classmethod
    def coerce(cls, m: Message | JSON) -> Message:
        return m if isinstance(m, Message) else cls.from_openai(m)


def system(text: str) -> Message:
    return Message(role="system", content=text)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message(role="assistant", content=text, tool_calls=tool_calls)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One dataset row: which env (and optionally which AgentLoop) and with what arguments.

    ``env_id`` names a registered env; ``env_kwargs`` are passed to its constructor and
    ``seed`` to ``reset``. ``agent`` names a registered AgentLoop (None: the recipe's default).
    ``uid`` identifies the prompt: all members of one GRPO group share it.
    ``split`` ("train" or "eval") makes the reset draw a task of that content split, with
    ``eval_fraction`` of all tasks in "eval" (``agentrl.splits``); None resets with the seed
    as it is.
    """

    env_id: str
    env_kwargs: JSON = field(default_factory=dict)
    seed: int | None = None
    agent: str | None = None
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    extra: JSON = field(default_factory=dict)
    split: str | None = None
    eval_fraction: float = DEFAULT_EVAL_FRACTION

    def to_dict(self) -> JSON:
        return {
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "seed": self.seed,
            "agent": self.agent,
            "uid": self.uid,
            "extra": self.extra,
            "split": self.split,
            "eval_fraction": self.eval_fraction,
        }

    @classmethod
    def from_dict(cls, d: JSON) -> Sample:
        return cls(
            env_id=d["env_id"],
            env_kwargs=dict(d.get("env_kwargs") or {}),
            seed=d.get("seed"),
            agent=d.get("agent"),
            uid=d.get("uid") or uuid.uuid4().hex,
            extra=dict(d.get("extra") or {}),
            split=d.get("split"),
            eval_fraction=float(d.get("eval_fraction", DEFAULT_EVAL_FRACTION)),
        )


@dataclass(kw_only=True, slots=True)
class Segment:
    """One training sequence of a rollout: the token ledger.

    All lists have the same length T. ``loss_mask[t]`` is 1 exactly on tokens the model
    generated; ``logprobs[t]`` is the server's logprob for generated tokens and 0.0 elsewhere;
    ``versions[t]`` is the weight version that produced a generated token and -1 elsewhere.
    A rollout normally has one segment; templates that are not prefix-preserving, sub-agents
    and context compaction produce several.

    ``images`` are the data URLs of the images whose placeholder tokens are in ``token_ids``,
    in the order of their placeholders (a vision-language model's prompt; see
    ``agentrl.vision``); empty for text.
    """

    token_ids: list[int] = field(default_factory=list)  # [T]
    loss_mask: list[int] = field(default_factory=list)  # [T]
    logprobs: list[float] = field(default_factory=list)  # [T]
    versions: list[int] = field(default_factory=list)  # [T]
    images: list[str] = field(default_factory=list)  # [I] data URLs, placeholder order

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first generated token (the initial prompt)."""
        for i, m in enumerate(self.loss_mask):
            if m:
                return i
        return len(self.loss_mask)

    def extend_prompt(self, ids: list[int]) -> None:
        """Append tokens the model did not generate (prompt, env/tool messages, template)."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def extend_generated(
        self, ids: list[int], logprobs: list[float], version: int | list[int]
    ) -> None:
        """Append tokens the model generated, exactly as the server returned them."""
        if len(ids) != len(logprobs):
            raise ValueError(f"got {len(ids)} generated ids but {len(logprobs)} logprobs")
        vs = [version] * len(ids) if isinstance(version, int) else list(version)
        if len(vs) != len(ids):
            raise ValueError(f"got {len(ids)} generated ids but {len(vs)} versions")
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.versions.extend(vs)

    def validate(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"segment {name} has {len(getattr(self, name))} entries, expected {n}"
                )

    def to_dict(self) -> JSON:
        d: JSON = {
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "versions": self.versions,
        }
        if self.images:
            d["images"] = self.images
        return d

    @classmethod
    def from_dict(cls, d: JSON) -> Segment:
        return cls(
            token_ids=list(d["token_ids"]),
            loss_mask=list(d["loss_mask"]),
            logprobs=[float(x) for x in d["logprobs"]],
            versions=list(d["versions"]),
            images=list(d.get("images") or ()),
        )


@dataclass(kw_only=True, slots=True)
class Turn:
    """One assistant completion in token space, with how it ended and how long it took."""

    prompt_len: int  # tokens sent to the server for this turn
    completion_ids: list[int]  # [C]
    completion_logprobs: list[float]  # [C], from the server; never recomputed from text
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int
    llm_time_s: float = 0.0
    env_time_s: float = 0.0

    def to_dict(self) -> JSON:
        return {
            "prompt_len": self.prompt_len,
            "completion_ids": self.completion_ids,
            "completion_logprobs": self.completion_logprobs,
            "finish_reason": self.finish_reason,
            "weight_version": self.weight_version,
            "llm_time_s": self.llm_time_s,
            "env_time_s": self.env_time_s,
        }

    @classmethod
    def from_dict(cls, d: JSON) -> Turn:
        return cls(**d)


@dataclass(kw_only=True, slots=True)
class Trajectory:
    """A finished rollout: the conversation, the token ledger, rewards, status and timings."""

    sample: Sample
    messages: list[Message] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    status: RolloutStatus = RolloutStatus.COMPLETED
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    llm_time_s: float = 0.0
    env_time_s: float = 0.0
    wall_time_s: float = 0.0
    agent: str | None = None
    """The registered name of the AgentLoop that ran it (set by the collector)."""
    report: JSON = field(default_factory=dict)
    """What the env's grader or checker reported (``info["report"]`` of its last step), e.g.
    a SWE task's per-test outcomes; kept for inspection, never trained on."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_generated_tokens(self) -> int:
        return sum(s.num_generated for s in self.segments)

    @property
    def trainable(self) -> bool:
        """Whether this trajectory may contribute to the loss."""
        return not self.status.is_infra_failure and any(s.num_generated for s in self.segments)

    def to_dict(self) -> JSON:
        return {
            "id": self.id,
            "sample": self.sample.to_dict(),
            "messages": [m.to_openai() for m in self.messages],
            "segments": [s.to_dict() for s in self.segments],
            "turns": [t.to_dict() for t in self.turns],
            "reward": self.reward,
            "reward_components": self.reward_components,
            "status": self.status.value,
            "error": self.error,
            "metrics": self.metrics,
            "llm_time_s": self.llm_time_s,
            "env_time_s": self.env_time_s,
            "wall_time_s": self.wall_time_s,
            "agent": self.agent,
            "report": self.report,
        }

    @classmethod
    def from_dict(cls, d: JSON) -> Trajectory:
        return cls(
            id=d["id"],
            sample=Sample.from_dict(d["sample"]),
            messages=[Message.from_openai(m) for m in d["messages"]],
            segments=[Segment.from_dict(s) for s in d["segments"]],
            turns=[Turn.from_dict(t) for t in d["turns"]],
            reward=float(d["reward"]),
            reward_components={k: float(v) for k, v in (d.get("reward_components") or {}).items()},
            status=RolloutStatus(d["status"]),
            error=d.get("error"),
            metrics={k: float(v) for k, v in (d.get("metrics") or {}).items()},
            llm_time_s=float(d.get("llm_time_s", 0.0)),
            env_time_s=float(d.get("env_time_s", 0.0)),
            wall_time_s=float(d.get("wall_time_s", 0.0)),
            agent=d.get("agent"),
            report=dict(d.get("report") or {}),
        )


@dataclass(kw_only=True, slots=True)
class TrajectoryGroup:
    """The rollouts of one prompt (a GRPO group). The unit that streams to the trainer."""

    uid: str
    trajectories: list[Trajectory]

    @property
    def rewards_G(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def trainable(self) -> bool:
        """A group with any infrastructure failure is masked as a whole (its baseline is wrong)."""
        return all(t.trainable for t in self.trajectories)

    def to_dict(self) -> JSON:
        return {"uid": self.uid, "trajectories": [t.to_dict() for t in self.trajectories]}

    @classmethod
    def from_dict(cls, d: JSON) -> TrajectoryGroup:
        return cls(uid=d["uid"], trajectories=[Trajectory.from_dict(t) for t in d["trajectories"]])
