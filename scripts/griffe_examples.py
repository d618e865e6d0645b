"""A Griffe extension for the docs site: code examples in docstrings render as code.

    docstring paragraph that parses as Python statements --indent 4--> Markdown code block
    "Signatures:" directly above "- item"                --blank line--> a Markdown list

This codebase writes short examples straight into docstrings, often without indenting them
(``sampler = DynamicSampler[T](target=32)``). Markdown would run such lines together into a
paragraph, and read ``[T](target=32)`` as a link, which ``mkdocs build --strict`` rejects;
and a list needs a blank line above it.
Only the rendering changes: source files are not touched. mkdocs.yml loads this file
(``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import ast
import itertools
import re
from typing import Any

import griffe

_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:")  # "Args:", "Returns:", "Note: ..." stay prose
_CODE = (ast.Assign, ast.AugAssign, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith,
         ast.Import, ast.ImportFrom, ast.If, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
         ast.Return, ast.Raise)  # fmt: skip


def is_code(paragraph: str) -> bool:
    """True for a paragraph of Python statements (not one name, not a section header)."""
    if paragraph.startswith((" ", "\t")) or _SECTION.match(paragraph):
        return False
    try:
        body = ast.parse(paragraph).body
    except SyntaxError:
        return False
    return any(
        isinstance(s, _CODE)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call | ast.Await))
        for s in body
    )


def indent_examples(text: str) -> str:
    """The docstring with every code paragraph after the first indented as a code block."""
    first, *rest = text.split("\n\n")
    rest = ["\n".join("    " + line for line in p.splitlines()) if is_code(p) else p for p in rest]
    return "\n\n".join([first, *rest])


def separate_lists(text: str) -> str:
    """A blank line between "...:" and the "- item" right under it, which Markdown needs."""
    lines = text.splitlines()
    out = lines[:1]
    for prev, line in itertools.pairwise(lines):
        if prev.rstrip().endswith(":") and line.startswith("- ") and not prev.startswith(" "):
            out.append("")
        out.append(line)
    return "\n".join(out)


class CodeExamples(griffe.Extension):
    """Render the code examples and lists of every docstring Griffe loads as Markdown."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = separate_lists(indent_examples(obj.docstring.value))
