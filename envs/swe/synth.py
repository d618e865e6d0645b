"""Synthesize SWE tasks offline: mutate a prepared repo, keep the bugs its own tests catch.

    tasks = synthesize([load_prepared("/var/tmp/swe", "toolz")], SynthConfig(per_repo=100))
    save_tasks("tasks.jsonl", tasks)

Per repository (prepared by ``envs.swe.repos``):

1. A coverage map (``envs.swe.coverage``): which passing tests call which function; cached
   next to the repo as ``coverage-<commit>.json``.
2. Candidate bugs (``envs.swe.mutate``): single edits inside functions of non-test files
   that at least two tests cover, shuffled with the seed, at most ``per_function`` per
   function (different families first).
3. Validation, in ``workers`` scratch copies of the work tree (subprocesses, no sandbox, for
   speed): write the mutant, run only its covering tests (at most ``max_tests``) with pytest,
   read per-test outcomes from a JUnit report. A mutant is kept when >= 1 covering test fails
   (FAIL_TO_PASS) and >= 1 passes (PASS_TO_PASS); a mutant whose tests time out, or that
   makes a test go missing, is dropped, and so is one whose source equals an earlier one.
4. The task: the FAIL_TO_PASS test functions are *removed* from the base commit and come back
   only through ``test_patch``, so the hidden tests are never in the agent's workspace (a
   failing test whose definition cannot be found is not hidden: the mutant is dropped).
   ``base_commit`` = the prepared commit + the bug + the tests removed, committed with the
   fixed identity of ``envs.swe.repos`` under ``refs/swe/<instance_id>``; ``patch`` (the gold
   fix) = the reverse of the mutation; ``metadata`` = repo, family, file, function, the
   prepared commit (the base commit's parent) and the split.
5. The issue text (``problem_statement``) is written from the failing tests' report, without a
   language model: test names, the first lines of their assertion messages, and the files the
   tracebacks pass through, never a line number or the fixed source line.

A base commit only exists in the repo it was made in; ``materialize`` makes it again from
the row (parent + reversed patches + the same identity and message give the same hash), so a
shipped task file works on any machine that ran ``agentrl swe prepare``.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.splits import split_of
from envs.swe.coverage import CoverageMap, coverage_map, is_test_path
from envs.swe.grade import junit_key
from envs.swe.mutate import FAMILIES, Edit, Mutant, apply, edits
from envs.swe.repos import Prepared, git
from envs.swe.task import SWETask

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """How many tasks to make and how to validate them."""

    per_repo: int = 100
    """Stop a repo after this many kept tasks."""
    max_candidates: int = 600
    """Stop a repo after validating this many candidates, kept or not."""
    per_function: int = 3
    max_tests: int = 30
    """Covering tests run per candidate (a deterministic sample when there are more)."""
    max_test_s: float = 2.0
    """Tests slower than this on the clean repo are not used."""
    workers: int = 2
    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    """Mutation families to make (``envs.swe.mutate.FAMILIES``)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown or not self.families:
            what = f"unknown mutation family {', '.join(unknown)}" if unknown else "no family"
            raise ConfigError(f"{what}; the families are {', '.join(FAMILIES)}")


@dataclass(slots=True)
class _Result:
    mutant: Mutant
    tests: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, tuple[str, str]] = field(default_factory=dict)
    timed_out: bool = False


def _source_files(p: Prepared) -> list[str]:
    files = git(p.repo_dir, "ls-tree", "-r", "--name-only", p.commit).split()
    return sorted(
        f
        for f in files
        if f.endswith(".py")
        and not is_test_path(f)
        and Path(f).name not in ("setup.py", "conftest.py", "noxfile.py")
        and not f.startswith(("docs/", "doc/", "tools/", "benchmarks/", "examples/"))
    )


