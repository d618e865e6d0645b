"""Logprob parity with images in the prompt: rollouts of a tiny Qwen2-VL-style model served by
the embedded server (a real process, real HTTP on 127.0.0.1), then the torch engine's
teacher-forced logprobs of the same TrainBatch rows, in fp32 on CPU: the first PPO step's
``ppo_kl`` is 0 (up to ~1e-6), as for text (tests/trainers/test_driver.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from agentrl.algos.aggregation import Aggregation
from agentrl.algos.losses import PolicyLossConfig, ppo_clip_loss
from agentrl.batch import TrainBatch
from agentrl.chat import ChatTemplate
from agentrl.engine import EngineConfig
from agentrl.inference.client import InferenceClient
from agentrl.inference.launch import ServerProcess
from agentrl.rollout.collector import CollectorConfig, RolloutCollector
from agentrl.types import Message, RolloutStatus, Sample
from tests.vision.picture_env import png_url
from trainers.engines.torch_native import TorchEngine


@pytest.fixture(scope="module")
def server(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    log = tmp_path_factory.mktemp("logs") / "server.log"
    cfg = ServerProcess.Config(
        model=str(tiny_vlm), max_batch_size=8, num_threads=1, log_path=str(log)
    )
    with ServerProcess(cfg) as srv:
        yield srv


async def _rollouts(model: Path, url: str) -> list:  # type: ignore[type-arg]
    template = ChatTemplate.from_pretrained(model)
    cfg = CollectorConfig(
        group_size=2,
        max_concurrency=8,
        max_turns=2,
        max_new_tokens=6,
        agent="env_driver",
        tool_parser=None,
        check_ledger=True,
    )
    async with InferenceClient([url]) as client:
        collector = RolloutCollector(cfg, client, template)
        samples = [Sample(env_id="test-vision/Picture-v0", seed=i) for i in range(2)]
        return await collector.collect(samples)


async def test_served_logprobs_with_images_equal_the_engine(tiny_vlm: Path, server) -> None:  # type: ignore[no-untyped-def]
    groups = await _rollouts(tiny_vlm, server.url)
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 4
    # A random model's short replies often end on max_new_tokens (truncated_length): fine here.
    ok = {
        RolloutStatus.COMPLETED,
        RolloutStatus.TRUNCATED_MAX_TURNS,
        RolloutStatus.TRUNCATED_LENGTH,
    }
    assert {t.status for t in trajs} <= ok, [t.error for t in trajs]
    template = ChatTemplate.from_pretrained(tiny_vlm)
    assert template.vision is not None
    pad = template.vision.image_token_id
    for t in trajs:
        assert t.metrics["ledger_mismatch"] == 0.0
        (seg,) = t.segments
        assert len(t.turns) == 2 and len(seg.images) == 2  # one image per observation
        n_pad = sum(template.vision.num_tokens(u) for u in seg.images)
        assert seg.token_ids.count(pad) == n_pad > 0

    batch = TrainBatch.from_groups(groups, pad_token_id=template.tokenizer.pad_token_id)
    assert batch.has_images and all(len(r) == 2 for r in batch.images)
    engine = TorchEngine(EngineConfig(model_path=str(tiny_vlm), micro_batch_size=3))
    engine.initialize()
    logprobs, _ = engine.compute_logprobs(batch)
    mask = batch.loss_mask.bool()
    diff = (logprobs - batch.rollout_logprobs)[mask].abs()
    assert diff.numel() == sum(len(turn.completion_ids) for t in trajs for turn in t.turns)
    assert diff.max().item() <= 1e-5, diff.max().item()

    # The first PPO step is on-policy: ppo_kl = 0 with old = rollout logprobs, and the
    # gradient reaches the vision tower (the images are part of the forward, not decoration).
    batch["old_logprobs"] = batch.rollout_logprobs
    batch["advantages"] = torch.where(mask, 1.0, 0.0)
    agg = Aggregation()  # token-mean

    def loss_fn(logprobs, entropy, values, mb):  # type: ignore[no-untyped-def]
        b = mb.batch
        loss, m = ppo_clip_loss(
            logprobs, b["old_logprobs"], b["advantages"], b.loss_mask, PolicyLossConfig(), agg=agg
        )
        return loss, {k: float(v) for k, v in m.items()}

    metrics = engine.forward_backward(batch, loss_fn)
    assert abs(metrics["ppo_kl"]) <= 1e-6, metrics
    visual = [p.grad for n, p in engine.scorer.named_parameters() if ".visual." in n]
    assert visual and any(g is not None and g.abs().sum() > 0 for g in visual)


async def test_chat_completions_take_image_parts_like_generate(tiny_vlm: Path, server) -> None:  # type: ignore[no-untyped-def]
    """/v1/chat/completions with an image part: the prompt is the ledger's (placeholder
    expanded), and greedy decoding gives the tokens /generate gives for those ids and image."""
    url = png_url(64, 48, seed=7)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on the page? "},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
    template = ChatTemplate.from_pretrained(tiny_vlm)
    assert template.vision is not None
    rendered = template.render_text(
        [Message.coerce(m) for m in messages], None, add_generation_prompt=True
    )
    want = template.vision.expand(template.encode(rendered), [url])
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        chat = await http.post(
            "/v1/chat/completions",
            json={
                "messages": messages,
                "max_tokens": 5,
                "temperature": 0,
                "return_token_ids": True,
            },
        )
        assert chat.status_code == 200, chat.text
        choice = chat.json()["choices"][0]
        assert choice["prompt_token_ids"] == want
        assert want.count(template.vision.image_token_id) == template.vision.num_tokens(url) > 1
        gen = await http.post(
            "/generate",
            json={
                "input_ids": want,
                "image_data": [url],
                "sampling_params": {"max_new_tokens": 5, "temperature": 0},
            },
        )
        assert gen.status_code == 200, gen.text
        assert gen.json()["output_ids"] == choice["token_ids"]

        # The image changes what the model sees: another picture, another prompt's pixels.
        other_part = {"type": "image_url", "image_url": {"url": png_url(64, 48, seed=8)}}
        other = [{"role": "user", "content": [messages[0]["content"][0], other_part]}]
        logps = []
        for msgs in (messages, other):
            r = await http.post(
                "/v1/chat/completions",
                json={"messages": msgs, "max_tokens": 1, "temperature": 0, "logprobs": True},
            )
            logps.append(r.json()["choices"][0]["logprobs"]["content"][0]["logprob"])
        assert logps[0] != logps[1]

        remote = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
        bad = await http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": [remote]}]}
        )
        assert bad.status_code == 400 and "data:image/png;base64" in bad.text, bad.text
        # Two images for one placeholder run: the counts disagree, a 400 that says so.
        two = await http.post("/generate", json={"input_ids": want, "image_data": [url, url]})
        assert two.status_code == 400 and "image_pad" in two.text, two.text


@pytest.fixture(scope="module")
def pad_loving_vlm(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny VLM with its (tied) output rows of the image-only tokens turned towards the
    model's own hidden states: unsuppressed, it would reply with ``<|image_pad|>`` and co."""
    from transformers import AutoModelForImageTextToText

    template = ChatTemplate.from_pretrained(tiny_vlm)
    assert template.vision is not None
    special = list(template.vision.special_ids)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32)
    ids = torch.tensor([template.encode("user: hello there, what do you see")])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0]  # (T, H), after the final norm
        direction = hidden.mean(0) / hidden.mean(0).norm()
        scale = 40.0 / (hidden @ direction).clamp(min=1e-3).mean()
        model.get_output_embeddings().weight[special] = scale * direction
        probs = torch.softmax(model(input_ids=ids).logits[0, -1], -1)
    assert probs[special].sum() > 0.5  # the test below would fail without the suppression
    out = tmp_path_factory.mktemp("vision") / "pad-loving"
    model.save_pretrained(out)
    template.tokenizer.save_pretrained(out)
    template.vision.processor.save_pretrained(out)
    return out


