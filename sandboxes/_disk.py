"""A size-capped filesystem for a sandbox's writable space (workspace and tmp).

    cap = await make_home(home, disk_mb=4096)   # home/ is an ext4 of 4 GiB; cap == 4096
    prepare_spare(cap)                          # once the sandbox is up: the next one's
    await remove_home(home)                     # unmount, delete the image and the directory

``{home}.img`` is a sparse ext4 image (it takes the space written, at most ``disk_mb``)
next to ``home`` (when on the same filesystem as the spares), root-only, outside anything a
sandbox sees. It is mounted on ``home``
nosuid,nodev, without a journal or reserved blocks, so a sandbox can write ``disk_mb`` (less
ext4's metadata) and then gets ENOSPC; its inode count caps the number of files too.

How one is made, without a subprocess: the first of a size formats a template image
(``mkfs.ext4``, then ``debugfs`` drops ``lost+found``; ~35 ms), kept for every process of the
machine in ``{tempdir}/agentrl-disk-templates/`` (root-only). Once a sandbox is up, its
backend asks for the next one (``prepare_spare``) and a background thread makes a *spare*:
the template's ~1 MiB of metadata copied (holes stay holes), the copy attached to a free loop device with one ioctl (``LOOP_CONFIGURE``, autoclear: the device
frees itself once nothing uses it), mounted *detached* with the new mount API (fsopen,
fsconfig, fsmount: a mount attached nowhere, held by a descriptor, gone with it even if the
process is killed) and warmed (one mkdir), so that the kernel's waits on the loop device's
worker (the superblock write at mount, the bitmaps' first reads: ~1 ms on a quiet host, ~8
ms at load 5) happen off the create path. ``make_home`` then attaches that mount on ``home``
(``move_mount``, ~0.1 ms; the whole call ~0.5 ms) and renames the image next to it. Without a
spare (the first home of a size, or a burst of creates) the steps run in a worker thread
(~7-20 ms); on kernels before 5.2 spares are attached only and mounted at create (~1-8 ms).
A forked child forgets its parent's spares; ``drop_stale_spares`` (sweeps run it) deletes the
images that killed processes left.

Removing: ``EXT4_IOC_SHUTDOWN`` first, so unmounting throws away what the sandbox left dirty
instead of writing it through the loop device, then umount, and the image is renamed away and
deleted in the background (the unlink waits for pages in writeback). The earlier
``mkfs.ext4`` + ``mount -o loop`` per home cost ~70 ms to make and ~70 ms to remove.

Needs root, ``mkfs.ext4`` (e2fsprogs) and loop devices (``/dev/loop-control``). Where they are
missing, or the first mount fails (a container without loop devices, a kernel that refuses
them), ``make_home`` logs one WARNING and makes a plain directory (no cap beyond the per-file
size limit), or raises ``SandboxError`` when ``required``. ``disk_mb=0`` asks for no cap.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import SandboxError

logger = logging.getLogger(__name__)

NO_SPACE = "No space left on device"
DEFAULT_DISK_MB = 4096
"""The backends' default cap (``disk_mb``): room for a repository, its build and its test
runs; the image is sparse, so a sandbox costs the host only what it writes."""
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_MS_NOSUID, _MS_NODEV = 2, 4
# the new mount API (Linux >= 5.2; the same numbers on every architecture)
_NR_MOVE_MOUNT, _NR_FSOPEN, _NR_FSCONFIG, _NR_FSMOUNT = 429, 430, 431, 432
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_FLAG, _FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 0, 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 4, -100
_MNT_DETACH = 2
_EXT4_IOC_SHUTDOWN, _EXT4_GOING_FLAGS_NOLOGFLUSH = 0x8004587D, 2
_TEMPLATE = "ext4-v2-{mb}M.img"
_MKFS = [
    "mkfs.ext4",
    "-q",
    "-F",
    "-m",
    "0",
    "-O",
    "^has_journal,^resize_inode",
    "-E",
    "lazy_itable_init=1,nodiscard",
]

_lock = threading.Lock()  # template making and the "did a cap ever work" state
_state: dict[str, str | bool] = {}  # "unavailable": why; "worked": a cap was made; ...
_warned: set[str] = set()
_libc: list[ctypes.CDLL] = []


def image_of(home: Path) -> Path:
    return home.with_name(home.name + ".img")


def unavailable() -> str | None:
    """Why a capped home cannot be made here, or None (checked without trying a mount)."""
    why = _state.get("unavailable")
    if isinstance(why, str):
        return why
    if os.geteuid() != 0:
        return "a capped filesystem needs root (to attach a loop device and mount)"
    if shutil.which("mkfs.ext4") is None:
        return "a capped filesystem needs mkfs.ext4 (e2fsprogs)"
    if not os.path.exists("/dev/loop-control"):
        return "a capped filesystem needs loop devices (/dev/loop-control is missing)"
    return None


async def make_home(home: Path, disk_mb: int, *, required: bool = False) -> int:
    """Create ``home`` (mode 0755), on its own filesystem of ``disk_mb`` MiB when > 0.

    Returns the cap in force: ``disk_mb``, or 0 when none was asked for or none can be made
    here (then one WARNING says why; ``required`` raises ``SandboxError`` instead)."""
    home.mkdir(mode=0o755)
    if disk_mb <= 0:
        return 0
    why = unavailable()
    if why is None:
        try:
            spare = _take_spare(disk_mb)
            if spare is None or not _use_spare(home, disk_mb, spare):
                made = asyncio.ensure_future(asyncio.to_thread(_make_capped, home, disk_mb))
                try:
                    await asyncio.shield(made)
                except asyncio.CancelledError:  # let the thread finish before cleaning up
                    await asyncio.wait([made])
                    if not made.cancelled():
                        made.exception()  # retrieved: the cancellation is what we report
                    raise
            return disk_mb
        except BaseException as e:
            await asyncio.shield(remove_home(home))
            why = _first_failure(e)
            if why is None:  # caps worked here before: a real failure of this one
                raise
        home.mkdir(mode=0o755)
    if required:
        home.rmdir()
        raise SandboxError(
            f"disk_mb={disk_mb}: {why}; set disk_mb=0 for no cap, or "
            "require_isolation=False to run without one"
        )
    msg = (
        f"sandbox disk cap disk_mb={disk_mb} is off: {why}. The workspace and /tmp share "
        "root_dir's disk (each file still capped by file_size_mb); set disk_mb=0 to "
        "silence this, or require_isolation=True to refuse"
    )
    if msg not in _warned:
        _warned.add(msg)
        logger.warning(msg)
    return 0


def _first_failure(e: BaseException) -> str | None:
    """The reason caps are unavailable here, if ``e`` came before any cap ever worked."""
    if not isinstance(e, OSError | SandboxError):
        return None
    with _lock:
        if _state.get("worked"):
            return None
        why = f"the first capped filesystem could not be made ({e})"
        _state["unavailable"] = why
        return why


@dataclass(slots=True)
class _Spare:
    """A fresh capped filesystem made ahead: its image attached to ``dev`` (autoclear) and,
    where the kernel has the new mount API, mounted already as a detached mount (``fd``, not
    attached anywhere: it goes away with the descriptor, even if this process is killed);
    else ``fd`` holds the loop device until a create mounts it."""

    img: Path
    dev: str
    fd: int
    detached: bool = False


def _make_capped(home: Path, disk_mb: int) -> None:
    """Copy the template, attach the copy, mount it on ``home`` (no spare was ready)."""
    img = image_of(home)
    _sparse_copy(_template(disk_mb), img)
    dev, fd = _attach(img)
    try:
        _mount(dev, home)
    finally:
        os.close(fd)  # autoclear: the device frees itself when the mount goes
    _finish(home, disk_mb)


def _use_spare(home: Path, disk_mb: int, spare: _Spare) -> bool:
    """Put ``spare`` on ``home`` without I/O through the loop device where it can: attach its
    detached mount there (``move_mount``, ~0.1 ms), else mount it. False (the spare
    discarded) if that fails."""
    try:
        if spare.detached:
            _syscall(
                _NR_MOVE_MOUNT,
                spare.fd,
                b"",
                _AT_FDCWD,
                str(home).encode(),
                _MOVE_MOUNT_F_EMPTY_PATH,
            )
        else:
            _mount(spare.dev, home)
    except OSError as e:
        logger.debug("%s; making one now", e)
        _discard(spare)
        return False
    os.close(spare.fd)
    with contextlib.suppress(OSError):  # next to home if it is on the same filesystem
        os.rename(spare.img, image_of(home))
    _finish(home, disk_mb)
    return True


def _fsmount(dev: str) -> int:
    """A detached mount of the ext4 on ``dev`` (fsopen, fsconfig, fsmount), as an fd."""
    fs = _syscall(_NR_FSOPEN, b"ext4", _FSOPEN_CLOEXEC)
    try:
        _syscall(_NR_FSCONFIG, fs, _FSCONFIG_SET_STRING, b"source", dev.encode(), 0)
        _syscall(_NR_FSCONFIG, fs, _FSCONFIG_SET_FLAG, b"noinit_itable", None, 0)
        _syscall(_NR_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        return _syscall(_NR_FSMOUNT, fs, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
    finally:
        os.close(fs)


def _syscall(nr: int, *args: object) -> int:
    fn = _lib().syscall
    fn.restype = ctypes.c_long
    r = int(fn(nr, *args))
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syscall {nr}: {os.strerror(err)}")
    return r


def _mount(dev: str, where: Path) -> None:
    if (
        _lib().mount(
            dev.encode(), str(where).encode(), b"ext4", _MS_NOSUID | _MS_NODEV, b"noinit_itable"
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mounting {dev} on {where}: {os.strerror(err)}")


def _finish(home: Path, disk_mb: int) -> None:
    with _lock:
        _state["worked"] = True
    home.chmod(0o755)
    with contextlib.suppress(OSError):  # the template has none, unless debugfs was missing
        (home / "lost+found").rmdir()


SPARES = 1
"""Spare filesystems kept ready per size (each holds a loop device while this process
lives)."""
_spares: dict[int, list[_Spare]] = {}
_preparing: set[int] = set()
_worker: list[ThreadPoolExecutor] = []
_pending: set[Future[object]] = set()  # queued or running on _worker, for settle()


def _take_spare(disk_mb: int) -> _Spare | None:
    with _lock:
        ready = _spares.get(disk_mb)
        return ready.pop() if ready else None


def prepare_spare(disk_mb: int) -> None:
    """Make a spare of ``disk_mb`` in the background, unless one is ready or on its way, or
    caps do not work here. The backends call it once a sandbox is up, not in ``make_home``:
    its CPU (~2-3 ms, with the kernel's) would compete with the rest of that create."""
    if disk_mb <= 0 or not _state.get("worked"):
        return
    with _lock:
        if (
            disk_mb in _preparing
            or len(_spares.get(disk_mb, ())) >= SPARES
            or _state.get("exiting")
        ):
            return
        _preparing.add(disk_mb)
    _background(_prepare, disk_mb)


def _background(fn: Callable[..., object], *args: object) -> None:
    """Run ``fn(*args)`` on this process's disk threads (started once, joined at exit)."""
    with _lock:
        if not _worker:
            _worker.append(ThreadPoolExecutor(2, thread_name_prefix="agentrl-disk"))
            atexit.register(_drop_spares)  # runs after the threads are joined
        future = _worker[0].submit(fn, *args)
        _pending.add(future)
    future.add_done_callback(_forget)


def _forget(future: Future[object]) -> None:
    with _lock:
        _pending.discard(future)


def settle(timeout_s: float = 60.0) -> bool:
    """Wait until the background work queued so far (spares being made, removed images being
    deleted) is done; False if some is still running after ``timeout_s``. Removal returns
    before its image is deleted (the unlink waits for writeback: ~30-50 ms each at load 6,
    seconds for a burst of hundreds on 2 busy cores); call this where "nothing left on disk"
    must hold now, e.g. a test's final check or before reporting disk use."""
    with _lock:
        pending = list(_pending)
    _done, not_done = wait(pending, timeout=timeout_s)
    return not not_done


def _prepare(disk_mb: int) -> None:
    """Copy, attach, and (with the new mount API) mount detached and warm a spare: a mount
    writes the superblock and a first mkdir reads the bitmaps, each a round trip through the
    loop device's worker thread, which a loaded host schedules late (~1 ms quiet, ~8 ms at
    load 5); done here, a create only attaches the mount."""
    img = template_dir() / f"spare-{os.getpid()}-{uuid.uuid4().hex[:10]}.img"
    spare = None
    try:
        _sparse_copy(_template(disk_mb), img)
        spare = _Spare(img, *_attach(img))
        if not _state.get("no_fsmount"):
            try:
                mfd = _fsmount(spare.dev)
            except OSError as e:  # an older kernel, or a filter that refuses it
                _state["no_fsmount"] = True
                logger.debug("no detached mounts here (%s): spares get mounted at create", e)
            else:
                os.close(spare.fd)  # the superblock holds the device now
                spare.fd, spare.detached = mfd, True
                os.mkdir(".warm", dir_fd=mfd)
                os.rmdir(".warm", dir_fd=mfd)
    except Exception as e:  # the next create makes its home itself, and reports failures
        logger.debug("making a spare capped filesystem failed: %s", e)
        if spare is not None:
            _discard(spare)
        img.unlink(missing_ok=True)
        with _lock:
            _preparing.discard(disk_mb)
        return
    with _lock:
        _preparing.discard(disk_mb)
        if not _state.get("exiting"):
            _spares.setdefault(disk_mb, []).append(spare)
            return
    _discard(spare)


def _discard(spare: _Spare) -> None:
    """Close the spare's descriptor (its detached mount, or its hold on the loop device: either
    way the device frees itself) and delete its image."""
    with contextlib.suppress(OSError):
        os.close(spare.fd)
    spare.img.unlink(missing_ok=True)


def _drop_spares() -> None:
    """At exit: unmount the spares, free their loop devices, delete their images."""
    with _lock:
        _state["exiting"] = True
        spares = [a for ready in _spares.values() for a in ready]
        _spares.clear()
    for spare in spares:
        _discard(spare)


def _after_fork_in_child() -> None:
    """A forked child must not take its parent's spares (two sandboxes on one filesystem):
    it forgets them (the parent keeps them, mounts included) and starts without any."""
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread
    for spare in [a for ready in _spares.values() for a in ready]:
        with contextlib.suppress(OSError):
            os.close(spare.fd)
    _spares.clear()
    _preparing.clear()
    _worker.clear()  # its thread does not exist in the child
    _pending.clear()  # nor do the parent's futures' threads: settle() must not wait on them


os.register_at_fork(after_in_child=_after_fork_in_child)


def drop_stale_spares() -> None:
    """Delete the spare and discarded images of processes that no longer exist (killed:
    their detached mounts and loop devices went with their descriptors)."""
    if not template_dir().is_dir():
        return
    for img in [*template_dir().glob("spare-*.img"), *template_dir().glob("trash-*.img")]:
        try:
            os.kill(int(img.name.split("-")[1]), 0)
        except ProcessLookupError:
            img.unlink(missing_ok=True)
        except (ValueError, IndexError, OSError):
            continue


def template_dir() -> Path:
    """Where the formatted empty images live (root-only; shared by this machine's runs)."""
    return Path(tempfile.gettempdir()) / "agentrl-disk-templates"


def _template(disk_mb: int) -> Path:
    """The formatted empty image of ``disk_mb``, made once (atomically)."""
    tpl = template_dir() / _TEMPLATE.format(mb=disk_mb)
    with _lock:
        # made again if it went away (a temp cleaner, or tempfile.tempdir changed): an image
        # copied into a missing directory would fail every new sandbox with ENOENT
        tpl.parent.mkdir(mode=0o700, exist_ok=True)
        if _state.get("swept") != str(tpl.parent):  # once per directory, per process
            _state["swept"] = str(tpl.parent)
            drop_stale_spares()
        if tpl.exists():
            return tpl
        tmp = tpl.with_name(f"{tpl.name}.{uuid.uuid4().hex[:8]}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, disk_mb << 20)
            os.close(fd)
            p = subprocess.run([*_MKFS, str(tmp)], capture_output=True, text=True, check=False)
            if p.returncode:
                raise SandboxError(f"mkfs.ext4 failed: {p.stderr.strip()[:2000]}")
            with contextlib.suppress(OSError):  # no lost+found to delete in every home
                subprocess.run(
                    ["debugfs", "-w", "-R", "rmdir lost+found", str(tmp)],
                    capture_output=True,
                    check=False,
                )
            os.replace(tmp, tpl)  # another process may have made one too: either is fine
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return tpl


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to a new root-only ``dst``, its data ranges only (holes stay holes)."""
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(s).st_size
            os.ftruncate(d, size)
            pos = 0
            while pos < size:
                try:
                    start = os.lseek(s, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # only a hole is left
                        break
                    raise
                end = os.lseek(s, start, os.SEEK_HOLE)
                _copy_range(s, d, start, end)
                pos = end
        finally:
            os.close(d)
    finally:
        os.close(s)


def _copy_range(s: int, d: int, start: int, end: int) -> None:
    while start < end:
        try:
            n = os.copy_file_range(s, d, end - start, start, start)
        except OSError as e:  # across filesystems (EXDEV) or not supported: read and write
            if e.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            n = os.pwrite(d, os.pread(s, min(end - start, 1 << 20), start), start)
        if n == 0:
            raise OSError(errno.EIO, "short copy of the disk template")
        start += n


def _attach(img: Path) -> tuple[str, int]:
    """A free loop device backed by ``img`` (autoclear); returns its path and an open fd."""
    backing = os.open(img, os.O_RDWR | os.O_CLOEXEC)
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        # struct loop_config: fd, block_size, struct loop_info64 (flags at byte 52), 8 reserved
        name = str(img).encode()[:63]  # what losetup shows
        info = struct.pack(
            "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, name, b"", b"", 0, 0
        )
        config = struct.pack("=II", backing, 0) + info + bytes(64)
        for _ in range(32):  # another process may take the free device first
            dev = f"/dev/loop{fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)}"
            fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, config)
                return dev, fd
            except OSError as e:
                os.close(fd)
                if e.errno != errno.EBUSY:
                    raise
        raise SandboxError("no free loop device after 32 tries")
    finally:
        os.close(ctl)
        os.close(backing)


def _lib() -> ctypes.CDLL:
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    return _libc[0]


async def remove_home(home: Path) -> None:
    """Unmount (detached if still busy), then delete the directory and its image."""
    await asyncio.to_thread(_remove, home)


def _remove(home: Path) -> None:
    backing = None
    if os.path.ismount(home):
        backing = backing_file(home)
        if backing is not None:  # ours: drop its dirty pages instead of writing them back
            _shut_down(home)
        if _lib().umount2(str(home).encode(), 0) != 0:
            _lib().umount2(str(home).encode(), _MNT_DETACH)
    if os.path.ismount(home):
        logger.warning("could not unmount %s; leaving it", home)
    else:
        shutil.rmtree(home, ignore_errors=True)
    _delete_soon(image_of(home))
    if backing is not None and backing.parent == template_dir():  # a spare not moved next to home
        _delete_soon(backing)


def _delete_soon(img: Path) -> None:
    """Rename ``img`` out of the way now, delete it in the background: the unlink waits for
    the image's pages in writeback (27-52 ms at load 6)."""
    trash = template_dir() / f"trash-{os.getpid()}-{uuid.uuid4().hex[:10]}.img"
    try:
        os.rename(img, trash)
    except FileNotFoundError:
        return
    except OSError:  # another filesystem: delete it now
        img.unlink(missing_ok=True)
        return
    _background(trash.unlink, True)


def _shut_down(home: Path) -> None:
    """EXT4_IOC_SHUTDOWN, NOLOGFLUSH: the filesystem is thrown away, so unmounting need not
    write what the sandbox left dirty through the loop device (50 MiB left dirty: remove
    280 -> 66 ms at load 6). Its processes are dead by now; the kernel logs one line."""
    with contextlib.suppress(OSError):
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)


def backing_file(home: Path) -> Path | None:
    """The image behind the loop device mounted on ``home`` (None if there is none)."""
    with contextlib.suppress(OSError, ValueError):
        dev = os.stat(home).st_dev
        if os.major(dev) == 7:  # loop devices
            text = Path(f"/sys/dev/block/7:{os.minor(dev)}/loop/backing_file").read_text()
            return Path(text.strip().removesuffix(" (deleted)"))
    return None


def explain_no_space(message: str, disk_mb: int) -> str:
    """``message`` plus the cap, when a write failed for lack of space."""
    if NO_SPACE in message and disk_mb > 0:
        return (
            f"{message} (the sandbox's workspace and /tmp hold at most disk_mb={disk_mb} "
            "MiB together; delete files or raise disk_mb)"
        )
    return message
