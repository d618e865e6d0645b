"""Bug injection by syntax-tree mutation: each mutant is one small, exact edit of the source.

    for m in mutants(source, "pkg/mod.py"):
        m.family, m.function, m.line, m.source       # "compare_swap", "Stack.pop", 12, "..."

Families (``FAMILIES``): ``op_swap`` (``+``/``-``, ``*``/``//``, ``&``/``|``, ... in binary
and augmented operators), ``compare_swap`` (``<``/``<=``, ``==``/``!=``, ``in``/``not in``,
``is``/``is not``), ``bool_swap`` (``and``/``or``), ``off_by_one`` (an integer constant or a
slice bound plus or minus one), ``negate_condition`` (the test of an ``if``, ``while``,
``assert``-free conditional expression wrapped in ``not (...)``), ``drop_statement`` (an
assignment, call or ``raise`` removed), ``drop_return`` (a ``return`` removed) and
``swap_args`` (a call's first two positional arguments swapped).

Why Python's ``ast`` and not libcst: the tree is only used to *find* what to change; the
change itself is spliced into the original text at the node's exact position (``lineno``,
``col_offset``, ``end_col_offset``; UTF-8 byte offsets, handled as such). Formatting and
comments outside the edit survive, so the fix is a one-hunk diff, as with libcst, but there
is no extra dependency and parsing is several times faster (it runs over every function of
every repo). Operator tokens have no position in ``ast``, so an operator swap rewrites the
text *between* the two operands, and only when that text is the operator alone (with
whitespace or parentheses): a comment or line continuation there is skipped, never guessed.
Every mutant is parsed again; one that does not parse or leaves the source unchanged is
dropped. Only code inside a function is mutated, and each mutant names its innermost
function (``Class.method``) and that function's first line (its first decorator's line,
which is ``co_firstlineno``: what the coverage map records).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

FAMILIES = (
    "op_swap",
    "compare_swap",
    "bool_swap",
    "off_by_one",
    "negate_condition",
    "drop_statement",
    "drop_return",
    "swap_args",
)

_BINOPS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Div: ("/", "*"),
    ast.Mod: ("%", "//"),
    ast.LShift: ("<<", ">>"),
    ast.RShift: (">>", "<<"),
    ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"),
    ast.BitXor: ("^", "&"),
}
_CMPOPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}


@dataclass(frozen=True, slots=True)
class Mutant:
    """One mutated version of a file."""

    family: str
    path: str
    function: str
    """Qualified name of the innermost enclosing function, e.g. ``Stack.pop``."""
    function_line: int
    """The function's first line (first decorator, else ``def``): its ``co_firstlineno``."""
    line: int
    """1-based line of the edit in the original source."""
    original: str
    """The original text that was replaced (the fix puts it back)."""
    replacement: str
    source: str
    """The whole mutated file."""


class _Splicer:
    """Text edits addressed by ast positions (line numbers, UTF-8 byte columns)."""

    def __init__(self, source: str) -> None:
        self.data = source.encode()
        self.starts = [0]
        for i, b in enumerate(self.data):
            if b == 0x0A:
                self.starts.append(i + 1)

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        n: ast.expr = node  # type: ignore[assignment]
        assert n.end_lineno is not None and n.end_col_offset is not None
        return self.offset(n.lineno, n.col_offset), self.offset(n.end_lineno, n.end_col_offset)

    def text(self, a: int, b: int) -> str:
        return self.data[a:b].decode()

    def replace(self, a: int, b: int, new: str) -> str:
        return (self.data[:a] + new.encode() + self.data[b:]).decode()

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1


