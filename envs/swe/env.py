"""``swe/Repo-v0``: fix a repository task in a sandbox; the hidden tests decide the reward.

    env = make_env("swe/Repo-v0", tasks="data/swe/tasks.jsonl", repos_dir="/var/tmp/swe")
    obs, info = await env.areset(seed=0)        # a task; a fresh sandbox holding its repo
    obs, r, done, _, info = await env.astep(action)   # tool calls run; submit grades

One episode: reset draws a task (from the sample's split: train and eval tasks come from
different *repositories*, ``task_key`` is the repo) and copies its workspace into a new
sandbox. A task's workspace is made once (``SWEEnv.workspace``): the tree of ``base_commit``,
committed alone, so the history holds nothing to read a fix from (no later commits, tags,
reflog, remotes or packs); a reset then costs one sandbox create. The model
works with tools (``mode="tools"``: bash, the editor, search, python, submit) or, in
``mode="bash"``, writes one fenced ```` ```bash ```` block per turn that runs in a fresh shell
(``submit`` alone in the block ends the task). Each observation is cut to
``max_output_chars`` (head and tail around a marker). Submitting, replying without a tool
call (tools mode), or the loop's limit (``SWEAgentLoop`` asks for a grade) takes the
workspace's diff against the base commit and hands it to ``envs.swe.grade.grade``: a fresh
sandbox, protected files dropped, hidden tests applied, per-test outcomes. The step's
``info["report"]`` (saved on the trajectory) holds the per-test report and the diff.

A curriculum narrows the task set (``families``, ``repos``, ``bug_pattern``) and the prompt
(``max_issue_chars``); ``demo_probe`` and ``demo_edit="line"`` make the oracle's
demonstrations short enough for a small model to copy (``recipes/swe.yaml``).

Repositories live under ``repos_dir``, one folder per ``task.repo`` with ``/`` replaced by
``__``: ``<slug>/repo`` (a git repository holding every task's base commit) and, when
present, ``<slug>/env`` (its test environment, ``envs.swe.pyenv``), or pass ``repo_envs``
(repo name -> ``RepoEnv``) directly. Infrastructure failures (a sandbox that dies, a task
whose tests do not run) raise and are masked from the loss, never scored 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

from agentrl.env import Env, Info, Observation, StepResult
from agentrl.errors import ConfigError, EnvError, SandboxError
from agentrl.sandbox import Sandbox, make_sandbox, new_name
from agentrl.splits import DEFAULT_EVAL_FRACTION, split_of
from agentrl.types import Message, ToolCall
from envs.swe.demo import editor_edits, sed_fixes, sed_gives_the_fix
from envs.swe.grade import RepoEnv, grade
from envs.swe.task import SWETask, load_tasks

logger = logging.getLogger(__name__)
Mode = Literal["tools", "bash"]
DemoEdit = Literal["hunk", "line", "sed", "sed_listed"]
FIXED_DATE = "2026-01-01T00:00:00Z"
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "agentrl",
    "GIT_AUTHOR_EMAIL": "swe@agentrl.invalid",
    "GIT_COMMITTER_NAME": "agentrl",
    "GIT_COMMITTER_EMAIL": "swe@agentrl.invalid",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
}
_SAFE_GIT = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}
_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.DOTALL)
SUBMIT_COMMAND = "submit"

TOOLS_PROMPT = """You are a software engineer working in a git repository at /workspace.
Fix the issue below so that the repository's tests pass. Explore the code, reproduce the
problem, edit the source (not the tests), and check your change. Use the tools; call submit
once when you are done."""
BASH_PROMPT = """You are a software engineer working in a git repository at /workspace.
Fix the issue below so that the repository's tests pass. Each reply must contain exactly one
fenced block of shell commands, like

```bash
grep -rn "def parse" src/ | head
```

