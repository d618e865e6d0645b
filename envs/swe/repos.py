"""Prepared repositories: pinned source distributions made into git repos with a test env each.

    prepare(["toolz", "six"], out="/var/tmp/swe")    # -> {"toolz": Prepared(...), ...}
    # /var/tmp/swe/toolz/repo   git repo, one commit on main (fixed author and date)
    # /var/tmp/swe/toolz/env    venv of /usr/bin/python3 with pytest (envs.swe.pyenv)

``REPOS`` pins each project: the sdist's URL and sha256, its licence, where its package and
tests are, and the commit its unpacked tree makes. The commit is built with a fixed author,
committer and date (``GIT_IDENTITY``), on branch ``main``, with the user's git configuration
ignored, so the same sdist gives the same commit hash on every machine; a prepared repo whose
``main`` is not the pinned commit is an error, never silently reused. Tasks synthesized from a
repo (``envs.swe.synth``) add their base commits on top of that commit, under ``refs/swe/``.

Each repo gets one test environment (``envs.swe.pyenv.build_test_env``), shared read-only by
all its tasks. Tests run from the repository root (``python -m pytest --rootdir=.``), which
puts a flat package on the path; a ``src/`` layout gets a ``.pth`` in the env that adds
``./src`` when it exists. Running ``prepare`` again reuses what exists after checking it (the
download's hash, the repo's commit, the env's pytest).

A project qualifies when it is permissively licensed, pure Python, its sdist ships its tests,
and they pass under plain pytest with no other dependency (the env holds pytest only). Checked
and left out: idna 3.20 and wcwidth 0.9.4 (tests error), sortedcontainers 2.4.0 (no tests in
the sdist), python-slugify 9.2.0 (needs text-unidecode).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError
from envs.swe.pyenv import build_test_env

FIXED_DATE = "2026-01-01T00:00:00Z"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "agentrl",
    "GIT_AUTHOR_EMAIL": "swe@agentrl.invalid",
    "GIT_COMMITTER_NAME": "agentrl",
    "GIT_COMMITTER_EMAIL": "swe@agentrl.invalid",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
}
_GIT_CONFIG = (
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "safe.directory=*",
)


@dataclass(frozen=True, slots=True)
class RepoSpec:
    """One pinned project: where its sdist is, and how its tests run."""

    name: str
    version: str
    url: str
    sha256: str
    license: str
    tests: tuple[str, ...]
    """Paths (files or folders) holding the tests, relative to the repo root."""
    commit: str = ""
    """The commit the unpacked sdist makes (``""``: not pinned yet; prepare prints it)."""
    src: str = ""
    """``"src"`` for a src layout (the package lives under ``src/``), else ``""``."""

    @property
    def slug(self) -> str:
        return self.name.replace("/", "__")


_PY = "https://files.pythonhosted.org/packages"
REPOS: dict[str, RepoSpec] = {
    s.name: s
    for s in (
        RepoSpec(
            "toolz",
            "1.2.0",
            f"{_PY}/31/6f/ae20c212a07aa2d156c787383d8088a5e045ee39628661edb190c97e1659/toolz-1.2.0.tar.gz",
            "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490",
            "BSD-3-Clause",
            ("toolz/tests",),
            commit="fcc57c877710e0dd4dbf7b9a818d5593aa1b3340",
        ),
        RepoSpec(
            "more-itertools",
            "11.2.1",
            f"{_PY}/52/b8/c63995bebbb9ac9c059350e0fb8c82c2420c85aeca7d34e40aecf3df9281/more_itertools-11.2.1.tar.gz",
            "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63",
            "MIT",
            ("tests",),
            commit="e09be208b7d539dfcdf74bce63832d56f4ec44aa",
        ),
        RepoSpec(
            "cachetools",
            "8.0.2",
            f"{_PY}/75/28/eb1ac766e4c0c439506a654186de8e2cfcd99035218a9393986103a0fdf0/cachetools-8.0.2.tar.gz",
            "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0",
            "MIT",
            ("tests",),
            src="src",
            commit="63e95e6c2f23c4bb8407c7d95ad25b246996f3f1",
        ),
        RepoSpec(
            "boltons",
            "26.2.0",
            f"{_PY}/71/56/14c4a4931910a81ddeccfbe227925ea738e3c445d3e2af960f0bcbba1616/boltons-26.2.0.tar.gz",
            "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c",
            "BSD-3-Clause",
            ("tests",),
            commit="0c8825510865c5953589235589e2a1876f05f3a3",
        ),
        RepoSpec(
            "inflection",
            "0.5.1",
            f"{_PY}/e1/7e/691d061b7329bc8d54edbf0ec22fbfb2afe61facb681f9aaa9bff7a27d04/inflection-0.5.1.tar.gz",
            "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
            "MIT",
            ("test_inflection.py",),
            commit="063263cd913c93582a28ad2c19f9cedcc1545fa8",
        ),
        RepoSpec(
            "isodate",
            "0.7.2",
            f"{_PY}/54/4d/e940025e2ce31a8ce1202635910747e5a87cc3a6a6bb2d00973375014749/isodate-0.7.2.tar.gz",
            "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6",
            "BSD-3-Clause",
            ("tests",),
            src="src",
            commit="3288fe5d24ec6e9558a03da927f9f18cc7127c02",
        ),
        RepoSpec(
            "six",
            "1.17.0",
            f"{_PY}/94/e7/b2c673351809dca68a0e064b6af791aa332cf192da575fd474ed7d6f16a2/six-1.17.0.tar.gz",
            "ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81",
            "MIT",
            ("test_six.py",),
            commit="2a9e2f01408f38595fc08205c53a98f7cf89b96d",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepared repo: its git work tree (at ``commit`` on ``main``) and its test env."""

    spec: RepoSpec
    root: Path
    commit: str

    @property
    def repo_dir(self) -> Path:
        return self.root / "repo"

    @property
    def env_dir(self) -> Path:
        return self.root / "env"

    @property
    def python(self) -> str:
        return str(self.env_dir / "bin" / "python")


