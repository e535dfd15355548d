"""The memory rules on system columns: the peak near the limit, allocation retries climbing,
and memory growing step after step (a leak), against sawtooth memory that does not leak."""

from __future__ import annotations

import numpy as np

from nbmonitor.health.rules.memory import (
    BLOCK_SAMPLES,
    GROWTH_MIN_BYTES,
    RISING_BLOCKS,
    LeakTracker,
    peak_rule,
    retries_rule,
)

GIB = 2.0**30


def test_the_peak_near_the_limit_on_cuda_and_on_the_cpu() -> None:
    n = 10
    cuda = {
        "step": np.arange(1.0, n + 1),
        "cuda_allocated_bytes": np.full(n, 10 * GIB),
        "cuda_interval_peak_bytes": np.full(n, 70 * GIB),
        "cuda_total_bytes": np.full(n, 80 * GIB),
        "cuda_non_pytorch_bytes": np.full(n, 1 * GIB),
    }
    assert peak_rule(cuda) == []  # 70 of 79 GiB: 89 %
    cuda["cuda_interval_peak_bytes"][3] = 72 * GIB  # one step of the window reached 91 %
    (alert,) = peak_rule(cuda, [1])
    assert alert.rule == "memory_peak" and alert.subject == "gpu1"
    assert "72 GiB of the 79 GiB" in alert.message and "91%" in alert.message
    cpu = {
        "step": np.arange(1.0, n + 1),
        "process_rss_bytes": np.full(n, 14 * GIB),
        "ram_used_bytes": np.full(n, 15 * GIB),
        "ram_total_bytes": np.full(n, 16 * GIB),
    }
    (alert,) = peak_rule(cpu)  # 14 of the 15 GiB the other processes leave
    assert alert.subject == "run" and "This process" in alert.message
    cpu["process_rss_bytes"] = np.full(n, 4 * GIB)
    assert peak_rule(cpu) == []
    assert peak_rule({"step": np.arange(3.0)}) == []  # nothing known: nothing said


def test_alloc_retries_climbing_name_the_allocator_setting() -> None:
    n = 10
    columns = {
        "step": np.arange(1.0, n + 1),
        "cuda_alloc_retries": np.full(n, 3.0),
        "cuda_allocated_bytes": np.full(n, 50 * GIB),
        "cuda_reserved_bytes": np.full(n, 70 * GIB),
        "cuda_inactive_split_bytes": np.full(n, 12 * GIB),
    }
    assert retries_rule(columns) == []  # retries long ago, none lately
    columns["cuda_alloc_retries"][-4:] = [4, 5, 6, 7]
    (alert,) = retries_rule(columns)
    assert alert.rule == "alloc_retries" and alert.subject == "gpu0"
    assert "expandable_segments:True" in alert.message
    assert "12 GiB in split blocks" in alert.message and "20 GiB reserved" in alert.message


def feed(
    tracker: LeakTracker, values: np.ndarray, steps: np.ndarray, key: str, every: int = 7
) -> None:
    # In slices, as the health checks see them: each slice repeats what came before.
    times = np.arange(float(len(values)))
    for end in range(every, len(values) + every, every):
        tracker.add({key: values[:end], "step": steps[:end], "time": times[:end]})


def test_a_leak_is_memory_whose_floor_keeps_rising() -> None:
    n = BLOCK_SAMPLES * (RISING_BLOCKS + 2) + 3
    steps = np.arange(10.0, 10.0 + n)
    # Each step allocates 200 MiB of activations and frees them: a sawtooth on a floor.
    saw = np.where(np.arange(n) % 3 == 1, 200 * 2.0**20, 0.0)
    healthy = LeakTracker()
    feed(healthy, 1 * GIB + saw, steps, "cuda_allocated_bytes")
    assert healthy.growth() is None
    leak = LeakTracker()
    grows = 1 * GIB + saw + np.arange(n) * 2.0**20  # 1 MiB kept per step
    feed(leak, grows, steps, "cuda_allocated_bytes")
    got = leak.growth()
    assert got is not None
    grown, over = got
    assert grown >= GROWTH_MIN_BYTES and grown / over == 2.0**20
    # Named at the sample that made it evident, however the checks cut the samples.
    evident = []
    for every in (1, 4, 7, n):
        tracker = LeakTracker()
        feed(tracker, grows, steps, "cuda_allocated_bytes", every)
        evident.append(tracker.evident)
    assert evident[0] is not None and evident[0][2] < steps[-1]
    assert evident == [evident[0]] * 4


def test_no_leak_while_steps_stand_still_or_the_growth_is_tiny() -> None:
    n = BLOCK_SAMPLES * (RISING_BLOCKS + 2)
    paused = LeakTracker()  # memory grows during an evaluation, the step does not move
    feed(paused, GIB + np.arange(n) * 2.0**22, np.full(n, 50.0), "process_rss_bytes")
    assert paused.growth() is None
    tiny = LeakTracker()  # allocator rounding: a few KiB
    feed(tiny, GIB + np.arange(n) * 512.0, np.arange(10.0, 10.0 + n), "process_rss_bytes")
    assert tiny.growth() is None
    warmup = LeakTracker()  # the first steps allocate for good (optimizer state): not a leak
    feed(warmup, GIB + np.arange(n) * 2.0**22, np.zeros(n) + 3.0, "process_rss_bytes")
    assert warmup.growth() is None


def test_the_monitors_own_memory_is_not_the_users_leak() -> None:
    # The quickstart on a busy machine: the resident size rises 12 MiB over 15 samples, 40
    # steps apart (about 20 KiB a step), and the plain loop grows nothing: the growth is what
    # the allocator retains of the monitor's own work. Not a leak.
    n = BLOCK_SAMPLES * (RISING_BLOCKS + 2)
    steps = np.arange(10.0, 10.0 + 40 * n, 40)
    own = LeakTracker()
    feed(own, GIB + np.arange(n) * 12 * 2.0**20 / n, steps, "process_rss_bytes")
    assert own.growth() is None
    # What the monitor's stores hold (monitor_bytes) is subtracted, however few the steps.
    times = np.arange(float(n))
    held = np.arange(n) * 2.0**22
    stores = LeakTracker()
    stores.add(
        {"process_rss_bytes": GIB + held, "monitor_bytes": held, "step": steps / 40 + 10,
         "time": times}
    )  # fmt: skip
    assert stores.growth() is None
    # A tensor of 256 KiB kept each step is the user's leak, on the resident size too.
    leak = LeakTracker()
    feed(leak, GIB + np.arange(n) * 40 * 2.0**18, steps, "process_rss_bytes")
    got = leak.growth()
    assert got is not None and got[0] / got[1] == 2.0**18