def candidates(p: Prepared, cmap: CoverageMap, cfg: SynthConfig) -> list[Edit]:
    """Candidate edits of ``p``'s source, ordered for validation (seeded, families spread)."""
    rng = random.Random(f"{cfg.seed}/{p.spec.name}")
    by_fn: dict[tuple[str, int], list[Edit]] = defaultdict(list)
    for path in _source_files(p):
        text = (p.repo_dir / path).read_text()
        for e in edits(text, path):
            if e.family in cfg.families and len(cmap.covering(path, e.function_line)) >= 2:
                by_fn[(path, e.function_line)].append(e)
    picked: list[list[Edit]] = []
    for key in sorted(by_fn):
        es = by_fn[key]
        rng.shuffle(es)
        fams: dict[str, list[Edit]] = defaultdict(list)
        for e in es:
            fams[e.family].append(e)
        order = sorted(fams, key=lambda f: rng.random())
        chosen: list[Edit] = []
        while len(chosen) < cfg.per_function * 2 and any(fams.values()):
            for f in order:
                if fams[f]:
                    chosen.append(fams[f].pop())
        picked.append(chosen)
    rng.shuffle(picked)
    # round-robin over functions: first choices of every function, then second choices, ...
    out: list[Edit] = []
    for i in range(cfg.per_function * 2):
        out.extend(c[i] for c in picked if len(c) > i)
    return out


def _covering_tests(cmap: CoverageMap, m: Mutant, cfg: SynthConfig) -> list[str]:
    tests = [
        t
        for t in cmap.covering(m.path, m.function_line)
        if cmap.durations.get(t, 0) <= cfg.max_test_s
    ]
    if len(tests) > cfg.max_tests:
        rng = random.Random(f"{cfg.seed}/{m.path}/{m.function_line}")
        tests = sorted(rng.sample(tests, cfg.max_tests))
    return tests


