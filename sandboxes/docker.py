"""Docker sandboxes: one container per sandbox, commands run with ``docker exec``.

    sb = await make_sandbox("docker", image="agentrl/bookworm-python:latest")
    r = await sb.exec("python3 -c 'print(1)'", timeout_s=10)

The container runs ``sleep infinity`` under Docker's init, with: no network
(``network_mode="none"``; ``allow_network=True`` gives the host network), a read-only root
filesystem, a tmpfs ``/tmp``, the workspace bind-mounted from a host dir (``{root_dir}/{name}/ws``,
so ``template_dir`` and ``snapshot()`` copy with ``cp --reflink=auto`` like the local backend),
commands as an unprivileged user (the init and ``sleep`` as root, so commands cannot signal
them and stop the container), all capabilities dropped, ``no-new-privileges``, memory/pids/CPU limits
and CPU-time/file-size/open-files ulimits. ``runtime="runsc"`` runs it under gVisor.

Each ``exec`` runs ``timeout --kill-after=2 <t> argv`` inside (exit 124 = timed out), carries a
marker in its environment, and afterwards its leftover processes are killed on the host, so
background processes do not outlive an ``exec``, as in the local backend. That host-side
clean-up, interrupts and OOM detection need the daemon on this host; with a remote daemon they
are skipped and leftovers live until ``close()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

import psutil

from agentrl.errors import ConfigError, SandboxError
from agentrl.sandbox import ExecResult, OutputCap, SweepReport, new_name
from sandboxes import _cgroup
from sandboxes._disk import (
    DEFAULT_DISK_MB,
    drop_stale_spares,
    make_home,
    prepare_spare,
    remove_home,
)
from sandboxes._docker_exec import (
    REAPER_ENV,
    DockerProcess,
    in_container,
    in_thread,
    kill_exec_tree,
    kill_orphans,
    raw_socket,
    reaped,
    run_exec,
)
from sandboxes._files import ExecFileOps
from sandboxes._host import MARKER, copy_tree, kill_marked, root_dir

logger = logging.getLogger(__name__)

LABEL = "agentrl.sandbox"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _client(base_url: str) -> Any:
    try:
        import docker
    except ImportError:
        raise SandboxError(
            "the docker sandbox needs the Docker SDK: pip install 'agentrl[docker]'"
        ) from None
    client = None
    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        client.ping()
    except Exception as e:
        if client is not None:
            client.close()
        raise SandboxError(
            f"cannot reach the Docker engine ({e}); start dockerd (scripts/install-sandbox-deps.sh "
            "--docker installs it) or set base_url"
        ) from None
    return client


class DockerSandbox(ExecFileOps):
    kind = "docker"

    @dataclass(kw_only=True)
    class Config:
        image: str = "agentrl/bookworm-python:latest"
        """Image to run; build the default one with scripts/install-sandbox-deps.sh --image."""
        runtime: str = ""
        """OCI runtime, e.g. "runsc" (gVisor); "" = the daemon's default (runc)."""
        allow_network: bool = False
        network: str = ""
        """Docker network to join; "" means none (or host when allow_network)."""
        root_dir: str = ""
        template_dir: str = ""
        user: str = "65534:65534"
        memory_mb: int = 2048
        pids_max: int = 256
        cpus: float = 1.0
        cpu_time_s: int = 600
        file_size_mb: int = 1024
        nofile: int = 1024
        tmp_size_mb: int = 512
        """/tmp is a tmpfs of this size (memory, not disk)."""
        disk_mb: int = DEFAULT_DISK_MB
        """Cap on the workspace: it lives on its own ext4 of this size (a sparse, loop-mounted
        image, ``_disk.py``; needs root and loop devices, else a WARNING and no cap). 0: no
        cap, it shares root_dir's disk. (``/tmp`` is capped by ``tmp_size_mb``.)"""
        exec_timeout_s: float = 120.0
        max_output_bytes: int = 64 * 1024
        max_file_bytes: int = 64 * 1024 * 1024
        env: dict[str, str] = field(default_factory=dict)
        base_url: str = ""
        """Docker engine URL; "" reads DOCKER_HOST or uses the local socket."""

    def __init__(self, config: Config, name: str, home: Path, client: Any, container: Any) -> None:
        self.config = config
        self.max_file_bytes = config.max_file_bytes
        self.disk_mb = config.disk_mb
        self.name = name
        self.home = home
        self.client = client
        self.container = container
        self.workdir = "/workspace"
        self._serial = 0
        self._procs: set[DockerProcess] = set()
        self._closed = False
        self._init = _init_pids(container)  # (init, main process) host pids, local daemon only

    @classmethod
    async def create(cls, config: object, *, name: str | None = None) -> Self:
        if not isinstance(config, DockerSandbox.Config):
            raise ConfigError(
                f"DockerSandbox expects DockerSandbox.Config, got {type(config).__name__}"
            )
        name = name or new_name()
        client = await in_thread(_client, config.base_url)
        home = root_dir(config.root_dir) / name
        try:
            disk_mb = await make_home(home, config.disk_mb)
        except BaseException:
            with contextlib.suppress(Exception):
                client.close()
            raise
        try:
            (home / "ws").mkdir()
            uid = _uid(config.user)
            if config.template_dir:
                await copy_tree(Path(config.template_dir), home / "ws", uid)
            if uid is not None:
                os.chown(home / "ws", uid, uid)
            container = await in_thread(_run_container, client, config, name, home / "ws")
            await in_thread(container.reload)  # State.Pid: the init's host pid
        except BaseException:
            await asyncio.shield(remove_home(home))
            with contextlib.suppress(Exception):
                client.close()
            raise
        sb = cls(config, name, home, client, container)
        sb.disk_mb = disk_mb  # 0 when no cap could be made here (make_home warned)
        prepare_spare(disk_mb)  # the next sandbox's capped filesystem, in the background
        return sb

    # --- commands --------------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._run(argv, timeout_s=timeout_s, cwd=cwd, env=env, stdin=data)

    async def _run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        stdout_file: IO[bytes] | None = None,
    ) -> ExecResult:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        loop = asyncio.get_running_loop()
        timeout = self.config.exec_timeout_s if timeout_s is None else timeout_s
        out = stdout_file or OutputCap(self.config.max_output_bytes)
        err = OutputCap(self.config.max_output_bytes)
        token = self._token()
        # bare (a reaper costs a python3 start per exec, ~1.8x the exec's latency): what the
        # command orphans goes to the container's init, and _reap kills init's orphans
        wrapped = ["timeout", "--kill-after=2", f"{timeout:.3f}", *argv]
        started: concurrent.futures.Future[str] = concurrent.futures.Future()
        oom_before = self._oom_kills()
        start = loop.time()
        task = asyncio.ensure_future(
            in_thread(
                run_exec,
                self.client.api,
                self.container.id,
                wrapped,
                user=self.config.user,
                workdir=self.resolve(cwd or self.workdir),
                env=self._env(env, token),
                stdin=stdin,
                out=out,
                err=err,
                started=started,
            )
        )
        try:
            async with asyncio.timeout(timeout + 10.0):  # backstop if `timeout` itself hangs
                outcome = await asyncio.shield(task)
            code = outcome.exit_code if outcome.exit_code is not None else -1
        except TimeoutError:
            code = 124
        finally:
            await asyncio.shield(self._reap(task, started, token))
        timed_out = code == 124
        return ExecResult(
            exit_code=-1 if timed_out else code,
            stdout=out.text() if isinstance(out, OutputCap) else "",
            stderr=err.text(),
            timed_out=timed_out,
            duration_s=loop.time() - start,
            truncated=(isinstance(out, OutputCap) and out.truncated) or err.truncated,
            oom_killed=self._oom_kills() > oom_before,
        )

    async def _reap(
        self, task: asyncio.Future[Any], started: concurrent.futures.Future[str], token: str
    ) -> None:
        """Kill what the exec left behind; make sure its worker thread finishes."""
        if started.done() and not task.done():
            await in_thread(kill_exec_tree, self.client.api, started.result())
        await in_thread(kill_marked, token, exact=True)
        if self._init is not None:  # orphans of a reaper the command killed
            await in_thread(kill_orphans, self._init[0], {self._init[1]}, self.container.id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                await task

    def _token(self) -> str:
        self._serial += 1
        return f"{self.name}/{self._serial}"

    def _env(self, env: Mapping[str, str] | None, token: str) -> dict[str, str]:
        base = {
            "PATH": _PATH,
            "HOME": self.workdir,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp",
            MARKER: token,
        }
        return {**base, **self.config.env, **(env or {}), **REAPER_ENV}

    def _oom_kills(self) -> int:
        path = Path(f"/sys/fs/cgroup/memory/docker/{self.container.id}/memory.oom_control")
        try:
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    # --- processes, snapshot, close --------------------------------------------------------------
    async def start_process(
        self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> DockerProcess:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        api = self.client.api
        exec_id = (
            await in_thread(
                api.exec_create,
                self.container.id,
                reaped(argv),
                stdin=True,
                user=self.config.user,
                workdir=self.resolve(cwd or self.workdir),
                environment=self._env(env, self._token()),
            )
        )["Id"]
        sock = raw_socket(await in_thread(api.exec_start, exec_id, socket=True))
        proc = DockerProcess(api, exec_id, sock)
        self._procs.add(proc)
        return proc

    async def pids_in_use(self) -> tuple[int, int] | None:
        """From the container's pids cgroup on this host (None with a remote daemon)."""
        cid = self.container.id
        for d in (f"pids/docker/{cid}", f"system.slice/docker-{cid}.scope", f"docker/{cid}"):
            if (usage := _cgroup.read_pids(_cgroup.ROOT / d)) is not None:
                return usage
        return None

    async def snapshot(self) -> DockerSandbox:
        """A new sandbox whose workspace is a copy (``cp --reflink=auto``) of this one's.

        The copy runs in a throwaway container of the same image, user and limits, with this
        workspace read-only at /src and the new one at /dst, never as root on host paths: a
        link the sandbox swaps in mid-copy resolves inside that container."""
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        cfg = dataclasses.replace(self.config, template_dir="")
        snap = await DockerSandbox.create(cfg, name=new_name(self.name + "-"))
        try:
            await in_thread(
                _copy_in_container,
                self.client,
                self.config,
                f"{snap.name}-copy",
                self.home / "ws",
                snap.home / "ws",
            )
        except BaseException:
            await asyncio.shield(snap.close())
            raise
        return snap

    async def is_alive(self) -> bool:
        if self._closed:
            return False
        try:
            await in_thread(self.container.reload)
        except Exception:
            return False
        return self.container.status == "running" and await super().is_alive()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in list(self._procs):
            await p.kill()
        try:
            await in_thread(self.container.remove, force=True)
        except Exception as e:  # already gone, or the daemon died: sweep() finds it later
            logger.warning("removing container %s failed: %s", self.name, e)
        await remove_home(self.home)
        with contextlib.suppress(Exception):  # its connection pool: sockets to the engine
            await in_thread(self.client.close)

    @classmethod
    async def sweep(cls, prefix: str, config: object | None = None) -> SweepReport:
        cfg = config if isinstance(config, DockerSandbox.Config) else DockerSandbox.Config()
        client = await in_thread(_client, cfg.base_url)
        try:
            found = await in_thread(client.containers.list, all=True, filters={"label": LABEL})
            victims = [c for c in found if c.labels.get(LABEL, "").startswith(prefix)]
            for c in victims:
                await in_thread(c.remove, force=True)
        finally:
            await in_thread(client.close)
        root = root_dir(cfg.root_dir)
        dirs = [d for d in root.iterdir() if d.name.startswith(prefix) and d.is_dir()]
        for d in dirs:
            await remove_home(d)
        for img in root.glob(f"{prefix}*.img"):  # images whose mount point is gone
            img.unlink(missing_ok=True)
        await asyncio.to_thread(drop_stale_spares)
        return SweepReport(containers=len(victims), dirs=len(dirs))


def _init_pids(container: Any) -> tuple[int, int] | None:
    """Host pids of the container's init and of its main process (the oldest child), when
    the daemon runs on this machine; None otherwise."""
    init = int(container.attrs.get("State", {}).get("Pid") or 0)
    if init <= 0 or not in_container(init, container.id):
        return None
    for _ in range(200):
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(init).children()
            if kids:
                return init, min(kids, key=lambda p: p.create_time()).pid
        time.sleep(0.005)
    return None


def _uid(user: str) -> int | None:
    head = user.split(":", 1)[0]
    return int(head) if head.isdigit() and os.geteuid() == 0 else None


def _copy_in_container(
    client: Any, c: DockerSandbox.Config, name: str, src: Path, dst: Path
) -> None:
    """``cp -a /src/. /dst/`` in a container as ``c.user``; ``SandboxError`` if it fails."""
    from docker.types import Mount

    cp = ["cp", "-a", "--reflink=auto", "--no-preserve=ownership", "/src/.", "/dst/"]
    try:
        box = client.containers.run(
            c.image,
            cp,
            name=name,
            detach=True,
            network_mode="none",
            runtime=c.runtime or None,
            mem_limit=f"{c.memory_mb}m",
            memswap_limit=f"{c.memory_mb}m",
            pids_limit=16,
            read_only=True,
            user=c.user,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mounts=[
                Mount(target="/src", source=str(src), type="bind", read_only=True),
                Mount(target="/dst", source=str(dst), type="bind"),
            ],
            labels={LABEL: name},
        )
    except Exception as e:
        raise SandboxError(f"starting the copy container from {c.image!r} failed: {e}") from None
    try:
        code = box.wait(timeout=3600).get("StatusCode", -1)
        if code != 0:
            err = box.logs(stdout=False, stderr=True).decode(errors="replace").strip()[:2000]
            raise SandboxError(f"copying the workspace failed (exit {code}): {err}")
    finally:
        with contextlib.suppress(Exception):
            box.remove(force=True)


def _run_container(client: Any, c: DockerSandbox.Config, name: str, ws: Path) -> Any:
    from docker.types import Mount, Ulimit

    limit = [
        ("cpu", c.cpu_time_s),
        ("fsize", c.file_size_mb << 20),
        ("nofile", c.nofile),
        ("core", 0),
    ]
    network = c.network or ("host" if c.allow_network else "none")
    try:
        return client.containers.run(
            c.image,
            ["sleep", "infinity"],
            name=name,
            detach=True,
            init=True,
            network_mode=network,
            runtime=c.runtime or None,
            hostname=None if network == "host" else "sandbox",
            mem_limit=f"{c.memory_mb}m",
            memswap_limit=f"{c.memory_mb}m",
            pids_limit=c.pids_max,
            nano_cpus=int(c.cpus * 1e9),
            ulimits=[Ulimit(name=k, soft=v, hard=v) for k, v in limit],
            read_only=True,
            tmpfs={"/tmp": f"size={c.tmp_size_mb}m,mode=1777"},
            mounts=[Mount(target="/workspace", source=str(ws), type="bind")],
            user="0:0",
            working_dir="/workspace",
            cap_drop=["ALL"],  # execs run as c.user
            security_opt=["no-new-privileges"],
            labels={LABEL: name},
            environment={"PATH": _PATH},
        )
    except Exception as e:
        raise SandboxError(f"starting a container from {c.image!r} failed: {e}") from None
