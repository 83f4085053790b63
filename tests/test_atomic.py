"""Atomic outputs: a kill at any instant leaves metrics.jsonl (and every file written through sagips.io.atomic)
complete or absent, never torn; leftovers of a killed write are removed on resume."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sagips.io import atomic
from sagips.io.metrics import MetricsWriter, read_metrics

WRITER = """
import sys
from sagips.io.metrics import MetricsWriter
w = MetricsWriter(sys.argv[1])
i = 0
while True:
    i += 1
    w.write({"epoch": i, "pad": "x" * 4000})
    if i == 3:
        print("ready", flush=True)
"""


def test_metrics_records_round_trip(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    for e in range(1, 6):
        w.write({"epoch": e, "loss": 0.5 / e, "bad": float("nan")})
    w.close()
    recs = read_metrics(path)
    assert [r["epoch"] for r in recs] == [1, 2, 3, 4, 5] and recs[0]["bad"] == "nan"
    # a new writer (a resumed run) continues the file instead of replacing it
    MetricsWriter(path).write({"epoch": 6})
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2, 3, 4, 5, 6]
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.write({"epoch": 1})

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError):
        w.write({"epoch": 2})
    monkeypatch.undo()
    assert path.read_text() == '{"epoch":1}\n'
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []  # the temporary file was removed


def test_sigkill_at_random_instants_never_tears_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for i in range(8):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.003 * i)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        lines = path.read_text().splitlines()
        epochs = [json.loads(line)["epoch"] for line in lines]  # every line parses: nothing torn
        assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= 3
        path.unlink()
        atomic.remove_stale_temps(tmp_path)


def test_remove_stale_temps_removes_only_our_temporaries(tmp_path):
    (tmp_path / "checkpoints" / "rank0000").mkdir(parents=True)
    stale = tmp_path / "checkpoints" / "rank0000" / ".epoch0000002.pt.k3j4h5.tmp"
    stale.write_bytes(b"half")
    keep = [tmp_path / "checkpoints" / "rank0000" / "epoch0000002.pt", tmp_path / "notes.tmp", tmp_path / ".hidden"]
    for f in keep:
        f.write_bytes(b"x")
    assert atomic.remove_stale_temps(tmp_path) == [str(stale)]
    assert not stale.exists() and all(f.exists() for f in keep)