def run_tests(
    workdir: Path, python: str, tests: list[str], timeout_s: float
) -> tuple[dict[str, str], dict[str, tuple[str, str]], bool]:
    """Run pytest node ids in ``workdir``; (outcome by node id, (message, text) of failures, timed out)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-junit-") as tmp:
        xml_path = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        try:
            subprocess.run(
                [
                    python,
                    "-m",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "--rootdir=.",
                    "-q",
                    "-o",
                    "junit_family=xunit1",
                    f"--junitxml={xml_path}",
                    *tests,
                ],
                cwd=workdir,
                env=env,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return {}, {}, True
        xml = xml_path.read_bytes() if xml_path.exists() else b""
    by_key: dict[tuple[str, str], tuple[str, str, str]] = {}
    if xml:
        for case in ET.fromstring(xml).iter("testcase"):
            key = (case.get("classname", ""), case.get("name", ""))
            bad = case.find("error")
            if bad is None:
                bad = case.find("failure")
            if bad is not None:
                tag = "error" if bad.tag == "error" else "failed"
                by_key[key] = (tag, bad.get("message", ""), bad.text or "")
            elif case.find("skipped") is not None:
                by_key.setdefault(key, ("skipped", "", ""))
            else:
                by_key.setdefault(key, ("passed", "", ""))
    outcomes: dict[str, str] = {}
    messages: dict[str, tuple[str, str]] = {}
    for t in tests:
        o = by_key.get(junit_key(t))
        outcomes[t] = o[0] if o else "missing"
        if o and o[0] in ("failed", "error"):
            messages[t] = (o[1], o[2])
    return outcomes, messages, False


# --- hiding the failing tests ---------------------------------------------------------------


def hide_tests(repo_dir: Path, commit: str, test_ids: Iterable[str]) -> dict[str, str] | None:
    """Test files with the functions of ``test_ids`` removed (path -> new text), or None when
    one cannot be found (e.g. made by a loop or a factory). A method a test class inherits is
    removed from the base class that defines it (in any test file)."""
    import ast

    texts: dict[str, str] = {}
    trees: dict[str, ast.Module] = {}

    def tree_of(path: str) -> ast.Module:
        if path not in trees:
            texts[path] = git(repo_dir, "show", f"{commit}:{path}")
            trees[path] = ast.parse(texts[path])
        return trees[path]

    classes: dict[str, list[tuple[str, ast.ClassDef]]] | None = None

    def all_classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
        nonlocal classes
        if classes is None:
            classes = defaultdict(list)
            for f in git(repo_dir, "ls-tree", "-r", "--name-only", commit).split():
                if f.endswith(".py") and is_test_path(f):
                    try:
                        t = tree_of(f)
                    except SyntaxError:
                        continue
                    for n in t.body:
                        if isinstance(n, ast.ClassDef):
                            classes[n.name].append((f, n))
        return classes

    def method(
        cls: ast.ClassDef, path: str, name: str, depth: int = 0
    ) -> tuple[str, ast.AST, ast.ClassDef] | None:
        for n in cls.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
                return path, n, cls
        if depth > 5:
            return None
        for base in cls.bases:
            bname = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            for bpath, bcls in all_classes().get(bname, []):
                hit = method(bcls, bpath, name, depth + 1)
                if hit:
                    return hit
        return None

    cuts: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    owners: dict[int, ast.ClassDef] = {}
    for t in test_ids:
        path, _, rest = t.partition("::")
        parts = rest.split("::")
        name = re.sub(r"\[.*\]$", "", parts[-1])
        try:
            mod = tree_of(path)
        except (SyntaxError, ConfigError):
            return None
        hit: tuple[str, ast.AST, ast.ClassDef | None] | None
        if len(parts) > 1:
            cls = next(
                (n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == parts[-2]), None
            )
            hit = method(cls, path, name) if cls is not None else None
        else:
            fn = next(
                (
                    n
                    for n in mod.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                ),
                None,
            )
            hit = (path, fn, None) if fn is not None else None
        if hit is None:
            return None
        hpath, node, owner = hit
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        key = id(owner) if owner is not None else 0
        if owner is not None:
            owners[key] = owner
        cuts[hpath].add((start, node.end_lineno, key))
    out: dict[str, str] = {}
    for path, spans in cuts.items():
        lines = texts[path].splitlines(keepends=True)
        removed: dict[int, int] = defaultdict(int)
        for start, end, key in sorted(spans, key=lambda c: -c[0]):
            lines[start - 1 : end] = []
            removed[key] += 1
            owner = owners.get(key)
            if owner is not None and removed[key] == len(owner.body):
                indent = re.match(r"\s*", texts[path].splitlines()[start - 1]).group(0)  # type: ignore[union-attr]
                lines.insert(start - 1, f"{indent}pass\n")
        new = "".join(lines)
        try:
            ast.parse(new)
        except SyntaxError:
            return None
        out[path] = new
    return out


# --- commits ------------------------------------------------------------------------------


def _commit(repo: Path, parent: str, files: dict[str, str], message: str) -> str:
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-idx-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", parent, env=env)
        for path, text in files.items():
            mode = git(repo, "ls-tree", parent, "--", path).split()[0] or "100644"
            blob = git(repo, "hash-object", "-w", "--stdin", input=text).strip()
            git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env).strip()
    return git(repo, "commit-tree", tree, "-p", parent, "-m", message).strip()


def commit_message(instance_id: str) -> str:
    return f"swe task {instance_id}"


def materialize(tasks: Iterable[SWETask], repos_dir: str | Path, log: Log = print) -> int:
    """Make each task's base commit in its prepared repo if missing; returns how many were made.

    The commit is rebuilt from the row (prepared commit + reversed ``patch`` and
    ``test_patch``) and must hash to ``base_commit``; anything else is an error.
    """
    made = 0
    for t in tasks:
        repo = Path(repos_dir) / t.repo.replace("/", "__") / "repo"
        if not (repo / ".git").exists():
            raise ConfigError(
                f"{t.instance_id}: no prepared repo at {repo}; run `agentrl swe prepare --out {repos_dir} {t.repo}`"
            )
        ok = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{t.base_commit}^{{commit}}"],
            capture_output=True,
        )
        if ok.returncode == 0:
            continue
        parent = str(t.metadata.get("prepared_commit", ""))
        if not parent:
            raise ConfigError(
                f"{t.instance_id}: base commit {t.base_commit} is missing and the row has no metadata.prepared_commit to rebuild it from"
            )
        with tempfile.TemporaryDirectory(prefix="agentrl-swe-idx-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git(repo, "read-tree", parent, env=env)
            for diff in (t.patch, t.test_patch):
                if diff:
                    git(
                        repo,
                        "apply",
                        "--cached",
                        "-R",
                        "--whitespace=nowarn",
                        "-",
                        input=diff,
                        env=env,
                    )
            tree = git(repo, "write-tree", env=env).strip()
        commit = git(
            repo, "commit-tree", tree, "-p", parent, "-m", commit_message(t.instance_id)
        ).strip()
        if commit != t.base_commit:
            raise ConfigError(
                f"{t.instance_id}: rebuilding the base commit gave {commit}, not {t.base_commit}; "
                "the prepared repo differs from the one the tasks were made from"
            )
        git(repo, "update-ref", f"refs/swe/{t.instance_id}", commit)
        made += 1
    if made:
        log(f"made {made} base commit(s) from their rows")
    return made


# --- issue text ---------------------------------------------------------------------------

_TB_FILE = re.compile(r"^([\w./-]+\.py):\d+:", re.MULTILINE)


def problem_statement(
    repo: str,
    f2p: list[str],
    messages: dict[str, tuple[str, str]],
    fixed_line: str,
    rng: random.Random,
) -> str:
    """The issue text for a bug, from its failing tests' report (see the module docstring)."""
    openers = [
        f"Some behaviour of {repo} is broken: tests that used to pass now fail.",
        f"A regression in {repo}: the following tests fail.",
        f"After a recent change, {repo} no longer behaves as its tests expect.",
        f"Bug report for {repo}: these checks fail on the current code.",
    ]
    hidden = fixed_line.strip()
    lines = [rng.choice(openers), "", "Failing tests:"]
    lines += [f"- {t}" for t in f2p[:5]]
    if len(f2p) > 5:
        lines.append(f"- ... and {len(f2p) - 5} more")
    files: list[str] = []
    shown = 0
    for t in f2p:
        if t not in messages or shown >= 3:
            continue
        message, text = messages[t]
        for f in _TB_FILE.findall(text):
            if f not in files and not f.startswith("/"):
                files.append(f)
        msg = "\n".join(message.strip().splitlines()[:6])[:400]
        msg = re.sub(r"(\.py):\d+", r"\1", msg)
        msg = re.sub(r"\bline \d+", "line ?", msg)
        if hidden and len(hidden) > 3 and hidden in msg:
            msg = "(message omitted)"
        if msg:
            if shown == 0:
                lines += ["", "What fails:"]
            lines += [f"{t}:", *("    " + m for m in msg.splitlines())]
            shown += 1
    if files:
        lines += ["", "The errors pass through: " + ", ".join(files[:5])]
    lines += ["", "Please fix the code so these tests pass; the tests themselves are correct."]
    return "\n".join(lines) + "\n"


