"""The local backend's syscall filter: a classic-BPF seccomp program, built here.

    prog = program(allow=["ptrace"])   # bytes: struct sock_filter[], for bwrap --seccomp FD
                                       # or prctl(PR_SET_SECCOMP) in the exec agent, once

It blocks (EPERM) at least what Docker's default profile blocks for a process without
capabilities: ptrace and cross-process memory access, mount and the new mount API, keyrings,
bpf, perf_event_open, userfaultfd, io_uring, kernel modules, kexec, reboot, swap, clock
setting, NUMA policy, handle-based opens, setns, clone with namespace flags and unshare with
any flags but a bare ``CLONE_NEWPID`` (no new user namespaces). ``clone3`` returns ENOSYS, so
the C library falls back to ``clone``, whose flags a classic filter can read.

``unshare(CLONE_NEWPID)`` passes the filter because the exec agent installs the filter once,
in itself, and each command's process, forked from it, inherits it and then makes the
command's pid namespace: attaching a filter costs every process that does it ~0.5-1 ms of CPU
(the kernel converts and JIT-compiles the program and precomputes its per-syscall cache), and
the spawn that follows right after paid ~1.5 ms more, while a forked child inherits the
parent's filter for a reference count. The kernel still refuses that unshare to a process
without CAP_SYS_ADMIN in its user namespace, which a command (uid 65534 after ``execve``, and
no way to make a user namespace) does not have. A syscall of any other ABI than the native one (i386 through
``int 0x80``, x32) kills the process. Only x86_64 and aarch64 are known; elsewhere
``program`` returns None and the sandbox logs that it runs without a filter.

Built in Python rather than with libseccomp: no C dependency on the host or in the sandbox,
the program is ~90 instructions, and the exec agent (standard library only) installs it.
"""

from __future__ import annotations

import platform
import struct

# seccomp_data: nr @0, arch @4, args[i] @16 + 8*i (low 32 bits first: little endian)
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW = 0x80000000, 0x7FFF0000
EPERM, ENOSYS = 1, 38
_CLONE_NS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEWPID = 0x20000000

_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "create_module": 174, "get_kernel_syms": 177, "query_module": 178, "kexec_load": 246,
    "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
    "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "quotactl": 179,
    "nfsservctl": 180, "lookup_dcookie": 212, "uselib": 134, "ustat": 136, "sysfs": 139,
    "_sysctl": 156, "iopl": 172, "ioperm": 173, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "move_pages": 279, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "setns": 308, "unshare": 272,
}  # fmt: skip
_AARCH64 = {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "pidfd_getfd": 438, "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280,
    "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "init_module": 105, "finit_module": 273, "delete_module": 106,
    "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "swapon": 224, "swapoff": 225,
    "acct": 89, "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266,
    "quotactl": 60, "lookup_dcookie": 18, "mbind": 235, "set_mempolicy": 237,
    "get_mempolicy": 236, "move_pages": 239, "name_to_handle_at": 264,
    "open_by_handle_at": 265, "setns": 268, "unshare": 97,
}  # fmt: skip
_ARCHES = {  # machine -> (AUDIT_ARCH_*, table, clone, clone3)
    "x86_64": (0xC000003E, _X86_64, 56, 435),
    "aarch64": (0xC00000B7, _AARCH64, 220, 435),
}
BLOCKABLE = sorted(set(_X86_64) | {"clone-namespaces", "clone3"})
"""Names ``allow`` accepts: the blocked syscalls, ``clone-namespaces`` (clone with namespace
flags) and ``clone3``."""


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(allow: list[str] | tuple[str, ...] = ()) -> bytes | None:
    """The filter for this machine, without the names in ``allow``; None if the
    architecture is unknown."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, table, clone, clone3 = arch
    prog = [
        _ins(_LD_ABS, 4),
        _ins(_JEQ, audit_arch, 1, 0),
        _ins(_RET, _KILL_PROCESS),  # another ABI (i386, ...)
        _ins(_LD_ABS, 0),
    ]
    if audit_arch == 0xC000003E:  # x32 calls carry bit 30 in the number
        prog += [_ins(_JGE, 0x40000000, 0, 1), _ins(_RET, _KILL_PROCESS)]
    for name, nr in sorted(table.items(), key=lambda kv: kv[1]):
        if name not in allow and name != "unshare":
            prog += [_ins(_JEQ, nr, 0, 1), _ins(_RET, 0x00050000 | EPERM)]
    if "unshare" not in allow:  # all but unshare(CLONE_NEWPID): see the module's docstring
        prog += [
            _ins(_JEQ, table["unshare"], 0, 6),
            _ins(_LD_ABS, 16),  # the flags, low half
            _ins(_JEQ, _CLONE_NEWPID, 0, 2),
            _ins(_LD_ABS, 20),  # high half
            _ins(_JEQ, 0, 1, 0),
            _ins(_RET, 0x00050000 | EPERM),
            _ins(_RET, _ALLOW),
        ]
    if "clone3" not in allow:
        prog += [_ins(_JEQ, clone3, 0, 1), _ins(_RET, 0x00050000 | ENOSYS)]
    if "clone-namespaces" not in allow:
        prog += [
            _ins(_JEQ, clone, 0, 3),
            _ins(_LD_ABS, 16),  # clone's flags (x86_64 and aarch64: the first argument)
            _ins(_JSET, _CLONE_NS, 0, 1),
            _ins(_RET, 0x00050000 | EPERM),
        ]
    prog.append(_ins(_RET, _ALLOW))
    return b"".join(prog)
