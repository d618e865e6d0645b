"""Hostile file tricks against every backend: races and symlinks aimed at what the host does
with sandbox paths (snapshots, file routes, close). Part of the hostile suite (see
docs/guides/sandboxes.md, "Threat model").

Each attack plants a canary in a root-only host directory and fails if the canary shows up in
anything the sandbox (or the host caller) gets back.
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import textwrap
from pathlib import Path

import pytest

from agentrl.errors import SandboxError
from agentrl.sandbox import Sandbox
from tests.sandboxes.conftest import MakeSandbox, read_until

CANARY = "host-canary-7f3a9c"

# Inside the sandbox: wait until the host opens directory `d` (inotify IN_OPEN), then swap `d`
# with `s`, a symlink to a root-only host directory (renameat2 RENAME_EXCHANGE, atomic). A copy
# that lists `d` and then opens `d/<name>` by path, as root, now reads the host's file.
SWAP = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    os.chdir(sys.argv[1])
    fd = libc.inotify_init()
    libc.inotify_add_watch(fd, b"d", 0x20)  # IN_OPEN
    print("armed", flush=True)
    os.read(fd, 4096)
    libc.renameat2(-100, b"d", -100, b"s", 2)  # AT_FDCWD, RENAME_EXCHANGE
    print("swapped", flush=True)
    sys.stdin.read()
    """
)
# `d` holds many files listed before `secret.txt`, so the copy is still inside `d` after the swap
LAYOUT = (
    "rm -rf d s; mkdir d; for i in $(seq 1 50); do echo pad > d/p$i; done; "
    "echo decoy > d/secret.txt; ln -s {target} s"
)


def _host_canary_dir(tmp_path: Path) -> Path:
    """A root-only host directory holding ``secret.txt`` with the canary."""
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    (target / "secret.txt").write_text(CANARY)
    (target / "secret.txt").chmod(0o600)
    for i in range(1, 51):  # the names the sandbox's `d` holds: every path the copy opens exists
        (target / f"p{i}").write_text("pad\n")
    return target


async def _leaked(sb: Sandbox) -> bool:
    r = await sb.exec(f"grep -rl {CANARY} . 2>/dev/null; true", timeout_s=30)
    home = getattr(sb, "home", None)
    host_side = False
    if home is not None:  # also look at the host copy directly (as root)
        for root, _, files in os.walk(Path(home) / "ws"):
            for f in files:
                p = Path(root) / f
                if not p.is_symlink() and CANARY.encode() in p.read_bytes():
                    host_side = True
    return bool(r.stdout.strip()) or host_side


async def test_snapshot_never_copies_host_files_through_a_swapped_dir(
    make: MakeSandbox, tmp_path: Path
) -> None:
    target = _host_canary_dir(tmp_path)
    sb = await make()
    await sb.write_file("swap.py", SWAP)
    leaks, swapped, refused = 0, 0, 0
    for _ in range(20):
        r = await sb.exec(LAYOUT.format(target=target), timeout_s=30)
        assert r.ok, r.stderr
        attacker = await sb.start_process(["python3", "swap.py", sb.workdir])
        try:
            assert b"armed" in await read_until(attacker, b"armed")
            try:
                snap = await sb.snapshot()
            except SandboxError:  # the copy saw the workspace change under it, and gave up
                refused += 1
                continue
            try:
                leaks += await _leaked(snap)
            finally:
                await snap.close()
            await attacker.write(b"")
            with_swap = await asyncio.wait_for(read_until(attacker, b"swapped", 2.0), 3.0)
            swapped += b"swapped" in with_swap
        except TimeoutError:
            pass  # the snapshot never opened `d` (a copy that does not walk paths): no swap
        finally:
            await attacker.kill()
    assert leaks == 0, (
        f"{leaks} of 20 snapshots held the host's root-only file ({swapped} swaps, {refused} copies refused)"
    )
    assert CANARY not in (await sb.exec("cat d/secret.txt s/secret.txt", timeout_s=10)).stdout


