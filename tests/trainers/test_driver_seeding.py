"""Request seeds: every generate call of a rollout gets a seed fixed by (run, sample, member, turn)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.inference.protocol import Completion, SamplingParams
from agentrl.rollout.collector import CollectorConfig
from agentrl.tiny import make_tiny_model
from agentrl.types import Sample
from trainers.serving import SeededCollector, SeededGenerator, request_seed


class _Recorder:
    """A Generator that answers "8" and records the seed of each request."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.seeds: list[int | None] = []

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Completion:
        self.seeds.append(sampling.seed)
        ids = self.template.encode("8") + list(self.template.stop_token_ids[:1])
        return Completion(
            output_ids=ids,
            output_logprobs=[-0.1] * len(ids),
            finish_reason="stop",
            weight_version=0,
            prompt_tokens=len(input_ids),
        )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    path: Path = make_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1)
    return ChatTemplate.from_pretrained(path)


async def _seeds(template: ChatTemplate, run_seed: int) -> list[int | None]:
    rec = _Recorder(template)
    cfg = CollectorConfig(
        group_size=3, max_turns=2, max_new_tokens=4, agent="env_driver", tool_parser=None
    )
    collector = SeededCollector(cfg, SeededGenerator(rec, run_seed), template)
    samples = [Sample(env_id="games/GuessNumber-v0", seed=s, uid=f"train-{s}") for s in (1, 2)]
    groups = await collector.collect_ordered(samples)
    assert [g.uid for g in groups] == ["train-1", "train-2"]
    return rec.seeds


async def test_every_request_is_seeded_uniquely_and_reproducibly(template: ChatTemplate) -> None:
    first = await _seeds(template, run_seed=0)
    assert None not in first and len(first) == len(
        set(first)
    )  # one seed per (sample, member, turn)
    assert sorted(first) == sorted(await _seeds(template, run_seed=0))  # type: ignore[type-var]
    assert set(first).isdisjoint(await _seeds(template, run_seed=1))
    expected = {
        request_seed(0, f"train-{s}", m, t) for s in (1, 2) for m in range(3) for t in range(2)
    }
    assert set(first) <= expected