It runs in a fresh shell in /workspace and you see its output. Edit files with shell tools
(sed, cat with a heredoc, python). When you are done, reply with a block holding only
`submit`."""

_TASK_CACHE: dict[tuple[str, float], list[SWETask]] = {}


def cut(text: str, limit: int) -> str:
    """``text`` with its middle replaced by a marker when longer than ``limit`` characters."""
    if limit <= 0 or len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    gone = len(text) - head - tail
    return f"{text[:head]}\n[... {gone} characters cut; narrow the command ...]\n{text[-tail:]}"


def _load(tasks: str | list[SWETask]) -> list[SWETask]:
    if not isinstance(tasks, str):
        return list(tasks)
    p = Path(tasks)
    if not p.exists():
        raise ConfigError(
            f"swe/Repo-v0: tasks file {tasks!r} does not exist; make one with "
            "`agentrl swe synth` or point tasks= at SWE-bench rows (.jsonl or .parquet)"
        )
    key = (str(p.resolve()), p.stat().st_mtime)
    if key not in _TASK_CACHE:
        _TASK_CACHE[key] = load_tasks(p)
    return _TASK_CACHE[key]


def _repo_env(name: str, d: dict[str, Any]) -> RepoEnv:
    try:
        return RepoEnv(
            repo_dir=str(d["repo_dir"]),
            python=str(d.get("python", "python3")),
            ro_paths=tuple(d.get("ro_paths", ())),
        )
    except (KeyError, TypeError) as e:
        raise ConfigError(
            f"swe/Repo-v0: repo_envs[{name!r}] = {d!r}: expected "
            "{repo_dir: ..., python: ..., ro_paths: [...]}"
        ) from e


class SWEEnv(Env):
    """A repository task in a sandbox; see the module docstring."""

    nondeterministic = True  # a sandbox, wall clocks and subprocesses

    def __init__(
        self,
        tasks: str | list[SWETask],
        *,
        repos_dir: str = "",
        repo_envs: dict[str, RepoEnv | dict[str, Any]] | None = None,
        mode: Mode = "tools",
        max_output_chars: int = 8000,
        command_timeout_s: float = 60.0,
        grade_timeout_s: float = 300.0,
        partial_credit: bool = False,
        sandbox_kind: str = "local",
        sandbox_options: dict[str, Any] | None = None,
        workspace_cache: str = "",
        sandbox_prefix: str = "agentrl-swe-",
        families: list[str] | None = None,
        repos: list[str] | None = None,
        bug_pattern: str = "",
        max_issue_chars: int = 0,
        demo_probe: str = "",
        demo_edit: DemoEdit = "hunk",
        demo_sed: str = "",
        grade_empty_patch: bool = True,
        system_prompt: str = "",
        tool_names: list[str] | None = None,
    ) -> None:
        """See the module docstring; the curriculum arguments:

        - ``families``: keep tasks whose ``metadata["family"]`` (the mutation, see
          ``envs.swe.mutate.FAMILIES``) is one of these; None keeps all.
        - ``repos``: keep tasks of these repositories; None keeps all.
        - ``bug_pattern``: keep tasks whose gold patch removes a line matching this regular
          expression (the buggy line), e.g. ``"not \\("`` for negated conditions.
        - ``max_issue_chars``: cut the issue text to this many characters (0: whole).
        - ``demo_probe``: the shell command the demonstration runs first, instead of the
          failing tests' files (e.g. a search that finds the bug).
        - ``demo_edit``: ``"hunk"``: the demonstration replaces the gold patch's hunks with
          their context; ``"line"``: only the changed line, stripped, with the path relative to
          the workspace, where that text is unique in the file (else the hunk); ``"sed"``: one
          ``sed -i '<line><demo_sed>' <path>`` per changed line, where that gives the gold line
          (else as ``"line"``), so the model copies a path and a line number
          (``envs.swe.demo``); ``"sed_listed"``: the same with the location first, as
          ``f=<path>:<line>; sed -i ...``, one ``git grep -n`` listing line copied in order.
        - ``demo_sed``: the sed command of ``demo_edit="sed"``, e.g. ``s/not (\\(.*\\))/\\1/``
          to undo a negated condition.
        - ``grade_empty_patch``: False scores an empty diff 0 without grading it (a task's base
          fails its tests: ``agentrl swe validate`` checks it), which saves a sandbox and a
          test run per idle rollout.
        - ``system_prompt``: replaces the mode's system prompt (empty: ``TOOLS_PROMPT`` or
          ``BASH_PROMPT``); ``tool_names``: the SWE tools offered in tools mode (None: all of
          bash, str_replace_editor, search, python, submit). A small model's prompt stays short.
        """
        if mode not in ("tools", "bash"):
            raise ConfigError(f"swe/Repo-v0: mode must be 'tools' or 'bash', got {mode!r}")
        if demo_edit not in ("hunk", "line", "sed", "sed_listed"):
            raise ConfigError(
                "swe/Repo-v0: demo_edit must be 'hunk', 'line', 'sed' or 'sed_listed', "
                f"got {demo_edit!r}"
            )
        sed = demo_edit in ("sed", "sed_listed")
        if sed != bool(demo_sed) or "'" in demo_sed or "\n" in demo_sed:
            raise ConfigError(
                "swe/Repo-v0: demo_edit='sed' (or 'sed_listed') needs demo_sed= (a sed command "
                "without single quotes or newlines, e.g. 's/not (\\(.*\\))/\\1/'), and "
                f"demo_sed is only for those; got demo_edit={demo_edit!r}, demo_sed={demo_sed!r}"
            )
        if max_issue_chars < 0:
            raise ConfigError(f"swe/Repo-v0: max_issue_chars must be >= 0, got {max_issue_chars}")
        if not repos_dir and not repo_envs:
            raise ConfigError(
                "swe/Repo-v0 needs repos_dir= (the folder `agentrl swe prepare` filled) or "
                "repo_envs= (repo name -> RepoEnv)"
            )
        self.tasks = select(_load(tasks), families=families, repos=repos, bug_pattern=bug_pattern)
        if not self.tasks:
            raise ConfigError(f"swe/Repo-v0: no tasks in {tasks!r}")
        self.max_issue_chars = max_issue_chars
        self.demo_probe = demo_probe
        self.demo_edit: DemoEdit = demo_edit
        self.demo_sed = demo_sed
        self.grade_empty_patch = grade_empty_patch
        self.repos_dir = repos_dir
        self.repo_envs = {
            name: e if isinstance(e, RepoEnv) else _repo_env(name, e)
            for name, e in (repo_envs or {}).items()
        }
        self.mode: Mode = mode
        self.max_output_chars = max_output_chars
        self.command_timeout_s = command_timeout_s
        self.grade_timeout_s = grade_timeout_s
        self.partial_credit = partial_credit
        self.sandbox_kind = sandbox_kind
        self.sandbox_options = dict(sandbox_options or {})
        self.workspace_cache = workspace_cache
        self.sandbox_prefix = sandbox_prefix
        self.sandbox: Sandbox | None = None
        self.task: SWETask | None = None
        self._root = ""
        self.system_prompt = system_prompt or (TOOLS_PROMPT if mode == "tools" else BASH_PROMPT)
        if mode == "tools":
            from agentrl.tool import ToolSet
            from tools.swe import swe_toolset

            self.tools = swe_toolset()
            if tool_names is not None:
                unknown = sorted(set(tool_names) - set(self.tools.names))
                if unknown or "submit" not in tool_names:
                    raise ConfigError(
                        f"swe/Repo-v0: tool_names={tool_names} must name some of "
                        f"{self.tools.names}, submit included (unknown: {unknown})"
                    )
                chosen = [self.tools[n] for n in self.tools.names if n in tool_names]
                self.tools = ToolSet(chosen, name="swe")

    # --- episode --------------------------------------------------------------------------
    def repo_env(self, task: SWETask) -> RepoEnv:
        """Where ``task``'s repository and its Python are (see the module docstring)."""
        if task.repo in self.repo_envs:
            return self.repo_envs[task.repo]
        slug = task.repo.replace("/", "__")
        base = Path(self.repos_dir) / slug
        if not (base / "repo" / ".git").exists():
            raise EnvError(
                f"{task.instance_id}: no prepared repository at {base / 'repo'}; run "
                f"`agentrl swe prepare --out {self.repos_dir}` (or pass repo_envs=)"
            )
        env = base / "env"
        if (env / "bin" / "python").exists():
            python = str(env / "bin" / "python")
            return RepoEnv(repo_dir=str(base / "repo"), python=python, ro_paths=(str(env),))
        return RepoEnv(repo_dir=str(base / "repo"))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, Info]:
        await super().areset(seed=seed)
        old, self.sandbox = self.sandbox, None  # closed while the new one is made (below)
        opts = options or {}
        pool = self.tasks
        if opts.get("split") is not None:
            frac = float(opts.get("eval_fraction", DEFAULT_EVAL_FRACTION))
            pool = [t for t in self.tasks if split_of(t.repo, frac) == opts["split"]]
            if not pool:
                repos = sorted({t.repo for t in self.tasks})
                raise EnvError(
                    f"swe/Repo-v0: no {opts['split']!r} tasks at eval_fraction={frac}: the "
                    f"split is by repository and none of {repos} falls there; change "
                    "data.eval_fraction or add repositories"
                )
        task = pool[int(self.np_random.integers(len(pool)))]
        self.task = task
        made, closed = await asyncio.gather(
            self._new_sandbox(task, self.sandbox_prefix),
            self._close(old),
            return_exceptions=True,
        )
        if isinstance(closed, BaseException):  # the backend's sweep removes what is left
            logger.warning("swe/Repo-v0: closing the last episode's sandbox failed: %r", closed)
        if isinstance(made, BaseException):
            raise made
        self.sandbox, self._root = made
        obs = [
            Message(role="system", content=self.system_prompt),
            Message(role="user", content=f"<issue>\n{self.issue_text(task)}\n</issue>"),
        ]
        return obs, {"task_key": task.repo, "instance_id": task.instance_id}

    def issue_text(self, task: SWETask) -> str:
        """The issue the model sees, cut to ``max_issue_chars`` (head kept, a marker at the end)."""
        text = task.problem_statement.strip()
        if self.max_issue_chars and len(text) > self.max_issue_chars:
            return text[: self.max_issue_chars].rstrip() + "\n[... issue cut ...]"
        return text

    def task_key(self, observation: Observation, info: Info) -> str:
        """The repository: train and eval tasks never share one."""
        return str(info["task_key"])

    async def _new_sandbox(self, task: SWETask, prefix: str) -> tuple[Sandbox, str]:
        """A sandbox holding ``task``'s workspace (made first if needed), and its root commit."""
        repo = self.repo_env(task)
        folder, root = await asyncio.to_thread(self.workspace, task, repo)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if repo.python != "python3":
            path = f"{os.path.dirname(repo.python)}:{path}"
        env = {"PATH": path, **_SAFE_GIT, "PYTHONDONTWRITEBYTECODE": "1"}
        config = {
            **repo.sandbox_options(self.sandbox_kind),
            **self.sandbox_options,
            "template_dir": folder,
            "env": {**env, **(self.sandbox_options.get("env") or {})},
        }
        sb = await make_sandbox(self.sandbox_kind, name=new_name(prefix), **config)
        return sb, root

    def workspace(self, task: SWETask, repo: RepoEnv) -> tuple[str, str]:
        """The task's scrubbed workspace (a folder) and its one commit, made once per task.

        ``git archive`` of the base commit, committed alone with a fixed identity and date (so
        the commit hash is the same everywhere), under ``workspace_cache`` (default: a
        ``.workspaces`` folder beside the repository). Built in a temporary folder and renamed
        into place, so concurrent envs and processes never see half of one. Each reset then
        only copies it into a new sandbox.
        """
        cache = Path(self.workspace_cache or Path(repo.repo_dir).parent / ".workspaces")
        done = cache / task.instance_id
        marker = done / ".git" / "agentrl-root"
        if marker.exists():
            return str(done), marker.read_text().strip()
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{task.instance_id}.", dir=cache))
        try:
            env = {**os.environ, **_GIT_IDENTITY, "GIT_CONFIG_GLOBAL": "/dev/null"}
            archive = subprocess.run(
                ["git", "-C", repo.repo_dir, "archive", "--format=tar", task.base_commit],
                capture_output=True,
                check=False,
            )
            if archive.returncode:
                raise EnvError(
                    f"{task.instance_id}: base_commit {task.base_commit} is not in the prepared "
                    f"repo {repo.repo_dir}: {archive.stderr.decode(errors='replace')[-500:]}"
                )
            subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
            for argv in (
                ["git", "init", "-q", "-b", "main"],
                ["git", "add", "-A"],
                ["git", "commit", "-q", "--no-verify", "-m", "base"],
            ):
                subprocess.run(argv, cwd=tmp, env=env, check=True, capture_output=True)
            root = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=tmp, capture_output=True, text=True, check=True
            ).stdout.strip()
            (tmp / ".git" / "agentrl-root").write_text(root + "\n")
            subprocess.run(["chmod", "-R", "a+rX", str(tmp)], check=True)
            try:
                tmp.rename(done)
            except OSError:  # another env finished it first: theirs is the same
                if not marker.exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(done), marker.read_text().strip()

    async def astep(self, action: Message) -> StepResult:
        if self.sandbox is None or self.task is None:
            raise EnvError("swe/Repo-v0: step() before reset()")
        if action.role != "assistant":  # the loop's limit (agents.swe_agent.GRADE_NOW)
            return await self.finish()
        if self.mode == "tools":
            if not action.tool_calls:
                return await self.finish()
            obs = await self.acall_tools(action, sandbox=self.sandbox)
            obs = [dataclasses.replace(m, content=cut(m.text, self.max_output_chars)) for m in obs]
            from tools._state import get_submission

            if get_submission(self.sandbox) is not None:
                return await self.finish(obs)
            return obs, 0.0, False, False, {}
        blocks = _BASH_BLOCK.findall(action.text)
        if len(blocks) != 1:
            msg = (
                f"Found {len(blocks)} ```bash blocks; reply with exactly one fenced block of "
                "commands (or one holding only `submit` when you are done)."
            )
            return [Message(role="user", content=msg)], 0.0, False, False, {"format_error": 1}
        command = blocks[0].strip()
        if command == SUBMIT_COMMAND:
            return await self.finish()
        return [await self._run_block(self.sandbox, command)], 0.0, False, False, {}

    async def _run_block(self, sandbox: Sandbox, command: str) -> Message:
        r = await sandbox.exec(command, timeout_s=self.command_timeout_s)
        text = f"<returncode>{r.exit_code}</returncode>\n<output>\n{r.output}</output>"
        if r.timed_out:
            text += f"\n(the command was killed after {self.command_timeout_s:g} s)"
        return Message(role="user", content=cut(text, self.max_output_chars))

    # --- the oracle -------------------------------------------------------------------------
    async def ademonstration(self) -> list[Message] | None:
        """The gold fix, made the way the model should: run the tests that show the bug (those
        of the failing tests' files that are in the workspace), apply the fix (the editor's
        ``str_replace`` per hunk in tools mode, falling back to ``git apply`` where a hunk's
        text is not unique; ``git apply`` in bash mode), then submit. The outputs are recorded
        in a scratch sandbox of the same workspace, so the episode's own is untouched."""
        if self.task is None:
            return None
        task = self.task
        sb, _ = await self._new_sandbox(task, self.sandbox_prefix + "demo-")
        async with sb:
            files = sorted({t.split("::")[0] for t in task.fail_to_pass})
            have = await sb.exec(
                "ls -d " + " ".join(shlex.quote(f) for f in files) + " 2>/dev/null"
            )
            present = have.stdout.split()
            run = f"python -m pytest -q -x {' '.join(shlex.quote(f) for f in present)}"
            probes = [self.demo_probe] if self.demo_probe else [run] if present else []
            apply = f"git apply <<'AGENTRL_PATCH'\n{task.patch.rstrip()}\nAGENTRL_PATCH"
            seds = await self._sed_commands(sb, task)
            if self.mode == "bash":
                return await self._bash_demo(sb, probes, seds or [apply])
            return await self._tools_demo(sb, probes, task.patch, seds)

    async def _sed_commands(self, sb: Sandbox, task: SWETask) -> list[str] | None:
        """``demo_edit="sed"``: the fix as sed commands, or None (a warning) where the gold
        patch is not one changed line per hunk or ``demo_sed`` does not give the gold line."""
        if self.demo_edit not in ("sed", "sed_listed"):
            return None
        fixes = sed_fixes(task.patch)
        if fixes and all([await sed_gives_the_fix(sb, f, self.demo_sed) for f in fixes]):
            listed = self.demo_edit == "sed_listed"
            return [f.command(self.demo_sed, listed=listed) for f in fixes]
        logger.warning(
            "%s: demo_sed %r does not give the gold patch's lines; its demonstration edits "
            "with the editor instead (git apply where the editor is not offered)",
            task.instance_id,
            self.demo_sed,
        )
        return None

    async def _bash_demo(self, sb: Sandbox, probes: list[str], fixes: list[str]) -> list[Message]:
        out: list[Message] = []
        for cmd in [*probes, *fixes]:
            out.append(Message(role="assistant", content=f"```bash\n{cmd}\n```"))
            out.append(await self._run_block(sb, cmd))
        out.append(Message(role="assistant", content=f"```bash\n{SUBMIT_COMMAND}\n```"))
        return out

    async def _tools_demo(
        self, sb: Sandbox, probes: list[str], patch: str, seds: list[str] | None
    ) -> list[Message]:
        assert self.tools is not None
        calls = [ToolCall(name="bash", arguments={"command": c}) for c in [*probes, *(seds or [])]]
        edits: list[tuple[str, str | None, str, bool]]
        if seds:
            edits = []  # the sed commands are the fix
        elif "str_replace_editor" in self.tools.names:
            edits = await editor_edits(sb, patch, lines=self.demo_edit != "hunk")
        else:  # no editor offered: one git apply of the whole patch
            edits = [("", None, patch, False)]
        for path, old, new, line in edits:
            if old is None:  # not expressible as a unique replacement
                args = {"command": f"git apply <<'AGENTRL_PATCH'\n{new.rstrip()}\nAGENTRL_PATCH"}
                calls.append(ToolCall(name="bash", arguments=args))
            else:
                where = path if line else f"{sb.workdir}/{path}"
                args = {"command": "str_replace", "path": where}
                calls.append(
                    ToolCall(
                        name="str_replace_editor", arguments=args | {"old_str": old, "new_str": new}
                    )
                )
        calls.append(ToolCall(name="submit", arguments={"answer": "Fixed; the tests pass."}))
        out: list[Message] = []
        for call in calls:
            out.append(Message(role="assistant", content="", tool_calls=(call,)))
            if call.name == "submit":
                break  # the env grades here; the submit tool's own message is not shown
            result = await self.tools.call(call, sandbox=sb, env=self)
            msg = self.tools.to_message(call, result)
            out.append(dataclasses.replace(msg, content=cut(msg.text, self.max_output_chars)))
        return out

    async def diff(self) -> str:
        """The workspace's changes against the base commit, new files included."""
        assert self.sandbox is not None
        r = await self.sandbox.exec(
            'idx=$(mktemp -u) && GIT_INDEX_FILE="$idx" git add -A && '
            f'GIT_INDEX_FILE="$idx" git diff --cached --binary {self._root}; rc=$?; rm -f "$idx"; exit $rc',
            timeout_s=120,
        )
        return r.stdout if r.ok else ""  # a workspace the model broke (no .git) has no diff

    async def finish(self, obs: Observation | None = None) -> StepResult:
        """Grade the workspace now: the episode's last step (also used at the loop's limit)."""
        assert self.task is not None and self.sandbox is not None
        patch = await self.diff()
        if not patch.strip() and not self.grade_empty_patch:
            empty = {"resolved": False, "reward": 0.0, "graded": False, "model_patch": ""}
            return list(obs or []), 0.0, True, False, {"success": False, "report": empty}
        report = await grade(
            self.task,
            patch,
            self.repo_env(self.task),
            sandbox_kind=self.sandbox_kind,
            sandbox_options={k: v for k, v in self.sandbox_options.items() if k != "env"},
            timeout_s=self.grade_timeout_s,
            partial_credit=self.partial_credit,
            name_prefix=self.sandbox_prefix + "grade-",
        )
        info = {
            "success": report.resolved,
            "report": {**report.to_dict(), "model_patch": patch},
        }
        return list(obs or []), report.reward, True, False, info

    async def aclose(self) -> None:
        await self._close_sandbox()

    async def _close_sandbox(self) -> None:
        sb, self.sandbox = self.sandbox, None
        await self._close(sb)

    @staticmethod
    async def _close(sb: Sandbox | None) -> None:
        if sb is not None:
            with contextlib.suppress(SandboxError):  # the backend's sweep removes what is left
                await sb.close()