async def test_symlinks_never_redirect_file_routes(make: MakeSandbox, tmp_path: Path) -> None:
    """read_file, write_file, upload and download through links to host paths."""
    target = _host_canary_dir(tmp_path)
    outside = tmp_path / "writable-by-root"
    outside.mkdir()
    sb = await make()
    await sb.exec(
        f"ln -s {target}/secret.txt f; ln -s {target} d; ln -s {outside} w; "
        f"ln -s {outside}/new.txt wf; mkdir tree; ln -s {target}/secret.txt tree/link; "
        f"ln -s ../.. tree/up",
        timeout_s=10,
    )
    for path in ("f", "d/secret.txt"):
        with pytest.raises((FileNotFoundError, PermissionError)):
            await sb.read_file(path)
    for path in ("w/new.txt", "wf", "d/secret.txt"):  # writes land inside the sandbox or fail
        with pytest.raises(SandboxError):
            await sb.write_file(path, "pwned")
    src = tmp_path / "src.txt"
    src.write_text("upload")
    for path in ("w/up.txt", "wf"):
        with pytest.raises(SandboxError):
            await sb.upload(src, path)
    assert list(outside.iterdir()) == []
    assert (target / "secret.txt").read_text() == CANARY
    down = tmp_path / "down"
    down.mkdir()
    for path in ("f", "d", "tree"):
        try:
            await sb.download(path, down / path)
        except SandboxError:
            continue
        for root, _, files in os.walk(down):
            for f in files:
                p = Path(root) / f
                assert p.is_symlink() or CANARY not in p.read_text(errors="replace")
    for p in down.rglob("*"):  # nothing downloaded points out of the download
        if p.is_symlink():
            assert not os.readlink(p).startswith("/")
            assert (p.parent / os.readlink(p)).resolve().is_relative_to(down.resolve())


async def test_download_refuses_a_tar_that_writes_through_its_own_links(
    make: MakeSandbox, tmp_path: Path
) -> None:
    """A sandbox controls the tree that ``download`` archives; links made to escape the
    extraction directory (directly or in a chain) are refused or stay inside it."""
    sb = await make()
    outside = tmp_path / "outside"
    outside.mkdir()
    # a chain of in-tree links whose last hop climbs out, then a file written through it
    await sb.exec(
        "mkdir -p t/a/b && ln -s b t/a/l1 && ln -s ../../../../../../.. t/a/b/esc && "
        "ln -s /tmp t/abs",
        timeout_s=10,
    )
    dest = tmp_path / "dest" / "t"
    dest.parent.mkdir()
    with pytest.raises(SandboxError, match="refusing"):
        await sb.download("t", dest)
    assert not dest.exists() and list(outside.iterdir()) == []
    await sb.exec(
        "rm t/a/b/esc t/abs && ln -s ../b/../.. t/a/b/up && ln -s l1/c t/a/ok", timeout_s=10
    )
    with pytest.raises(SandboxError, match="leaves the tree"):  # `b/..` climbs after descending
        await sb.download("t", dest)
    await sb.exec("rm t/a/b/up", timeout_s=10)
    await sb.download("t", dest)  # in-tree links are kept
    assert os.readlink(dest / "a" / "ok") == "l1/c" and os.readlink(dest / "a" / "l1") == "b"
    # a hand-made hostile archive, extracted the way download extracts one
    from sandboxes import _files

    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        link = tarfile.TarInfo("x/l")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        data = b"pwned"
        f = tarfile.TarInfo("x/l/pwned.txt")
        f.size = len(data)
        tar.addfile(f, io.BytesIO(data))
    with pytest.raises(SandboxError), open(evil, "rb") as f:
        _files.extract_tar(f, tmp_path / "out")
    assert list(outside.iterdir()) == []
