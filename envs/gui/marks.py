"""Set-of-marks: the screenshot with every element of the tree framed and labelled by its id.

    png = set_of_marks(view.png, view.nodes, scale=device_scale)

A vision model then names an element by the number drawn on it (``click(7)``), the same id the
element tree shows, instead of guessing pixel coordinates. Each element with an id and a box
gets a 2-pixel frame in a colour picked by its id and, at its top-left corner, its id in white
on that colour. Boxes are in CSS pixels; ``scale`` (the device scale factor) maps them to the
screenshot's pixels. Deterministic: the same screenshot and tree give the same bytes.
"""

from __future__ import annotations

import io

from PIL import Image, ImageDraw, ImageFont

from envs.gui.tree import Node, walk

# Distinct, saturated colours that white text reads on; the id picks one.
PALETTE = (
    (230, 25, 75),
    (60, 140, 60),
    (0, 92, 200),
    (245, 110, 0),
    (145, 30, 180),
    (0, 128, 128),
    (170, 110, 40),
    (128, 0, 0),
)
FRAME = 2  # pixels
LABEL_PX = 12  # the ids' font size at device scale 1


def mark_colour(element_id: int) -> tuple[int, int, int]:
    return PALETTE[element_id % len(PALETTE)]


def set_of_marks(png: bytes, nodes: list[Node], *, scale: float = 1.0) -> bytes:
    """``png`` with a frame and an id label on every node that has an id and a box."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(10, round(LABEL_PX * scale)))
    width, height = image.size
    for node in walk(nodes):
        if node.id is None or node.box is None:
            continue
        x, y, w, h = (round(v * scale) for v in node.box)
        if w <= 0 or h <= 0 or x >= width or y >= height or x + w <= 0 or y + h <= 0:
            continue  # off screen
        colour = mark_colour(node.id)
        draw.rectangle((x, y, x + w - 1, y + h - 1), outline=colour, width=FRAME)
        label = str(node.id)
        left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
        lx, ly = max(0, x), max(0, y)
        draw.rectangle((lx, ly, lx + right - left + 3, ly + bottom - top + 3), fill=colour)
        draw.text((lx + 2 - left, ly + 2 - top), label, fill=(255, 255, 255), font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