# --- the pipeline -------------------------------------------------------------------------


def _fixed_line(m: Mutant, original_source: str) -> str:
    return (
        original_source.splitlines()[m.line - 1]
        if m.line - 1 < len(original_source.splitlines())
        else ""
    )


def synthesize_repo(p: Prepared, cfg: SynthConfig, log: Log = print) -> list[SWETask]:
    """Tasks from one prepared repo; see the module docstring."""
    name = p.spec.name
    tests = tuple(t for t in p.spec.tests if (p.repo_dir / t).exists()) or (".",)
    cmap_path = p.root / f"coverage-{p.commit[:12]}.json"
    log(f"{name}: coverage map{' (cached)' if cmap_path.exists() else ''} ...")
    cmap = coverage_map(p.repo_dir, p.python, tests, out=cmap_path)
    log(f"{name}: {len(cmap.durations)} tests, {len(cmap.by_function)} functions covered")
    cands = candidates(p, cmap, cfg)[: cfg.max_candidates]
    log(f"{name}: {len(cands)} candidate bugs to validate (stops at {cfg.per_repo} kept)")
    sources = {f: (p.repo_dir / f).read_text() for f in {e.path for e in cands}}
    scratch = Path(tempfile.mkdtemp(prefix=f"agentrl-swe-synth-{p.spec.slug}-", dir="/var/tmp"))
    work = []
    for i in range(max(1, cfg.workers)):
        w = scratch / f"w{i}"
        shutil.copytree(p.repo_dir, w, ignore=shutil.ignore_patterns(".git"))
        work.append(w)
    free = list(work)
    seen: set[str] = set()

    def validate(m: Mutant) -> _Result:
        w = free.pop()
        try:
            target = w / m.path
            target.write_text(m.source)
            ts = _covering_tests(cmap, m, cfg)
            budget = 20.0 + 5.0 * sum(cmap.durations.get(t, 0.0) for t in ts)
            outcomes, messages, timed_out = run_tests(w, p.python, ts, budget)
            return _Result(m, ts, outcomes, messages, timed_out)
        finally:
            target.write_text(sources[m.path])
            free.append(w)

    kept: list[SWETask] = []
    tried = 0
    try:
        with ThreadPoolExecutor(max_workers=len(work)) as pool:
            queue = iter(cands)
            while len(kept) < cfg.per_repo:
                batch: list[Mutant] = []
                for e in queue:
                    m = apply(sources[e.path], e)
                    if m is None or (m.path + m.source) in seen:
                        continue
                    seen.add(m.path + m.source)
                    batch.append(m)
                    if len(batch) >= len(work) * 4:
                        break
                if not batch:
                    break
                tried += len(batch)
                for r in pool.map(validate, batch):
                    task = _task(p, r, sources, cfg)
                    if task is not None and len(kept) < cfg.per_repo:
                        kept.append(task)
                log(f"{name}: {len(kept)} kept of {tried} validated")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return kept


