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

The host's lead. With graphs on, `step_done` waits for the epoch's device work (in the warm-up epochs too: the
condition measured), so that the host never queues more than one epoch. Measured on one H100
(docs/benchmarks/gpu_step.notes.md): in `ensemble`, the one mode without a host synchronisation inside its epoch,
the host ran up to 10 epochs ahead (to the next NaN-guard read), and 7 of 14 graph runs ended 200-780 tolerances
from their eager runs, with the same alternative weights on a given rank each time; with a synchronisation at every
epoch 0 of 9 did (two eager runs: at most 6). The cause inside the queued replays was not found. Every other mode
already waits for its exchange once per epoch. The wait costs the gap between one epoch's last kernel and the next
epoch's first launch (expected: tens of microseconds against 1.7-3 ms epochs; not measured yet).
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
        """The end of one whole step. With graphs on (the warm-up epochs too), the host waits here for the step's
        device work: it never runs more than one epoch ahead of the GPU (see "The host's lead" above)."""
        self.steps += 1
        if self.enabled:
            torch.cuda.current_stream(self.device).synchronize()

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
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[i] = graph
        return graph

    def record(self) -> dict:
        """What run.json says: used or not, why, the segments recorded and the replays."""
        return {"used": bool(self.graphs), "why": self.why, "segments": len(self.graphs), "replays": self.replays,
                "warmup_epochs": self.warmup}
