"""tests/run_all.py: the single-process tests dealt into shards of about equal seconds, and the seconds read back."""
import io
import sys

from tests.run_all import _relay, deal, seconds_per_file


def test_deal_puts_every_file_in_one_shard_and_balances_the_seconds():
    weights = {"tests/test_a.py": 30.0, "tests/test_b.py": 20.0, "tests/test_c.py": 12.0, "tests/test_d.py": 9.0,
               "tests/test_e.py": 1.0}
    files = [*weights, "tests/test_new.py"]  # not weighed yet: counts as the median file (12 s)
    shards = deal(files, 2, weights)
    assert sorted(f for s in shards for f in s) == sorted(files)
    loads = [sum(weights.get(f, 12.0) for f in s) for s in shards]
    assert sorted(loads) == [42.0, 42.0]  # 30 + 12 | 20 + 12 + 9 + 1 (greedy, longest first)
    assert deal(files, 1, weights) == [sorted(files)]
    assert deal(["tests/test_a.py"], 3, {}) == [["tests/test_a.py"]]  # no empty shard
    # the MPI unit tests (20 s) run after the first shard to end: that shard gets 20 s fewer of the files
    shards = deal(files, 2, {**weights, "tests/mpi": 20.0}, after_one=20.0)
    loads = sorted(sum(weights.get(f, 12.0) for f in s) for s in shards)
    assert loads == [32.0, 52.0] and sorted(f for s in shards for f in s) == sorted(files)


def test_seconds_per_file_sums_a_junit_report(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_a" name="t1" time="1.5"/>'
                   '<testcase classname="tests.test_a.TestGroup" name="t2" time="2.0"/>'
                   '<testcase classname="tests.test_b" name="t3" time="0.25"/>'
                   '</testsuite></testsuites>')
    assert seconds_per_file(xml) == {"tests/test_a.py": 3.5, "tests/test_b.py": 0.25}


def test_relay_prefixes_lines_and_drains_the_shard_when_stdout_is_gone(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    _relay(iter(["a\n", "b"]), "[1/2] ")
    assert out.getvalue() == "[1/2] a\n[1/2] b\n"  # a last partial line ends, so the shards' lines never run together
    gone = io.StringIO()
    gone.close()  # our stdout closed (e.g. piped into `head`): writing raises
    monkeypatch.setattr(sys, "stdout", gone)
    stream = iter(["x\n"] * 1000)
    _relay(stream, "[2/2] ")
    assert next(stream, None) is None  # read to the end: a shard never blocks on a full pipe
