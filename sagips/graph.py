"""train.cuda_graph: the step's device segments, recorded once as CUDA graphs and replayed.

    plan = trainer.plan()                 # [("device", fn), ("host", fn(epoch)), ("device", fn), ...]
    runner = SegmentRunner(device, mode, generators=[env.gen], warmup=3)
    for epoch ...:
        for i, (kind, fn) in enumerate(plan):
            fn(epoch) if kind == "host" else runner.run(i, fn)

The step (sagips/trainer.py) is a list of device segments separated by host points: the MPI exchange, which reads
the gradients from pinned host memory and writes the mean back there, the straggler sleep, the fault drill. Each
device segment is one Python function. Eagerly it is called; with graphs, after `warmup` eager epochs, each segment is
recorded once (`torch.cuda.CUDAGraph`, all of them in one memory pool, replayed in the order recorded) and from then
on replayed. The same functions run in both modes: there is never a second copy of the step.

What a segment must do to be recordable, and the trainer does: read no device value on the host (the NaN guard
decides on the device, sagips/guard.py); keep shapes fixed; take its random numbers from generators registered with
the graph (`generators`, besides CUDA's default one); step optimizers that are capturable (fused Adam, its learning
rate a device tensor). `why_not` names what stands in the way; `auto` then stays eager and says why in one line.

The recording's own work. `torch.cuda.graph` resets the registered generators' device offsets (an eager `fill_`, queued
on the capture stream just before the capture begins), and the first replay then writes the true offsets from the
current stream. Nothing orders the two streams, so where the GPU runs the reset after that write (seen with 4 ranks
sharing one H100) the first replay draws its random numbers at offset 0: that one epoch's batches differ, and the run
goes on along another, equally good path. Seen in `ensemble`, 4 of 12 graph runs on one or more ranks, always at the
recording epoch (a per-epoch fingerprint recorded on the device; docs/benchmarks/gpu_step.notes.md). So `_record` waits
for the device after each recording: once per segment and run.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import torch

MODES = ("auto", "on", "off")


class GraphCaptureError(RuntimeError):
    """train.cuda_graph=on, and the step cannot be recorded (the message says why)."""


def resolve(mode: str, device: torch.device, obstacles: Sequence[str]) -> tuple[bool, str]:
    """(use graphs, why) for train.cuda_graph=`mode` on `device`, given what stands in the way (`obstacles`)."""
    if mode not in MODES:
        raise ValueError(f"train.cuda_graph={mode!r} is not one of {MODES}")
    if mode == "off":
        return False, "train.cuda_graph=off"
    if device.type != "cuda":
        if mode == "on":
            raise GraphCaptureError(f"train.cuda_graph=on needs a CUDA device (this rank runs on {device}); "
                                    f"use train.cuda_graph=auto or off")
        return False, "not a CUDA device"
    if obstacles:
        why = "; ".join(obstacles)
        if mode == "on":
            raise GraphCaptureError(f"train.cuda_graph=on: the step cannot be recorded ({why}); use auto or off")
        return False, why
    return True, "recorded after the warm-up epochs and replayed"


class SegmentRunner:
    """Runs device segment i eagerly, or (when `enabled`, after `warmup` calls of the whole step) records it once
    and replays it. `fallback` (train.cuda_graph=auto): a recording that fails turns graphs off, runs the segment
    eagerly, and leaves the reason in `why`; otherwise the error is raised."""

    def __init__(self, device: torch.device, enabled: bool, generators: Sequence[torch.Generator] = (),
                 warmup: int = 3, fallback: bool = True, why: str = "", announce: bool = False):
        self.device, self.enabled, self.warmup, self.fallback = device, enabled, warmup, fallback
        self.announce = announce  #: print the one line of a fallback (rank 0)
        # A capture cannot run on the default stream, and a stream's lazy setup (e.g. cuBLAS's workspace) must not
        # happen inside a capture: the warm-up epochs already run on the stream the graphs are recorded on.
        self.stream = torch.cuda.Stream(device) if enabled else None
        self.generators = [g for g in generators if g.device.type == "cuda"]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.steps = 0  #: completed steps (calls of `step_done`)
        self.why = why  #: what was decided and why (run.json)
        self.replays = 0

    @property
    def recording(self) -> bool:
        return self.enabled and self.steps >= self.warmup

    def run(self, i: int, fn: Callable[[], None]) -> None:
        if not self.enabled:
            fn()
            return
        if not self.recording:
            self._on_side_stream(fn)
            return
        graph = self.graphs.get(i)
        if graph is None:
            graph = self._record(i, fn)
            if graph is None:  # auto: recording failed, eager from now on
                fn()
                return
        graph.replay()
        self.replays += 1

    def _on_side_stream(self, fn: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            fn()
        current.wait_stream(self.stream)  # what follows on the current stream (e.g. GradBuffer.wait) sees it done

    def step_done(self) -> None:
        """The end of one whole step (the warm-up counts these)."""
        self.steps += 1

    def _record(self, i: int, fn: Callable[[], None]) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:  # their offsets advance on every replay (the default generator's always do)
            graph.register_generator_state(gen)
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                fn()
        except Exception as err:  # noqa: BLE001 - any failure of a recording
            self.graphs.clear()
            self.enabled = False
            reason = f"recording segment {i} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
            if not self.fallback:
                raise GraphCaptureError(f"train.cuda_graph=on: {reason}; use auto or off") from err
            self.why = f"eager: {reason}"
            if self.announce:
                print(f"sagips: train.cuda_graph=auto: the step runs eagerly ({reason})", file=sys.stderr, flush=True)
            torch.cuda.synchronize(self.device)
            return None
        # the replay must follow what the recording queued on its stream (the generators' offset reset, above)
        torch.cuda.synchronize(self.device)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[i] = graph
        return graph

    def record(self) -> dict:
        """What run.json says: used or not, why, the segments recorded and the replays."""
        return {"used": bool(self.graphs), "why": self.why, "segments": len(self.graphs), "replays": self.replays,
                "warmup_epochs": self.warmup}
