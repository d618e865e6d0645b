"""PNG data URLs and an env whose observations hold images (``test-vision/Picture-v0``),
importable by Ray workers and ``data.imports`` as ``tests.vision.picture_env``."""

from __future__ import annotations

import base64
import io
from typing import Any

from agentrl.env import Env, register_env
from agentrl.types import Message


def png_url(width: int, height: int, seed: int = 0) -> str:
    """A deterministic noisy PNG as a data URL (noise: every pixel matters to the model)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def picture(text: str, url: str) -> Message:
    return Message(
        role="user",
        content=[{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
    )


class PictureEnv(Env):
    """Each observation is a text part and a screenshot-like image; ``turns`` replies, reward 0."""

    def __init__(self, turns: int = 2, width: int = 80, height: int = 60) -> None:
        self.turns, self.width, self.height = turns, width, height

    async def areset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.seed, self.left = seed or 0, self.turns
        return [picture("What is on the page? ", png_url(self.width, self.height, self.seed))], {}

    async def astep(self, action: Message) -> Any:
        self.left -= 1
        done = self.left <= 0
        url = png_url(self.height, self.width, self.seed + 100 + self.left)  # rotated page
        return ([] if done else [picture("And now? ", url)]), 0.0, done, False, {}


register_env("test-vision/Picture-v0", PictureEnv)
