"""Background priority read back from the OS; the thread count fitted to the load; the run.priority key."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from engine.common.config_file import build_config, config_toml
from engine.common.errors import ConfigError
from engine.node.priority import LoadSampler, ThreadPolicy, niceness

ROOT = Path(__file__).resolve().parents[2]

# A child that starts a thread, applies the priority, starts another, then waits: the priority must reach
# the thread that existed before (Linux keeps a nice value per thread) and the one made after.
CHILD = textwrap.dedent("""
    import sys, threading
    from engine.node.priority import apply_priority
    hold = threading.Event()
    before = threading.Thread(target=hold.wait); before.start()
    print(apply_priority(sys.argv[1]), flush=True)
    after = threading.Thread(target=hold.wait); after.start()
    print("ready", flush=True)
    sys.stdin.read()
    hold.set()
""")


def priorities_of_child(mode: str) -> tuple[str, dict[int, int] | int]:
    """What apply_priority(mode) said, and the child's priority as the OS reports it (per thread on POSIX)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        said = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "ready"
        seen: dict[int, int] | int = (psutil.Process(proc.pid).nice() if sys.platform == "win32"
                                      else niceness(proc.pid))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    return said, seen


@pytest.mark.integration
def test_background_priority_reaches_every_thread_as_the_os_reports_it() -> None:
    said, seen = priorities_of_child("background")
    if sys.platform == "win32":
        assert seen == psutil.IDLE_PRIORITY_CLASS  # type: ignore[attr-defined]
        return
    assert said.startswith("nice 19")
    assert isinstance(seen, dict) and set(seen.values()) == {19}
    if sys.platform.startswith("linux"):
        assert len(seen) >= 3  # main, the thread from before, the thread from after


