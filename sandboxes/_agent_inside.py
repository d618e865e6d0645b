"""The exec agent: one resident process inside a local sandbox that starts its commands.

It runs as ``python3 -I -S -c <this file's text>`` under the sandbox's isolation chain (cgroup,
rlimits, uid drop, bubblewrap); nothing of agentrl is visible in there, so it imports the
standard library only. ``sandboxes/_exec_agent.py`` is the host side.

    host --run{id, argv, cwd, env, timeout, caps, rlimits} + stdin--> agent
         agent: request -> A (forked ahead, in a new pid namespace) -> rlimits, cwd
                -> posix_spawn B = the command, pid 1 there, new session
    host <--done{id, code, timed_out, out/err head+tail lengths and totals} + bytes-- agent
         (or out{id} + a stdout chunk per read, when the host streams stdout into a file)

Frames both ways: ``>II`` (header length, payload length), a JSON header, the raw payload.
The command (B) is pid 1 of its own pid namespace, so when it exits the kernel kills whatever
it left running, and it cannot address the agent or other commands by pid. The agent moves into
its own user namespace once at start (which lets A create pid namespaces), then installs the
syscall filter on itself (every A and command inherits it), and is not dumpable (commands of
the same uid cannot read its memory). Output is capped here, head and tail, so a
command printing gigabytes costs the host nothing. A timeout SIGKILLs B, i.e. its namespace.
"""

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import selectors
import signal
import struct
import sys
import time

HDR = struct.Struct(">II")
CHUNK = 65536
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP = bytes.fromhex(os.environ.pop("AGENTRL_SECCOMP", ""))  # commands' filter, if any
KILL_GRACE_S = 2.0
_LIBC: list = []  # the C library (ctypes), loaded on first use


def libc():
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def send(header, payload=b""):
    data = json.dumps(header).encode()
    buf = HDR.pack(len(data), len(payload)) + data + payload
    view = memoryview(buf)
    while view:
        view = view[os.write(1, view) :]


class Cap:
    """The head and the tail of a stream (agentrl.sandbox.OutputCap, without the text)."""

    def __init__(self, limit):
        self.limit = max(limit, 64)
        self.tail_limit = self.limit // 4
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data):
        self.total += len(data)
        room = self.limit - self.tail_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def parts(self):
        tail = bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""
        return bytes(self.head), tail


class Job:
    def __init__(self, rid, req, stdin):
        self.id = rid
        self.stream = bool(req.get("stream_out"))
        self.caps = [Cap(req["caps"][0]), Cap(req["caps"][1])]
        self.stdin = stdin
        self.deadline = time.monotonic() + float(req["timeout"])
        self.pid = self.cmd_pid = None
        self.open = set()  # fds still registered: out, err, in, report, pidfd
        self.report = b""
        self.code = None
        self.reaped = self.timed_out = self.killing = False
        self.hard_deadline = None  # when to stop waiting politely
        self.poll_exit = False  # no pidfd for A: check with waitpid each tick


