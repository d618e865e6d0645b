"""Set-of-marks overlay (``envs/gui/marks.py``) on a plain image: frames and labels land on the
elements' boxes, scaled to screenshot pixels; elements without an id or a box get none."""

from __future__ import annotations

import io

from PIL import Image

from envs.gui.marks import FRAME, mark_colour, set_of_marks
from envs.gui.tree import Node

WHITE = (255, 255, 255)


def blank(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), WHITE).save(out, format="PNG")
    return out.getvalue()


def pixels(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def test_each_element_is_framed_in_its_colour_and_labelled_at_its_corner() -> None:
    button = Node(id=3, role="button", name="Go", box=(40.0, 30.0, 60.0, 20.0))
    text = Node(id=None, role="text", name="hello", box=(5.0, 5.0, 10.0, 10.0))
    boxless = Node(id=9, role="link", name="x")
    form = Node(id=1, role="form", box=(10.0, 10.0, 150.0, 80.0), children=[button, text])
    image = pixels(set_of_marks(blank(200, 120), [form, boxless]))
    for node in (form, button):
        assert node.box is not None
        x, y, w, h = (int(v) for v in node.box)
        colour = mark_colour(node.id or 0)
        assert image.getpixel((x + w - 1, y + h // 2)) == colour  # right edge of the frame
        assert image.getpixel((x + w // 2, y + h - 1)) == colour  # bottom edge
        assert image.getpixel((x + w // 2, y + h - 1 - FRAME)) != colour  # inside: untouched
        label = [image.getpixel((x + i, y + j)) for i in range(2, 10) for j in range(2, 12)]
        assert any(min(p) > 200 for p in label)  # the id's (antialiased) white strokes
        assert image.getpixel((x + 1, y + 1)) == colour  # the label's background
    assert mark_colour(1) != mark_colour(3)
    assert image.getpixel((8, 8)) == WHITE  # the text node (no id) got no frame or label


def test_boxes_are_scaled_to_screenshot_pixels_and_off_screen_ones_skipped() -> None:
    node = Node(id=2, role="button", box=(20.0, 10.0, 30.0, 15.0))
    off = Node(id=4, role="button", box=(500.0, 500.0, 10.0, 10.0))
    image = pixels(set_of_marks(blank(200, 100), [node, off], scale=2.0))
    colour = mark_colour(2)
    assert image.getpixel((2 * 50 - 1, 2 * 17)) == colour  # right edge at (20 + 30) * 2
    assert image.getpixel((35, 24)) == WHITE  # on the unscaled frame's bottom edge: untouched
    again = pixels(set_of_marks(blank(200, 100), [node, off], scale=2.0))
    assert image.tobytes() == again.tobytes()  # deterministic