def git(
    repo: str | Path, *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> str:
    """Run git in ``repo`` with the fixed identity and no user configuration; stdout."""
    full = {
        **os.environ,
        **GIT_IDENTITY,
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    full.update(env or {})
    r = subprocess.run(
        ["git", *_GIT_CONFIG, "-C", str(repo), *args],
        capture_output=True,
        text=True,
        input=input,
        env=full,
    )
    if r.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} failed in {repo}: {r.stderr.strip()[-2000:]}")
    return r.stdout


def commit_tree(repo: str | Path, message: str) -> str:
    """Commit the whole work tree of a fresh repo (``git init -b main``) and return the hash."""
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A", "--force")
    git(repo, "commit", "-q", "--no-verify", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def _download(spec: RepoSpec, cache: Path, log: Callable[[str], None]) -> Path:
    name = spec.url.rsplit("/", 1)[-1]
    path = cache / name
    if path.exists() and _sha256(path) == spec.sha256:
        log(f"  {name}: cached, sha256 ok")
        return path
    cache.mkdir(parents=True, exist_ok=True)
    log(f"  {name}: downloading {spec.url}")
    tmp = path.with_suffix(".part")
    try:
        with urllib.request.urlopen(spec.url, timeout=120) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:
        raise ConfigError(f"{spec.name}: could not download {spec.url}: {e}") from e
    got = _sha256(tmp)
    if got != spec.sha256:
        tmp.unlink()
        raise ConfigError(
            f"{spec.name}: sha256 mismatch for {spec.url}: expected {spec.sha256}, got {got}; "
            "the file on the index changed or the download was altered (nothing was unpacked)"
        )
    tmp.rename(path)
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unpack(archive: Path, dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        [top] = list(Path(tmp).iterdir())  # an sdist holds one folder, NAME-VERSION/
        top.rename(dest)
    for p in dest.rglob("__pycache__"):
        shutil.rmtree(p)


_SRC_PTH = 'import os, sys; os.path.isdir("src") and sys.path.insert(0, os.path.abspath("src"))\n'


def prepare_one(spec: RepoSpec, out: Path, log: Callable[[str], None] = print) -> Prepared:
    """Download, check, unpack, commit and build the env of one repo (reusing what is there)."""
    root = out / spec.slug
    repo = root / "repo"
    log(f"{spec.name} {spec.version}:")
    if (repo / ".git").exists():
        commit = git(repo, "rev-parse", "refs/heads/main").strip()
        if spec.commit and commit != spec.commit:
            raise ConfigError(
                f"{spec.name}: {repo} is at {commit}, not the pinned commit {spec.commit}; "
                f"delete {root} and prepare again"
            )
        log(f"  repo: reused at {commit[:12]}")
    else:
        archive = _download(spec, out / "_downloads", log)
        if repo.exists():
            shutil.rmtree(repo)  # a half-made repo from an interrupted run
        root.mkdir(parents=True, exist_ok=True)
        _unpack(archive, repo)
        commit = commit_tree(repo, f"{spec.name} {spec.version} (sdist)")
        if spec.commit and commit != spec.commit:
            raise ConfigError(
                f"{spec.name}: the unpacked sdist made commit {commit}, expected the pinned "
                f"{spec.commit}; the git version or the sdist differs (sha256 matched)"
            )
        log(f"  repo: committed {commit[:12]}")
    env = build_test_env(root / "env")
    if spec.src:
        site = next((root / "env" / "lib").glob("python3*/site-packages"))
        pth = site / "agentrl_swe_src.pth"
        if not pth.exists():
            pth.write_text(_SRC_PTH)
            pth.chmod(0o644)
    log(f"  env: {env.python}")
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return Prepared(spec=spec, root=root, commit=commit)


def prepare(
    names: Iterable[str] = (), out: str | Path = "swe-repos", log: Callable[[str], None] = print
) -> dict[str, Prepared]:
    """Prepare the named repos (all of ``REPOS`` when none are named) under ``out``."""
    wanted = list(names) or list(REPOS)
    unknown = [n for n in wanted if n not in REPOS]
    if unknown:
        raise ConfigError(f"unknown repo(s) {', '.join(unknown)}; known: {', '.join(REPOS)}")
    o = Path(out).absolute()
    if o.is_relative_to("/tmp"):
        raise ConfigError(
            f"--out {o} is under /tmp, which a sandbox replaces with its own; the test envs "
            "must be visible inside sandboxes: use /var/tmp or a data dir"
        )
    o.mkdir(parents=True, exist_ok=True)
    os.chmod(o, 0o755)
    return {n: prepare_one(REPOS[n], o, log) for n in wanted}


def load_prepared(repos_dir: str | Path, name: str) -> Prepared:
    """A repo ``prepare`` made (or any git repo at ``<repos_dir>/<slug>/repo`` with an env)."""
    spec = REPOS.get(name) or RepoSpec(name, "", "", "", "", ("tests",))
    root = Path(repos_dir).absolute() / spec.slug
    if not (root / "repo" / ".git").exists():
        raise ConfigError(
            f"no prepared repo {name!r} at {root / 'repo'}; run `agentrl swe prepare --out "
            f"{repos_dir} {name}`"
        )
    commit = git(root / "repo", "rev-parse", "refs/heads/main").strip()
    return Prepared(spec=spec, root=root, commit=commit)
