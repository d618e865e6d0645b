"""Single-turn procedural reasoning tasks from reasoning-gym, scored by its own verifiers.

    env = make_env("reasoning/ChainSum-v0")            # or "reasoning/Task-v0", task="leg_counting"
    obs, info = env.reset(seed=3)                      # [user("4 - 1 - 7 = ? End with 'Answer: <value>'.")]
    obs, reward, terminated, truncated, info = env.step(assistant("Answer: -4"))   # reward 1.0

reset(seed) picks one question of a fixed offline dataset (``reasoning_gym.create_dataset(task,
size=size, seed=dataset_seed, **task_config)``) with ``self.np_random``; step extracts the
final answer with ``agentrl.reward.extract_answer`` (``<answer>...</answer>`` or
``Answer: ...``) and scores it with the dataset's ``score_answer`` (1.0 for a correct answer,
reasoning-gym's partial credit otherwise). A missing answer scores 0. Either way the episode
ends after one step. No network is used.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError
from agentrl.reward import extract_answer
from agentrl.types import Message

INSTRUCTION = "End with 'Answer: <value>'."


@lru_cache(maxsize=32)
def _dataset(task: str, size: int, seed: int, config_items: tuple[tuple[str, Any], ...]) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **dict(config_items))
    except Exception as e:  # unknown task names and bad config keys both land here
        raise ConfigError(
            f"reasoning-gym could not build task {task!r} with config {dict(config_items)}: {e}"
        ) from e


def _freeze(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in config.items()))


class ReasoningTaskEnv(Env):
    """One reasoning-gym question per episode; one answer ends it.

    Args:
        task: a reasoning-gym dataset name (``basic_arithmetic``, ``chain_sum``, ``leg_counting``, ...).
        task_config: keyword arguments for that dataset's config (difficulty knobs).
        size: how many questions the dataset holds.
        dataset_seed: seeds the dataset's generator (fixed, so ids mean the same questions).
        strip_prefix: a question prefix to drop, keeping prompts short.
    """

    def __init__(
        self,
        task: str = "chain_sum",
        *,
        task_config: dict[str, Any] | None = None,
        size: int = 1000,
        dataset_seed: int = 0,
        strip_prefix: str = "",
    ) -> None:
        if size < 1:
            raise ConfigError(f"ReasoningTaskEnv.size must be >= 1, got {size}")
        self.task = task
        self.dataset = _dataset(task, size, dataset_seed, _freeze(task_config or {}))
        self.strip_prefix = strip_prefix
        self.entry: dict[str, Any] | None = None

    def _question(self, entry: dict[str, Any]) -> str:
        q = str(entry["question"]).strip()
        if self.strip_prefix and q.startswith(self.strip_prefix):
            q = q[len(self.strip_prefix) :].strip()
        return f"{q}\n{INSTRUCTION}"

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        await super().areset(seed=seed)
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self.dataset)))
        self.entry = self.dataset[int(index)]
        return [Message(role="user", content=self._question(self.entry))], {
            "task": self.task,
            "index": int(index),
        }

    async def astep(self, action: Message) -> StepResult:
        if self.entry is None:
            raise ConfigError("ReasoningTaskEnv.step() called before reset()")
        answer = extract_answer(action.text)
        reward = 0.0 if answer is None else float(self.dataset.score_answer(answer, self.entry))
        info = {"answer": str(self.entry["answer"]), "extracted": answer}
        return [], reward, True, False, info

    def demonstration(self) -> list[Message] | None:
        if self.entry is None:
            return None
        return [Message(role="assistant", content=f"Answer: {self.entry['answer']}")]