def _functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Every function with its qualified name (classes and enclosing functions joined by '.')."""

    def walk(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield child, name
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def first_line(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> int:
    return min([fn.lineno, *(d.lineno for d in fn.decorator_list)])


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of ``fn``'s body that belong to it, not to a nested function or class."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _core(gap: str) -> str:
    """The text between two operands without whitespace and parentheses ("" if a comment)."""
    if "#" in gap or "\\" in gap:
        return ""
    return " ".join(gap.replace("(", " ").replace(")", " ").split())


def _is_docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef, stmt: ast.stmt) -> bool:
    return (
        stmt is fn.body[0]
        and isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _edits(
    fn: ast.FunctionDef | ast.AsyncFunctionDef, sp: _Splicer
) -> Iterator[tuple[str, int, int, str]]:
    """(family, start, end, replacement) byte-range edits inside ``fn``."""
    for node in _own_nodes(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            old, new = _BINOPS[type(node.op)]
            a = sp.span(node.left)[1]
            b = sp.span(node.right)[0]
            gap = sp.text(a, b)
            if _core(gap) == old:
                i = gap.index(old)
                yield "op_swap", a + i, a + i + len(old), new
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOPS:
            old, new = _BINOPS[type(node.op)]
            a = sp.span(node.target)[1]
            b = sp.span(node.value)[0]
            gap = sp.text(a, b)
            if _core(gap) == old + "=":
                i = gap.index(old + "=")
                yield "op_swap", a + i, a + i + len(old), new
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                old, new = _CMPOPS[type(op)]
                a, b = sp.span(left)[1], sp.span(right)[0]
                gap = sp.text(a, b)
                i = gap.find(old)
                if _core(gap) == old and "\n" not in gap and i >= 0:
                    yield "compare_swap", a + i, a + i + len(old), new
                left = right
        elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            a, b = sp.span(node.values[0])[1], sp.span(node.values[1])[0]
            gap = sp.text(a, b)
            if _core(gap) == old and "\n" not in gap:
                i = gap.index(old)
                yield "bool_swap", a + i, a + i + len(old), new
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and sp.text(*sp.span(node)).isdigit()
        ):
            a, b = sp.span(node)
            for delta in (1, -1):
                v = node.value + delta
                if v >= 0:
                    yield "off_by_one", a, b, str(v)
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            a, b = sp.span(node.test)
            text = sp.text(a, b)
            if "\n" not in text:
                if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
                    inner = sp.text(*sp.span(node.test.operand))
                    yield "negate_condition", a, b, inner
                else:
                    yield "negate_condition", a, b, f"not ({text})"
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            x, y = node.args[0], node.args[1]
            if not isinstance(x, ast.Starred) and not isinstance(y, ast.Starred):
                (xa, xb), (ya, yb) = sp.span(x), sp.span(y)
                tx, ty = sp.text(xa, xb), sp.text(ya, yb)
                gap = sp.text(xb, ya)
                if tx != ty and _core(gap) == ",":
                    yield "swap_args", xa, yb, f"{ty}{gap}{tx}"
        if isinstance(node, ast.Slice):
            for bound in (node.lower, node.upper):
                if isinstance(bound, ast.Name):
                    a, b = sp.span(bound)
                    yield "off_by_one", a, b, f"{sp.text(a, b)} + 1"
    for body in _bodies(fn):
        for stmt in body:
            if _is_docstring(fn, stmt) and body is fn.body:
                continue
            family = ""
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                family = "drop_return"
            elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)) or (
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            ):
                family = "drop_statement"
            if not family:
                continue
            a, b = sp.span(stmt)
            line_a = sp.starts[stmt.lineno - 1]
            assert stmt.end_lineno is not None
            line_b = (
                sp.starts[stmt.end_lineno] if stmt.end_lineno < len(sp.starts) else len(sp.data)
            )
            before, after = sp.text(line_a, a), sp.text(b, line_b)
            if before.strip() or after.strip():
                continue  # shares a line with other code (e.g. `if x: return y`)
            if len(body) == 1:
                yield family, a, b, "pass"
            else:
                yield family, line_a, line_b, ""


def _bodies(fn: ast.AST) -> Iterator[list[ast.stmt]]:
    """Statement lists of ``fn`` (its body and nested blocks), not of nested defs."""
    stack: list[ast.AST] = [fn]
    while stack:
        node = stack.pop()
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body
                for s in body:
                    if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        stack.append(s)
        for h in getattr(node, "handlers", []) or []:
            stack.append(h)
        for c in getattr(node, "cases", []) or []:
            stack.append(c)


@dataclass(frozen=True, slots=True)
class Edit:
    """A candidate edit, not yet applied (cheap: ``apply`` builds and parses the source)."""

    family: str
    path: str
    function: str
    function_line: int
    line: int
    start: int
    end: int
    replacement: str


def edits(source: str, path: str) -> list[Edit]:
    """Every candidate edit of ``source`` inside a function (unchecked; see ``apply``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    sp = _Splicer(source)
    return [
        Edit(family, path, qualname, first_line(fn), sp.line_of(a), a, b, new)
        for fn, qualname in _functions(tree)
        for family, a, b, new in _edits(fn, sp)
    ]


def apply(source: str, edit: Edit) -> Mutant | None:
    """The mutant ``edit`` makes of ``source``; None if it changes nothing or does not parse."""
    data = source.encode()
    original = data[edit.start : edit.end].decode()
    mutated = (data[: edit.start] + edit.replacement.encode() + data[edit.end :]).decode()
    if mutated == source:
        return None
    try:
        ast.parse(mutated)
    except SyntaxError:
        return None
    return Mutant(
        family=edit.family,
        path=edit.path,
        function=edit.function,
        function_line=edit.function_line,
        line=edit.line,
        original=original,
        replacement=edit.replacement,
        source=mutated,
    )


def mutants(source: str, path: str) -> Iterator[Mutant]:
    """Every valid single-edit mutant of ``source`` (a file at repo-relative ``path``), unique."""
    seen: set[str] = set()
    for e in edits(source, path):
        m = apply(source, e)
        if m is not None and m.source not in seen:
            seen.add(m.source)
            yield m
