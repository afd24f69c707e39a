"""bench/proc_cpu.py: a JVM's threads told apart by their /proc names."""

from __future__ import annotations

import ctypes
import os
import threading
import time

from tests.unit.bench_modules import load_bench


def test_threads_are_grouped_by_what_they_do() -> None:
    (proc_cpu,) = load_bench("proc_cpu")
    kinds = {
        comm: proc_cpu.thread_kind(comm)
        for comm in (
            "stream executio", "C1 CompilerThre", "C2 CompilerThre", "GC Thread#1",
            "Executor task l", "dispatcher-even", "Thread-3", "GC Thread#0",
        )
    }  # fmt: skip
    assert kinds == {
        "stream executio": "query thread",
        "C1 CompilerThre": "JIT compiler",
        "C2 CompilerThre": "JIT compiler",
        "GC Thread#1": "garbage collector",
        "GC Thread#0": "garbage collector",
        "Executor task l": "executor tasks",
        "dispatcher-even": "dispatcher-even",
        "Thread-3": "Thread",
    }


def test_the_cpu_of_a_process_s_threads_is_summed_by_kind() -> None:
    (proc_cpu,) = load_bench("proc_cpu")
    done = threading.Event()

    def spin(name: bytes) -> None:  # ~0.2 CPU s in a thread named like a JIT compiler thread
        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME: the thread's /proc name
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        done.wait()

    before = proc_cpu.thread_cpu_by_kind(os.getpid()).get("JIT compiler", 0.0)
    threads = [
        threading.Thread(target=spin, args=(name,), daemon=True)
        for name in (b"C1 CompilerThre", b"C2 CompilerThre")
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while proc_cpu.thread_cpu_by_kind(os.getpid()).get("JIT compiler", 0.0) < 0.3:
        assert time.monotonic() < deadline, "the two threads' CPU never summed to 0.3 s"
        time.sleep(0.02)  # /proc counts in 10 ms ticks
    after = proc_cpu.thread_cpu_by_kind(os.getpid())
    done.set()
    for thread in threads:
        thread.join()
    assert before == 0.0
    assert 0.3 <= after["JIT compiler"] <= 0.6  # /proc samples ticks: ~0.18 for 0.2 s
