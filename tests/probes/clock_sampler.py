"""The SM clock and power of one GPU, read on a thread while a probe runs, and what the samples of
a window of host time say. The probes under tests/probes/ that ask about clock regimes share it.

A sample is (time.perf_counter(), SM MHz, board power W, clock-event reasons or None), every
`every_s` seconds through NVML (pynvml, the `nvml` extra). The power is NVML's power usage, which
on Ampere and newer GPUs is the average over the last second: a window read for power should start
a second after the load changed. The reasons are NVML's bitmask of why the clocks are below their
maximum (None where the driver does not say); `POWER_CAP` is its software power cap bit.

No torch; without pynvml or a GPU the sampler takes no samples and `error` says why.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Sequence

Sample = tuple[float, float, float, int | None]  # (perf_counter s, SM MHz, W, reasons)
POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap: the clocks are lowered to hold the power limit


def window_means(samples: Sequence[Sample], t0: float, t1: float) -> dict:
    """What the samples taken in [t0, t1] say: mean and lowest SM clock, mean power, the share of
    samples whose clocks were held down by the power cap (None where no sample gave reasons), and
    how many samples; all None (0 samples) for a window with none."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return {"sm_mhz": None, "sm_mhz_min": None, "power_w": None, "power_capped": None, "samples": 0}
    reasons = [s[3] for s in inside if s[3] is not None]
    return {"sm_mhz": statistics.fmean(s[1] for s in inside), "sm_mhz_min": min(s[1] for s in inside),
            "power_w": statistics.fmean(s[2] for s in inside),
            "power_capped": sum(1 for r in reasons if r & POWER_CAP) / len(reasons) if reasons else None,
            "samples": len(inside)}


class ClockSampler:
    """Samples of one GPU (torch's index, mapped through CUDA_VISIBLE_DEVICES) every few ms on a
    thread, from start() to stop(); without pynvml, none (`error` says why)."""

    def __init__(self, device_index: int, every_s: float = 0.005):
        self.samples: list[Sample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._every = every_s
        self._nvml = None
        try:
            import pynvml
        except ImportError:
            self.error = "no clock samples without pynvml: pip install 'overlapbench[nvml]'"
        else:
            try:
                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(device_index))
                self._nvml = pynvml
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ClockSampler:
        if self._nvml is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        nv, h = self._nvml, self._handle
        read_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        while not self._stop.is_set():
            try:
                mhz = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                watts = nv.nvmlDeviceGetPowerUsage(h) / 1e3
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                return
            reasons = None
            if read_reasons is not None:
                try:
                    reasons = int(read_reasons(h))
                except Exception:
                    read_reasons = None  # this driver does not say; the clock and power still count
            self.samples.append((time.perf_counter(), float(mhz), float(watts), reasons))
            time.sleep(self._every)

    def power_limit_w(self) -> float | None:
        """The GPU's enforced power limit (W), the cap its clocks are held to; None without NVML."""
        if self._nvml is None:
            return None
        try:
            return self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            return None

    def between(self, t0: float, t1: float) -> dict:
        """window_means of this sampler's samples in [t0, t1] (perf_counter seconds)."""
        return window_means(self.samples, t0, t1)


def nvml_index(device_index: int) -> int:
    """NVML's index of torch's device `device_index`: NVML ignores CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",")]
        if device_index < len(ids) and ids[device_index].isdigit():
            return int(ids[device_index])
    return device_index