async def test_image_only_tokens_are_never_sampled_and_parity_holds(
    pad_loving_vlm: Path, tmp_path: Path
) -> None:
    """A model that prefers image-only tokens still never replies with one (a generated
    ``<|image_pad|>`` would pose as an image placeholder in the next prompt and the training
    row), and the trainer gives them probability 0 too: served logprobs equal the engine's."""
    cfg = ServerProcess.Config(
        model=str(pad_loving_vlm), max_batch_size=8, num_threads=1, log_path=str(tmp_path / "s.log")
    )
    with ServerProcess(cfg) as srv:
        groups = await _rollouts(pad_loving_vlm, srv.url)
    template = ChatTemplate.from_pretrained(pad_loving_vlm)
    assert template.vision is not None
    special = set(template.vision.special_ids)
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.status != RolloutStatus.ERROR_ENV for t in trajs), [t.error for t in trajs]
    generated = [tok for t in trajs for turn in t.turns for tok in turn.completion_ids]
    assert generated and not special & set(generated)

    batch = TrainBatch.from_groups(groups, pad_token_id=template.tokenizer.pad_token_id)
    engine = TorchEngine(EngineConfig(model_path=str(pad_loving_vlm), micro_batch_size=4))
    engine.initialize()
    logprobs, _ = engine.compute_logprobs(batch)
    mask = batch.loss_mask.bool()
    assert (logprobs - batch.rollout_logprobs)[mask].abs().max().item() <= 1e-5
