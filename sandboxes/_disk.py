"""A size-capped filesystem for a sandbox's writable space (workspace and tmp).

    await make_home(home, disk_mb=2048)   # home/ is now an ext4 of 2 GiB (a sparse image)
    await remove_home(home)               # unmount, delete the image and the directory

The image ``{home}.img`` (sparse: it takes the space written, at most ``disk_mb``) lives
next to ``home``, root-only, outside anything a sandbox sees; it is loop-mounted on ``home``
with nosuid,nodev, no journal and no reserved blocks, so a sandbox can write ``disk_mb`` and
then gets ENOSPC. Needs root, ``mkfs.ext4`` and loop devices. ``disk_mb=0`` makes ``home``
a plain directory on the host filesystem (no cap beyond the per-file size limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from agentrl.errors import SandboxError
from sandboxes._host import run_checked

NO_SPACE = "No space left on device"


def image_of(home: Path) -> Path:
    return home.with_name(home.name + ".img")


async def make_home(home: Path, disk_mb: int) -> None:
    """Create ``home`` (mode 0755), capped at ``disk_mb`` MiB when it is > 0."""
    home.mkdir(mode=0o755)
    if disk_mb <= 0:
        return
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        home.rmdir()
        raise SandboxError(f"disk_mb={disk_mb} needs root and mkfs.ext4 (e2fsprogs) to make "
                           "a capped filesystem; set disk_mb=0 for none")  # fmt: skip
    img = image_of(home)
    try:
        fd = os.open(img, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, disk_mb << 20)
        os.close(fd)
        await run_checked(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                           "-E", "lazy_itable_init=1,nodiscard", str(img)],
                          what="making the sandbox's capped filesystem")  # fmt: skip
        await run_checked(["mount", "-o", "loop,nosuid,nodev", str(img), str(home)],
                          what=f"mounting the sandbox's capped filesystem (disk_mb={disk_mb})")  # fmt: skip
        home.chmod(0o755)
        with contextlib.suppress(OSError):
            (home / "lost+found").rmdir()
    except BaseException:
        await remove_home(home)
        raise


async def remove_home(home: Path) -> None:
    """Unmount (lazily if still busy), then delete the directory and its image."""
    if os.path.ismount(home):
        p = await asyncio.create_subprocess_exec("umount", str(home),
                                                 stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
        if await p.wait() != 0:
            p = await asyncio.create_subprocess_exec("umount", "-l", str(home),
                                                     stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
            await p.wait()
    if not os.path.ismount(home):
        await asyncio.to_thread(shutil.rmtree, home, True)
    with contextlib.suppress(FileNotFoundError):
        image_of(home).unlink()


def explain_no_space(message: str, disk_mb: int) -> str:
    """``message`` plus the cap, when a write failed for lack of space."""
    if NO_SPACE in message and disk_mb > 0:
        return (f"{message} (the sandbox's workspace and /tmp hold at most disk_mb={disk_mb} "
                "MiB together; delete files or raise disk_mb)")  # fmt: skip
    return message
