"""Images in the token path: from a message's image part to the pixels the model sees.

    user message part {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
      --chat template--> <|vision_start|><|image_pad|><|vision_end|>        (one placeholder)
      --Vision.expand--> <|vision_start|> <|image_pad|> x N <|vision_end|>   (N from the size)
      --ledger--> Segment.token_ids (expanded) + Segment.images (the URLs, in placeholder order)
      --/generate {"input_ids", "image_data"} or TrainBatch rows--> Vision.pixels(urls)
      --> ImageInputs: pixel_values (P, D) + image_grid_thw (I, 3) --> the model's forward

The images travel as their data URLs, never as tensors: the rollout needs only each image's
size (to know N), and the server and the trainer each turn the same URLs into pixels with the
same processor (``Vision.pixels``), so both forwards see the same floats (logprob parity).

One family is supported: Qwen2-VL's (``model_type`` ``qwen2_vl``), whose images are
flattened patch rows concatenated over all images (no padding between rows of a batch), with
a (t, h, w) grid per image and multimodal rotary positions (``mrope_positions``). Its image
processor is transformers' PIL one (``Qwen2VLImageProcessorPil``: no torchvision needed).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import TokenizationError
from agentrl.types import JSON, Message

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
"""What a chat template renders for one image part (before ``Vision.expand``)."""
VISION_MODEL_TYPES = ("qwen2_vl",)


def vision_model_type(path: str | Path) -> str | None:
    """The ``model_type`` of the vision-language model in HF directory ``path``; None for a
    text model (or a directory without ``config.json``)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    kind = json.loads(config.read_text()).get("model_type")
    return kind if kind in VISION_MODEL_TYPES else None


def is_image_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") in ("image_url", "image")


def image_urls(messages: Sequence[Message | JSON]) -> list[str]:
    """The image parts' URLs of ``messages``, in conversation order."""
    out: list[str] = []
    for m in messages:
        content = m.content if isinstance(m, Message) else m.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if is_image_part(part):
                out.append(_part_url(part))
    return out


def has_images(messages: Sequence[Message | JSON]) -> bool:
    for m in messages:
        content = m.content if isinstance(m, Message) else m.get("content")
        if isinstance(content, list) and any(is_image_part(p) for p in content):
            return True
    return False


def _part_url(part: JSON) -> str:
    if part.get("type") == "image":  # {"type": "image", "image": "data:..."} (HF style)
        url = part.get("image")
    else:
        url = (part.get("image_url") or {}).get("url")
    if not isinstance(url, str):
        raise TokenizationError(
            f"an image part must carry its image as a data URL string "
            f'({{"type": "image_url", "image_url": {{"url": "data:image/png;base64,..."}}}}); '
            f"got {json.dumps(part)[:120]}"
        )
    return url


def decode_image(url: str) -> Any:
    """A PIL image from a ``data:image/...;base64,`` URL (or bare base64, as SGLang takes).

    Remote URLs and file paths are refused: nothing here reaches the network or the disk."""
    from PIL import Image, UnidentifiedImageError

    payload = url
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
            raise TokenizationError(
                f"malformed image data URL {url[:40]!r}...: expected "
                "'data:image/<png|jpeg|...>;base64,<base64 bytes>'"
            )
    elif url.startswith(("http://", "https://", "file:", "/")):
        raise TokenizationError(
            f"image {url[:60]!r} is a remote URL or a path; send the image inline as a "
            "'data:image/png;base64,...' URL (nothing here fetches images)"
        )
    try:
        raw = base64.b64decode(payload, validate=True)
        image = Image.open(io.BytesIO(raw))
    except (binascii.Error, ValueError, UnidentifiedImageError) as e:
        raise TokenizationError(
            f"image {url[:40]!r}... is not a base64-encoded image ({type(e).__name__}: {e}); "
            "expected 'data:image/png;base64,<base64 of a PNG or JPEG file>'"
        ) from None
    return image


@dataclass(frozen=True, slots=True)
class ImageInputs:
    """The pixels of some images, in order, as the model's forward takes them."""

    pixel_values: torch.Tensor  # (P, D) patch rows of every image, concatenated
    image_grid_thw: torch.Tensor  # (I, 3) long: each image's (t, h, w) patch grid

    def to(self, device: torch.device | str) -> ImageInputs:
        return ImageInputs(self.pixel_values.to(device), self.image_grid_thw.to(device))


