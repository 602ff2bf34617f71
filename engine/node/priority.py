"""Stay in the background: the lowest OS priority, and CPU threads that fit the load.

Sapling trains while its contributor works, so it must give way, as BOINC and
Folding@home do:

- `apply_priority("background")` lowers this process to the OS's lowest
  priority at start: nice 19 on Linux and macOS (every thread: on Linux each
  thread has its own nice value), plus the background QoS on macOS
  (``PRIO_DARWIN_BG``: CPU, disk and network throttled; efficiency cores on
  Apple silicon); ``IDLE_PRIORITY_CLASS`` on Windows. ``"normal"`` leaves the
  priority as it is. Only the engine calls it; the app's window and
  `sapling-relay` keep normal priority.
- `ThreadPolicy` picks the number of PyTorch CPU threads from the measured
  load of everything else on the computer. A parallel region waits for its
  slowest thread; when another program holds one of two cores, the thread
  sharing its core runs a fraction of the time and every region waits for it
  (docs/results.md, "Background priority and contention": a round went from
  20 s to 232 s). Fewer threads than free cores never wait like that.

A thread count is a property of each thread: torch's ``set_num_threads``
sets the calling thread's OpenMP pool (and the default later threads start
from), not the pools of threads that already ran an operation. So the policy
applies its count only on the thread that owns it (the one that generates,
scores, evaluates and trains: the round's thread), and re-applies it there
whenever that thread's count has drifted, for instance after a helper thread
set its own. A progress callback from a helper thread (a training lane) may
measure the load but never changes that thread's count.

Stdlib and psutil only: nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from engine.common.presets import PRIORITIES

log = logging.getLogger(__name__)

BACKGROUND_NICE = 19
MIN_WINDOW = 0.5  # seconds: a shorter load measurement is mostly noise
# <sys/resource.h> on macOS: setpriority(PRIO_DARWIN_PROCESS, 0, PRIO_DARWIN_BG) puts the whole process
# in the background band (the same as `taskpolicy -b`).
PRIO_DARWIN_PROCESS = 4
PRIO_DARWIN_BG = 0x1000


def apply_priority(mode: str) -> str:
    """Lower this process to the background priority (`mode` "background"), or leave it ("normal").

    Returns what was done, in words, for the log. Lowering is always allowed;
    a platform that refuses is logged and training goes on at normal priority.
    """
    if mode not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {mode!r}")
    if mode == "normal":
        return "normal priority"
    try:
        if sys.platform == "win32":
            psutil.Process().nice(psutil.IDLE_PRIORITY_CLASS)  # type: ignore[attr-defined]
            done = "idle priority class"
        elif sys.platform == "darwin":
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
            done = f"nice {BACKGROUND_NICE}"
            try:
                os.setpriority(PRIO_DARWIN_PROCESS, 0, PRIO_DARWIN_BG)
                done += " and background QoS"
            except OSError as exc:
                log.info("background QoS not available (%s); nice %d only", exc, BACKGROUND_NICE)
        else:
            for tid in _thread_ids():
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICE)
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
            done = f"nice {BACKGROUND_NICE}"
    except (OSError, psutil.Error) as exc:
        log.warning("Could not lower the engine's priority (%s); it trains at normal priority.", exc)
        return "normal priority (lowering it failed)"
    log.info("Training at background priority: %s.", done)
    return done


def _thread_ids() -> list[int]:
    """This process's threads (Linux: /proc/self/task); just the process elsewhere."""
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def niceness(pid: int) -> dict[int, int]:
    """{thread id: nice value} of every thread of process `pid`, as the OS reports it (POSIX).

    On Linux each thread has its own nice value, read from /proc/<pid>/task/<tid>/stat;
    elsewhere the process's one value is returned under `pid`.
    """
    task = Path(f"/proc/{pid}/task")
    if not task.is_dir():
        return {pid: os.getpriority(os.PRIO_PROCESS, pid)}
    values: dict[int, int] = {}
    for entry in task.iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ... : field 19 is nice; comm may hold spaces, so split after the ')'.
        values[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return values


# -- threads ---------------------------------------------------------------------------

def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


class LoadSampler:
    """How many CPUs' worth of work everything but this process did since the last call.

    Busy CPU time of the whole machine (psutil.cpu_times: all but idle and
    iowait) minus this process's own user and system time, over wall time.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.process = psutil.Process()
        self.last = self._read()

    def _read(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
        busy -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)  # already counted in user/nice
        own = self.process.cpu_times()
        return self.clock(), busy, own.user + own.system

    def others(self) -> float:
        """CPUs kept busy by other processes since the previous call (0 when no time passed)."""
        now = self._read()
        wall = now[0] - self.last[0]
        busy = (now[1] - self.last[1]) - (now[2] - self.last[2])
        self.last = now
        return max(0.0, busy / wall) if wall > 0 else 0.0


class ThreadPolicy:
    """The PyTorch CPU thread count: fixed (`configured` > 0) or fitted to the load (0).

    With 0, `update()` measures how many CPUs other programs kept busy since
    the last measurement and uses the rest: ``round(max_threads * free share)``,
    at least 1. It measures at most every `interval` seconds, so it is cheap to
    call at every decode or training step; `apply` (``torch.set_num_threads``)
    is called only when the count changes, or when `current` (the calling thread's count, such as
    ``torch.get_num_threads``) shows that it drifted; and only on the thread that created the policy.
    """

    def __init__(
        self,
        configured: int,
        apply: Callable[[int], None],
        max_threads: int | None = None,
        interval: float = 2.0,
        sampler: LoadSampler | None = None,
        cpus: int | None = None,
        current: Callable[[], int] | None = None,
    ) -> None:
        self.apply = apply
        self.current = current
        self.owner = threading.get_ident()
        self.lock = threading.Lock()
        self.max_threads = max(1, max_threads or usable_cpus())
        self.cpus = cpus or psutil.cpu_count() or self.max_threads
        self.interval = interval
        self.sampler = sampler or LoadSampler()
        self.configured = -1
        self.threads = 0
        self.next_at = 0.0
        self.reconfigure(configured)

    def reconfigure(self, configured: int) -> None:
        """A new run.threads (a reload): a fixed count applies now, 0 measures again at the next update."""
        if configured == self.configured:
            return
        self.configured = configured
        if configured > 0:
            self._set(configured)
        else:
            self.next_at = 0.0
            self._set(self.max_threads if self.threads == 0 else self.threads)

    def update(self) -> int:
        """The thread count to use now (re-measured when `interval` has passed); on the owner's thread it is
        applied if it changed or drifted. Safe to call from any thread."""
        with self.lock:
            if self.configured <= 0:
                self._measure()
            if self._owned() and self.current is not None and self.current() != self.threads:
                self.apply(self.threads)  # drifted: another thread's setting, or a restore of an older count
            return self.threads

    def _measure(self) -> None:
        now = self.sampler.clock()
        if now < self.next_at or now - self.sampler.last[0] < MIN_WINDOW:
            return
        self.next_at = now + self.interval
        others = self.sampler.others()
        free = max(0.0, 1.0 - others / self.cpus)
        wanted = min(self.max_threads, max(1, round(self.max_threads * free)))
        if wanted != self.threads:
            log.info("Other programs keep %.1f of %d CPUs busy: working with %d thread%s.",
                     others, self.cpus, wanted, "" if wanted == 1 else "s")
            self._set(wanted)

    def _owned(self) -> bool:
        return threading.get_ident() == self.owner

    def _set(self, threads: int) -> None:
        if threads != self.threads:
            self.threads = threads
            if self._owned():
                self.apply(threads)