class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(prog):
    """no_new_privs, then the filter (``sandboxes/_seccomp.py``), on the agent itself, once:
    every A it forks, and so every command, inherits it. Attaching a filter per process costs
    each ~0.5-1 ms of CPU (the kernel compiles the program), inheriting it nothing."""
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
    if libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def child(fds):
    """A, forked ahead of its command: pid namespace first, then (once the request arrives on
    fd 4) limits, cwd, and the command spawned in that namespace; report, wait, exit."""
    code, what = 1, "set up the command"
    try:
        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in fds]  # none may be clobbered
        for i, fd in enumerate(fds):  # stdin, stdout, stderr, report, request
            os.dup2(fd, i)
        os.closerange(len(fds), 1 << 20)
        os.set_inheritable(3, False)  # the report pipe is A's: the command must not forge it
        libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # own /proc files again, to reset the OOM score
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("0")
        libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        if libc().unshare(CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "cannot create a pid namespace")
        data = b""
        while chunk := os.read(4, CHUNK):
            data += chunk
        if not data:  # retired unused
            os._exit(0)
        os.close(4)
        req = json.loads(data)
        if not req["stdin"]:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        for name, value in req["rlimits"]:
            resource.setrlimit(getattr(resource, name), (value, value))
        what = "chdir to " + req["cwd"]
        os.chdir(req["cwd"])
        argv, env = req["argv"], req["env"]
        os.environ["PATH"] = env.get("PATH", os.environ.get("PATH", ""))  # posix_spawnp's lookup
        what, code = "run " + argv[0], 126
        try:
            pid = os.posix_spawnp(
                argv[0],
                argv,
                env,
                setsid=True,
                setsigmask=(),
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except FileNotFoundError:
            code = 127
            raise
        os.write(3, b"P %d\n" % pid)
        _, status = os.waitpid(pid, 0)
        os.write(3, b"S %d\n" % os.waitstatus_to_exitcode(status))
        code = 0
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(3, b"C %d\n" % code)
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            os.write(2, f"sandbox: cannot {what}: {reason}\n".encode())
    finally:
        os._exit(0)


class Agent:
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.jobs = {}
        self.inbuf = bytearray()
        self.spare = None  # (pid, [stdin w, stdout r, stderr r, report r, request w])
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)

    def fork_child(self):
        """Fork A with its pipes, before its request: the fork is off a command's path."""
        theirs, ours = [], []
        try:
            for i in range(5):
                r, w = os.pipe()
                theirs.append(r if i in (0, 4) else w)
                ours.append(w if i in (0, 4) else r)
            pid = os.fork()
        except OSError:
            for fd in theirs + ours:
                os.close(fd)
            raise
        if pid == 0:
            child(theirs)
        for fd in theirs:
            os.close(fd)
        return pid, ours

    def start(self, req, stdin):
        rid = req["id"]
        job = Job(rid, req, stdin)
        for attempt in (0, 1):  # a spare may have died meanwhile: then fork a fresh one
            spare, self.spare = self.spare, None
            try:
                pid, ours = spare or self.fork_child()
            except OSError as e:
                self.finish_error(job, f"cannot start the command: {e}")
                return
            try:
                os.write(ours[4], json.dumps(req).encode())  # blocking: A reads it all
                break
            except OSError:
                self.discard(pid, ours)
                if attempt:
                    self.finish_error(job, "cannot start the command: its process died")
                    return
        os.close(ours[4])
        job.pid = pid
        self.jobs[rid] = job
        for i, kind in enumerate(("in", "out", "err", "rep")):
            os.set_blocking(ours[i], False)
            event = selectors.EVENT_WRITE if kind == "in" else selectors.EVENT_READ
            self.sel.register(ours[i], event, (job, kind))
            job.open.add(ours[i])
        if not stdin:
            self.close_fd(job, ours[0])
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # out of fds: wait for A the slow way
            pidfd = None
            job.poll_exit = True
        if pidfd is not None:
            self.sel.register(pidfd, selectors.EVENT_READ, (job, "pid"))
            job.open.add(pidfd)

    def discard(self, pid, fds):
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

    def replenish(self):
        if self.spare is None:
            with contextlib.suppress(OSError):  # e.g. pids_max reached: fork on demand then
                self.spare = self.fork_child()

    def close_fd(self, job, fd):
        if fd in job.open:
            job.open.discard(fd)
            self.sel.unregister(fd)
            os.close(fd)

    def on_event(self, job, kind, fd):
        if kind == "in":
            try:
                n = os.write(fd, job.stdin[:CHUNK])
                job.stdin = job.stdin[n:]
            except BlockingIOError:
                return
            except OSError:  # the command closed its stdin
                job.stdin = b""
            if not job.stdin:
                self.close_fd(job, fd)
            return
        if kind == "pid":
            os.waitpid(job.pid, 0)
            job.reaped = True
            self.close_fd(job, fd)
            if job.open and job.hard_deadline is None:
                job.hard_deadline = time.monotonic() + KILL_GRACE_S
            return
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if not data:
            self.close_fd(job, fd)
        elif kind == "rep":
            job.report += data
        elif kind == "out" and job.stream:
            send({"ev": "out", "id": job.id}, data)
        else:
            job.caps[0 if kind == "out" else 1].feed(data)

    def check_done(self, job):
        if job.reaped and not job.open:
            self.finish(job)
        elif job.killing and job.cmd_pid is None:
            self.kill(job, False)  # A has now reported its command, maybe

    def finish(self, job):
        for fd in list(job.open):
            self.close_fd(job, fd)
        self.jobs.pop(job.id, None)
        self.parse_report(job)
        code = job.code
        if code is not None and code < 0:
            code = 128 - code  # killed by signal N: 128 + N, as a shell reports it
        parts = [p for cap in job.caps for p in cap.parts()]
        header = {
            "ev": "done",
            "id": job.id,
            "code": -1 if code is None else code,
            "timed_out": job.timed_out,
            "lens": [len(p) for p in parts],
            "totals": [c.total for c in job.caps],
        }
        send(header, b"".join(parts))

    def finish_error(self, job, message):
        send(
            {
                "ev": "done",
                "id": job.id,
                "code": 125,
                "timed_out": False,
                "error": message,
                "lens": [0, 0, 0, 0],
                "totals": [0, 0],
            }
        )

    def parse_report(self, job):
        """A's report: ``P <pid>`` then ``S <status>`` (or ``C <code>``). Only A holds the pipe;
        still, anything malformed is ignored rather than trusted or fatal."""
        for line in job.report.decode(errors="replace").splitlines():
            tag, _, value = line.partition(" ")
            if not value.lstrip("-").isdigit() or len(value) > 12:
                continue
            if tag == "P" and job.cmd_pid is None and int(value) > 1:
                job.cmd_pid = int(value)
            elif tag in ("S", "C"):
                job.code = int(value)

    def kill(self, job, timed_out):
        """SIGKILL the command: pid 1 of its namespace, so all of it dies."""
        job.timed_out = job.timed_out or timed_out
        if not job.killing:
            job.killing = True
            job.hard_deadline = time.monotonic() + KILL_GRACE_S
        self.parse_report(job)
        if job.cmd_pid is not None and not job.reaped:
            with contextlib.suppress(OSError):
                os.kill(job.cmd_pid, signal.SIGKILL)

    def tick(self):
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.poll_exit and not job.reaped and os.waitpid(job.pid, os.WNOHANG)[0]:
                job.reaped = True
                self.check_done(job)
                if job.id not in self.jobs:
                    continue
            if not job.killing and now >= job.deadline:
                self.kill(job, True)
            if job.hard_deadline is None or now < job.hard_deadline:
                continue
            if job.reaped:  # A is gone but a pipe stays open: stop waiting for it
                self.finish(job)
                continue
            with contextlib.suppress(OSError):  # A did not report its command in time: end A
                os.kill(job.pid, signal.SIGKILL)
            job.hard_deadline = now + KILL_GRACE_S

    def on_host(self):
        try:
            data = os.read(0, 1 << 20)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.inbuf += data
        while len(self.inbuf) >= HDR.size:
            hlen, plen = HDR.unpack_from(self.inbuf)
            if len(self.inbuf) < HDR.size + hlen + plen:
                break
            header = json.loads(bytes(self.inbuf[HDR.size : HDR.size + hlen]))
            payload = bytes(self.inbuf[HDR.size + hlen : HDR.size + hlen + plen])
            del self.inbuf[: HDR.size + hlen + plen]
            if header["op"] == "run":
                self.start(header, payload if header.get("stdin") else None)
            elif header["op"] == "kill" and header["id"] in self.jobs:
                self.kill(self.jobs[header["id"]], False)
        return True

    def loop(self):
        while True:
            deadlines = [j.deadline for j in self.jobs.values() if not j.killing]
            deadlines += [j.hard_deadline for j in self.jobs.values() if j.hard_deadline]
            deadlines += [time.monotonic() + 0.05 for j in self.jobs.values() if j.poll_exit]
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            idle = self.spare is None and not self.jobs  # not while a command runs: no
            events = self.sel.select(0 if idle else wait)  # competing with it for the CPU
            if not events and idle:
                self.replenish()  # get the next command's process ready
                events = self.sel.select(wait)
            for key, _ in events:
                if key.data is None:
                    if not self.on_host():
                        return
                    continue
                job, kind = key.data
                if job.id in self.jobs and key.fd in job.open:
                    self.on_event(job, kind, key.fd)
                    self.check_done(job)
            self.tick()


def setup():
    """Own user namespace (so forks may create pid namespaces), then not dumpable."""
    uid, gid = os.getuid(), os.getgid()
    if libc().unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) failed")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
    libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc().unshare(CLONE_NEWPID) == 0 else 1)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise OSError("cannot create a pid namespace for a command")


def main():
    try:
        setup()
        if SECCOMP:  # after setup's unshare(CLONE_NEWUSER), which the filter refuses
            install_seccomp(SECCOMP)
    except Exception as e:
        send({"ev": "hello", "ok": False, "error": str(e)})
        return
    send({"ev": "hello", "ok": True, "pid": os.getpid()})
    Agent().loop()


if __name__ == "__main__":
    main()
    sys.exit(0)