class Vision:
    """A vision-language model's image side: placeholder tokens and the image processor.

    Built from an HF model directory (``Vision.from_pretrained``; None for a text model).
    ``num_tokens`` reads only an image's size; ``pixels`` runs the processor.
    """

    def __init__(self, tokenizer: Any, processor: Any, *, model_type: str) -> None:
        if model_type not in VISION_MODEL_TYPES:
            raise TokenizationError(
                f"no image support for model_type {model_type!r}; supported: {VISION_MODEL_TYPES}"
            )
        ids = [tokenizer.convert_tokens_to_ids(t) for t in (VISION_START, IMAGE_PAD, VISION_END)]
        unk = getattr(tokenizer, "unk_token_id", None)
        if any(not isinstance(i, int) or i == unk for i in ids):
            raise TokenizationError(
                f"the tokenizer lacks the image tokens {VISION_START} {IMAGE_PAD} {VISION_END}; "
                "build the model with agentrl.tiny.make_tiny_model(arch='qwen2_vl')"
            )
        self.start_id, self.image_token_id, self.end_id = ids
        video = tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        extra = [video] if isinstance(video, int) and video != unk else []
        self.special_ids: tuple[int, ...] = (*ids, *extra)
        """Tokens that only stand for images: a model never samples them (server and trainer
        both give them probability 0), since a generated ``<|image_pad|>`` would read as an
        image placeholder in the next prompt and in the training row."""
        self.processor = processor
        self.model_type = model_type
        self.merge_size = int(processor.merge_size)
        self._factor = int(processor.patch_size) * self.merge_size
        self._min_pixels = int(processor.size["shortest_edge"])
        self._max_pixels = int(processor.size["longest_edge"])
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._pixels: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._pixel_bytes = 0
        self.cache_bytes = 256 << 20
        """Most bytes of processed pixels kept for images seen again (``pixels``)."""

    @classmethod
    def from_pretrained(cls, path: str | Path, tokenizer: Any) -> Vision | None:
        """The model's image side, or None when ``path`` holds a text-only model."""
        model_type = vision_model_type(path)
        if model_type is None:
            return None
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        return cls(
            tokenizer, Qwen2VLImageProcessorPil.from_pretrained(str(path)), model_type=model_type
        )

    # --- tokens ---------------------------------------------------------------------------
    def num_tokens(self, url: str) -> int:
        """How many ``<|image_pad|>`` tokens this image becomes (from its size only)."""
        n = self._sizes.get(url)
        if n is not None:
            self._sizes.move_to_end(url)
            return n
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        width, height = decode_image(url).size
        h, w = smart_resize(
            height,
            width,
            factor=self._factor,
            min_pixels=self._min_pixels,
            max_pixels=self._max_pixels,
        )
        n = (h // self._factor) * (w // self._factor)
        self._sizes[url] = n
        if len(self._sizes) > 1024:
            self._sizes.popitem(last=False)
        return n

    def expand(self, ids: list[int], urls: Sequence[str]) -> list[int]:
        """Replace the k-th lone ``<|image_pad|>`` of ``ids`` by ``num_tokens(urls[k])`` copies."""
        pad = self.image_token_id
        found = ids.count(pad)
        if found != len(urls):
            raise TokenizationError(
                f"the chat template rendered {found} image placeholder(s) ({IMAGE_PAD}) for "
                f"{len(urls)} image part(s); expected one {IMAGE_PLACEHOLDER} per image part "
                "(the template must render image parts, e.g. agentrl.tiny's vision template)"
            )
        if not urls:
            return ids
        out: list[int] = []
        images = iter(urls)
        for tok in ids:
            if tok == pad:
                out.extend([pad] * self.num_tokens(next(images)))
            else:
                out.append(tok)
        return out

    # --- pixels ---------------------------------------------------------------------------
    def pixels(self, urls: Sequence[str]) -> ImageInputs:
        """The processor's pixels for ``urls``, in order (the same floats everywhere).

        Each image is processed on its own (the processor treats images independently) and
        kept in an LRU cache of ``cache_bytes``: every turn of a conversation sends its
        earlier images again, and the trainer scores the same rows several times."""
        import torch

        parts = [self._image_pixels(u) for u in urls]
        return ImageInputs(
            torch.cat([p for p, _ in parts]), torch.cat([g for _, g in parts]).long()
        )

    def _image_pixels(self, url: str) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self._pixels.get(url)
        if hit is not None:
            self._pixels.move_to_end(url)
            return hit
        out = self.processor(images=[decode_image(url).convert("RGB")], return_tensors="pt")
        entry = (out["pixel_values"], out["image_grid_thw"])
        self._pixels[url] = entry
        self._pixel_bytes += entry[0].numel() * entry[0].element_size()
        while self._pixel_bytes > self.cache_bytes and len(self._pixels) > 1:
            _, (old, _) = self._pixels.popitem(last=False)
            self._pixel_bytes -= old.numel() * old.element_size()
        return entry

    def check_tokens(self, ids: Sequence[int], inputs: ImageInputs) -> None:
        """The placeholders in ``ids`` must be exactly what the images' grids need."""
        want = int((inputs.image_grid_thw.prod(-1) // self.merge_size**2).sum())
        got = sum(1 for t in ids if t == self.image_token_id)
        if got != want:
            raise TokenizationError(
                f"the prompt holds {got} {IMAGE_PAD} token(s) but its "
                f"{len(inputs.image_grid_thw)} image(s) need {want} "
                f"(grids {inputs.image_grid_thw.tolist()}); expand each image's placeholder "
                "with the model's processor (agentrl.vision.Vision.expand)"
            )


def mrope_positions(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    inputs: ImageInputs | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL's rotary positions: (3, B, T) ids and the (B,) offset of the next text token.

    Text tokens count up by one on all three axes; an image's tokens take (t, h, w) grid
    positions and the text after it resumes at the image's largest position + 1, so a row's
    next position is ``its real length + delta``. Padding (``attention_mask`` 0) gets 0.
    """
    base = (
        model.model if hasattr(model, "model") and hasattr(model.model, "get_rope_index") else model
    )
    image_token_id = int(model.config.image_token_id)
    mm = (input_ids == image_token_id).int()
    grid = inputs.image_grid_thw if inputs is not None else None
    pos, delta = base.get_rope_index(input_ids, mm, grid, None, attention_mask)
    return pos, delta.reshape(-1)