@pytest.mark.integration
def test_normal_priority_leaves_the_process_as_it_was() -> None:
    said, seen = priorities_of_child("normal")
    assert said == "normal priority"
    if sys.platform == "win32":
        assert seen == psutil.Process().nice()
    else:
        assert isinstance(seen, dict) and set(seen.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_run_priority_is_a_config_key_with_help_and_a_clear_error() -> None:
    assert build_config().run.priority == "background"
    assert build_config(overrides=["run.priority=normal"]).run.priority == "normal"
    assert "# 'background': the lowest OS priority" in config_toml(build_config())
    with pytest.raises(ConfigError, match=r"run\.priority must be one of background, normal"):
        build_config(overrides=["run.priority=idle"])


class FakeSampler(LoadSampler):
    """Reports the load it is told to, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.load = 0.0
        self.reads = 0
        super().__init__(clock=lambda: self.now)
        self.now += 10.0  # the engine loads its model before the first measurement

    def others(self) -> float:
        self.reads += 1
        self.last = (self.now, 0.0, 0.0)
        return self.load


def test_automatic_threads_give_way_to_a_busy_program_and_come_back() -> None:
    applied: list[int] = []
    sampler = FakeSampler()
    policy = ThreadPolicy(0, applied.append, max_threads=2, cpus=2, interval=2.0, sampler=sampler)
    assert policy.update() == 2 and applied == [2]
    sampler.load, sampler.now = 1.0, sampler.now + 2.0  # one program keeps a core busy
    assert policy.update() == 1 and applied == [2, 1]
    sampler.load, sampler.now = 0.1, sampler.now + 2.0  # it finished
    assert policy.update() == 2 and applied == [2, 1, 2]


def test_automatic_threads_measure_at_most_once_per_interval() -> None:
    sampler = FakeSampler()
    policy = ThreadPolicy(0, lambda n: None, max_threads=2, cpus=2, interval=2.0, sampler=sampler)
    policy.update()
    sampler.load, sampler.now = 2.0, sampler.now + 1.0
    assert policy.update() == 2 and sampler.reads == 1  # too soon: not measured, not changed
    sampler.now += 1.0
    assert policy.update() == 1 and sampler.reads == 2  # both cores busy elsewhere: still one thread


def test_a_measurement_over_less_than_half_a_second_is_not_trusted() -> None:
    sampler = FakeSampler()
    policy = ThreadPolicy(0, lambda n: None, max_threads=2, cpus=2, sampler=sampler)
    policy.update()
    policy.reconfigure(1)
    policy.reconfigure(0)  # measure again at the next update...
    sampler.load, sampler.now = 2.0, sampler.now + 0.1
    assert policy.update() == 1 and sampler.reads == 1  # ...but not over 0.1 s
    sampler.now += 0.5
    assert policy.update() == 1 and sampler.reads == 2


@pytest.mark.parametrize(("others", "threads"), [(0.0, 8), (1.0, 7), (3.9, 4), (6.0, 2), (8.0, 1)])
def test_automatic_threads_use_the_share_other_programs_leave(others: float, threads: int) -> None:
    sampler = FakeSampler()
    sampler.load = others
    policy = ThreadPolicy(0, lambda n: None, max_threads=8, cpus=8, sampler=sampler)
    assert policy.update() == threads


def test_a_fixed_thread_count_is_applied_once_and_never_measured() -> None:
    applied: list[int] = []
    sampler = FakeSampler()
    policy = ThreadPolicy(1, applied.append, max_threads=2, cpus=2, sampler=sampler)
    sampler.now += 10.0
    assert policy.update() == 1 and applied == [1] and sampler.reads == 0
    policy.reconfigure(0)  # a reload back to automatic measures at the next update
    sampler.now += 10.0
    assert policy.update() == 2 and applied == [1, 2] and sampler.reads == 1


@pytest.mark.integration
def test_load_sampler_counts_another_busy_process() -> None:
    sampler = LoadSampler()
    started = sampler.last[0]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child = psutil.Process(busy.pid)
        while child.cpu_times().user < 0.5 and sampler.clock() - started < 60:
            time.sleep(0.05)
        spent = child.cpu_times()
        others = sampler.others()
    finally:
        busy.kill()
        busy.wait()
    wall = sampler.last[0] - started
    # Everything the busy child ran counts as others' work; the loop above waits, so this process adds little.
    assert others * wall >= 0.95 * (spent.user + spent.system)


def test_the_loading_line_names_the_device_in_plain_words() -> None:
    from engine.common.device import DeviceInfo

    cpu = DeviceInfo("cpu", "Intel(R) Xeon(R) Processor (2 threads)", 24 << 30, True, "no CUDA device: CPU")
    gpu = DeviceInfo("cuda", "NVIDIA H200", 141 << 30, True, "CUDA 12.8, 1 device(s)")
    mac = DeviceInfo("mlx", "Apple M2", 16 << 30, True, "Apple M2, MLX 0.32, Metal")
    mlx_cpu = DeviceInfo("mlx", "AMD EPYC (MLX on CPU)", 24 << 30, False, "MLX 0.32 on CPU, no Metal")
    assert [d.plain() for d in (cpu, gpu, mac, mlx_cpu)] == [
        "the processor", "the NVIDIA H200 graphics card", "the Apple M2 graphics", "the processor"]


def test_only_the_owning_thread_applies_a_count_and_a_drifted_count_is_applied_again() -> None:
    """torch's thread count is per thread: a count set from a helper thread (a training lane's progress
    callback) never reached the round's own thread, which then generated with every core beside a busy program."""
    import threading

    applied: list[tuple[int, bool]] = []
    actual = {"count": 2}
    sampler = FakeSampler()

    def apply(n: int) -> None:
        owner = threading.current_thread() is threading.main_thread()
        applied.append((n, owner))
        if owner:
            actual["count"] = n

    policy = ThreadPolicy(0, apply, max_threads=2, cpus=2, sampler=sampler, current=lambda: actual["count"])
    assert policy.update() == 2 and applied == [(2, True)]
    sampler.load, sampler.now = 1.0, sampler.now + 2.0
    helper = threading.Thread(target=policy.update)
    helper.start()
    helper.join()
    assert policy.threads == 1 and applied == [(2, True)]  # measured there, applied nowhere yet
    assert policy.update() == 1 and applied == [(2, True), (1, True)] and actual["count"] == 1
    actual["count"] = 2  # something restored an older count on the owner's thread
    assert policy.update() == 1 and actual["count"] == 1