def _task(p: Prepared, r: _Result, sources: dict[str, str], cfg: SynthConfig) -> SWETask | None:
    if r.timed_out or not r.outcomes or "missing" in r.outcomes.values():
        return None
    f2p = [t for t, o in r.outcomes.items() if o in ("failed", "error")]
    p2p = [t for t, o in r.outcomes.items() if o == "passed"]
    if not f2p or not p2p:
        return None
    m = r.mutant
    hidden = hide_tests(p.repo_dir, p.commit, f2p)
    if hidden is None:
        return None
    digest = hashlib.sha1(f"{m.path}\0{m.source}".encode()).hexdigest()[:8]
    fn = re.sub(r"[^A-Za-z0-9_.]", "_", m.function)
    iid = f"{p.spec.slug}__{fn}__{m.family}__{digest}"
    base = _commit(p.repo_dir, p.commit, {m.path: m.source, **hidden}, commit_message(iid))
    git(p.repo_dir, "update-ref", f"refs/swe/{iid}", base)
    patch = git(p.repo_dir, "diff", base, p.commit, "--", m.path)
    test_patch = git(p.repo_dir, "diff", base, p.commit, "--", *sorted(hidden))
    rng = random.Random(digest)
    statement = problem_statement(
        p.spec.name, f2p, r.messages, _fixed_line(m, sources[m.path]), rng
    )
    return SWETask(
        instance_id=iid,
        repo=p.spec.name,
        base_commit=base,
        problem_statement=statement,
        patch=patch,
        test_patch=test_patch,
        fail_to_pass=tuple(f2p),
        pass_to_pass=tuple(p2p),
        version=p.spec.version,
        metadata={
            "family": m.family,
            "file": m.path,
            "function": m.function,
            "repo": p.spec.name,
            "prepared_commit": p.commit,
            "split": split_of(p.spec.name),
            "synth_seed": cfg.seed,
        },
    )


def synthesize(
    repos: Iterable[Prepared], cfg: SynthConfig = SynthConfig(), log: Log = print
) -> list[SWETask]:
    """Tasks from every repo in turn (instance ids are unique across repos)."""
    out: list[SWETask] = []
    for p in repos:
        out.extend(synthesize_repo(p, cfg, log))
    return out
