"""Where a bench's CPU seconds go, from /proc: each process of the server's Ray session sorted into a tier
(Ingress, ChatProcessor, Serve's proxy, the model replica, Ray's other processes) from samples taken before
and after a measured window (the graph bench); the ports a process listens on (an Ingress replica's own
HTTP server with direct ingress); and the machine's CPU over a level split into the server's session, the
load generator and other processes (CpuMeter), with a wait for a quiet machine.

Reading /proc only (no psutil): the tiers' CPU time is utime + stime of /proc/<pid>/stat, all threads
of the process together; a process that exits during the window takes its time with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .procfs import PROC, read_stat, stat_fields
from .procfs import pids as proc_pids
from .run import log

CLK_TCK = os.sysconf("SC_CLK_TCK")

# The tiers, in the order the report prints them: the server's (SERVING), then the bench's own processes
# (`loadgen`: the load generator; `bench`: the bench itself and its Ray driver, which ask the engine for
# its stats at the window's ends).
SERVING = ("ingress", "chat_processor", "proxy", "model", "ray_other")
TIERS = (*SERVING, "loadgen", "bench")


@dataclass(frozen=True)
class ProcSample:
    """One process at one moment: its session, what it calls itself, and the CPU seconds it has used."""

    pid: int
    sid: int
    title: str
    cpu_s: float


def parse_stat(text: str) -> tuple[int, float]:
    """(session id, CPU seconds: utime + stime) from the text of /proc/<pid>/stat."""
    rest = stat_fields(text)
    return int(rest[3]), (int(rest[11]) + int(rest[12])) / CLK_TCK


def title_of(cmdline: bytes) -> str:
    """The command line as one string: Ray's workers set theirs to `ray::<actor class>[.<method>]`."""
    return cmdline.replace(b"\0", b" ").decode(errors="replace").strip()


def read_process(pid: int, proc: Path = PROC) -> ProcSample | None:
    try:
        sid, cpu = parse_stat((proc / str(pid) / "stat").read_text())
        title = title_of((proc / str(pid) / "cmdline").read_bytes())
    except (OSError, IndexError, ValueError):
        return None  # gone meanwhile
    return ProcSample(pid, sid, title, cpu)


def sample(sid: int | None, pids: Iterable[int] = (), proc: Path = PROC) -> dict[int, ProcSample]:
    """Every live process of session `sid`, plus `pids` (processes outside it), by pid."""
    out: dict[int, ProcSample] = {}
    wanted = set(pids)
    for pid in proc_pids(proc):
        s = read_process(pid, proc)
        if s is not None and (pid in wanted or (sid is not None and s.sid == sid)):
            out[pid] = s
    return out


def tier_of(title: str, app: str, pids: Mapping[int, str] | None = None, pid: int | None = None) -> str:
    """The tier of a process: the one `pids` names for it (replica pids the replicas reported, the
    bench's own), else from the title Ray gives an actor's process."""
    if pids and pid in pids:
        return pids[pid]
    replica = f"ray::ServeReplica:{app}:"
    if title.startswith(replica):
        deployment = title[len(replica):]
        if deployment.startswith("Ingress"):
            return "ingress"
        if deployment.startswith("ChatProcessor"):
            return "chat_processor"
        if deployment.startswith("LlamaModel-"):
            return "model"
    if title.startswith(("ray::ProxyActor", "ray::HAProxyManager")) or title.split(" ", 1)[0].endswith("/haproxy"):
        return "proxy"  # Serve's proxy, or HAProxy and its manager (RAY_SERVE_ENABLE_HA_PROXY=1)
    return "ray_other"


def short_name(title: str) -> str:
    """A process's name for the breakdown of `ray_other`: the actor class, or the program."""
    if title.startswith("ray::"):
        return title.split(".", 1)[0].split(" ", 1)[0]
    words = title.split()
    if not words:
        return "?"
    prog = Path(words[0]).name
    if prog.startswith("python") and len(words) > 1:
        arg = words[2] if words[1] in ("-m", "-u") and len(words) > 2 else words[1]
        return f"python {Path(arg).name}"
    return prog