def select(
    tasks: list[SWETask],
    *,
    families: list[str] | None = None,
    repos: list[str] | None = None,
    bug_pattern: str = "",
) -> list[SWETask]:
    """The tasks of a curriculum (see ``SWEEnv.__init__``); an empty result is a ConfigError
    that says how many tasks each filter kept."""
    from envs.swe.mutate import FAMILIES

    unknown = sorted(set(families or ()) - set(FAMILIES))
    if unknown:
        raise ConfigError(
            f"swe/Repo-v0: unknown mutation families {unknown}; families must be some of "
            f"{', '.join(FAMILIES)}"
        )
    try:
        pattern = re.compile(bug_pattern) if bug_pattern else None
    except re.error as e:
        raise ConfigError(f"swe/Repo-v0: bug_pattern {bug_pattern!r} is not a regex: {e}") from None
    kept, counts = list(tasks), [f"{len(tasks)} tasks"]
    if families is not None:
        kept = [t for t in kept if t.metadata.get("family") in families]
        counts.append(f"{len(kept)} of families {list(families)}")
    if repos is not None:
        kept = [t for t in kept if t.repo in repos]
        counts.append(f"{len(kept)} of repos {list(repos)}")
    if pattern is not None:
        kept = [t for t in kept if any(pattern.search(ln) for ln in _removed_lines(t.patch))]
        counts.append(f"{len(kept)} whose gold patch removes a line matching {bug_pattern!r}")
    if not kept:
        raise ConfigError(
            f"swe/Repo-v0: the curriculum keeps no task ({' -> '.join(counts)}); widen "
            "families, repos or bug_pattern"
        )
    return kept


def _removed_lines(patch: str) -> list[str]:
    return [ln[1:] for ln in patch.splitlines() if ln.startswith("-") and not ln.startswith("---")]