def cpu_by_tier(before: Mapping[int, ProcSample], after: Mapping[int, ProcSample], app: str,
                pids: Mapping[int, str] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """(CPU seconds per tier, CPU seconds per process name within `ray_other`) between two samples. A
    process started during the window counts from zero; its title is the later one (an idle Ray worker
    that became an actor is that actor)."""
    tiers = dict.fromkeys(TIERS, 0.0)
    other: dict[str, float] = {}
    for pid, end in after.items():
        start = before.get(pid)
        same = start is not None and start.sid == end.sid and start.cpu_s <= end.cpu_s  # not a reused pid
        used = end.cpu_s - start.cpu_s if same else end.cpu_s
        tier = tier_of(end.title, app, pids, pid)
        tiers[tier] = tiers.get(tier, 0.0) + used
        if tier == "ray_other" and used > 0:
            name = short_name(end.title)
            other[name] = other.get(name, 0.0) + used
    return tiers, other


def machine_busy_s(stat_text: str | None = None) -> float:
    """CPU seconds the whole machine spent busy since boot (all cores: /proc/stat's first line)."""
    text = stat_text if stat_text is not None else (PROC / "stat").read_text()
    fields = text.splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def per_k_tokens(cpu_s: float, tokens: float) -> float | None:
    """CPU seconds per 1,000 tokens, which is also the cores a tier needs per 1,000 tokens/s."""
    return cpu_s * 1000 / tokens if tokens > 0 else None


# --------------------------------------------------------------------------------------------
# Listening ports (direct ingress: each Ingress replica serves HTTP on a port of its own)
# --------------------------------------------------------------------------------------------

TCP_LISTEN = "0A"


def listening_inodes(net_tcp_text: str) -> dict[int, int]:
    """{socket inode: local port} of the LISTEN sockets in the text of /proc/net/tcp or tcp6."""
    out = {}
    for line in net_tcp_text.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[3] == TCP_LISTEN:
            out[int(cols[9])] = int(cols[1].rsplit(":", 1)[1], 16)
    return out


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    inodes = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listening_ports(pid: int, proc: Path = PROC) -> list[int]:
    """The TCP ports process `pid` listens on."""
    listening: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            listening.update(listening_inodes((proc / str(pid) / "net" / name).read_text()))
        except OSError:
            pass
    return sorted({listening[i] for i in socket_inodes(pid, proc) if i in listening})


# --------------------------------------------------------------------------------------------
# Who used the (2) cores during a level: the server's session, the load generator, everything else
# --------------------------------------------------------------------------------------------

def session_procs(sid: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of each live process of session `sid`."""
    for pid in proc_pids():
        rest = read_stat(pid)
        if rest is not None and int(rest[3]) == sid:
            yield pid, rest


def _session_cpu_s(sid: int) -> float:
    """CPU seconds used so far by the live processes of session `sid`."""
    return sum(int(rest[11]) + int(rest[12]) for _, rest in session_procs(sid)) / CLK_TCK


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """Splits the machine's CPU time over an interval into the server (its session), the load
    generator (this process) and everything else ("other": other people's jobs on a shared
    machine). On 2 cores, llama.cpp's spinning threads slow down badly when something else runs,
    so "other" says whether a level's numbers can be trusted."""

    def __init__(self, server_sid: int | None) -> None:
        self.sid = server_sid
        self.reset()

    def _sample(self) -> tuple[float, float, float, float]:
        server = _session_cpu_s(self.sid) if self.sid else 0.0
        return time.monotonic(), machine_busy_s(), server, _self_cpu_s()

    def reset(self) -> None:
        self._start = self._sample()

    def read(self) -> dict[str, float]:
        """Average cores used since the last reset."""
        t1, busy1, srv1, me1 = self._sample()
        t0, busy0, srv0, me0 = self._start
        dt = max(t1 - t0, 1e-6)
        server, loadgen = (srv1 - srv0) / dt, (me1 - me0) / dt
        return {"seconds": round(dt, 1), "server_cores": round(server, 2), "loadgen_cores": round(loadgen, 2),
                "other_cores": round(max((busy1 - busy0) / dt - server - loadgen, 0.0), 2)}


def wait_until_quiet(server_sid: int | None, max_wait_s: float, threshold_cores: float = 0.25,
                     window_s: float = 3.0) -> dict[str, float]:
    """Wait (up to `max_wait_s`) until other processes use less than `threshold_cores`."""
    deadline = time.monotonic() + max_wait_s
    warned = False
    while True:
        meter = CpuMeter(server_sid)
        time.sleep(window_s)
        reading = meter.read()
        if reading["other_cores"] < threshold_cores or time.monotonic() >= deadline:
            if warned or reading["other_cores"] >= threshold_cores:
                log(f"machine load from other processes: {reading['other_cores']:.2f} cores"
                    + ("" if reading["other_cores"] < threshold_cores else " (gave up waiting)"))
            return reading
        if not warned:
            log(f"other processes use {reading['other_cores']:.2f} cores; waiting up to "
                f"{max_wait_s:.0f} s for a quiet machine")
            warned = True
