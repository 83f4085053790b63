"""run.json's status "failed" (sagips/io/status.py): the failed run's own record, the job's other members', and what
is never written. The runs themselves: tests/test_faults.py (a failed rank, the watchdog, one process) and
tests/test_sigterm.py ("stopped")."""
import json
import os

from sagips.io import status


def _run(tmp_path, name, state="running"):
    d = tmp_path / name
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"status": state, "epochs": 7}))
    return d / "run.json"


def _read(path):
    return json.loads(path.read_text())


def test_the_failed_run_and_the_other_members_are_marked(tmp_path):
    own, other, done = _run(tmp_path, "member001"), _run(tmp_path, "member000"), _run(tmp_path, "member002", "complete")
    status.mark(str(own), False, [str(other), str(done)])
    try:
        status.failed("rank 3: RuntimeError: Error(s) in loading state_dict\n\tMissing key(s): a, b\n")
    finally:
        status.mark(None)
    assert _read(own)["status"] == "failed" and _read(own)["end_time"]
    assert _read(own)["error"] == "rank 3: RuntimeError: Error(s) in loading state_dict"  # the first line
    assert _read(other)["error"] == "aborted: rank 3: RuntimeError: Error(s) in loading state_dict"
    assert _read(done) == {"status": "complete", "epochs": 7}  # a completed run is never marked
    assert _read(own)["epochs"] == 7  # the rest of run.json is kept


def test_an_error_of_every_rank_is_written_by_rank_0_alone_and_only_where_the_job_aborts_to_the_others(tmp_path):
    own, other = _run(tmp_path, "a"), _run(tmp_path, "b")
    status.mark(str(own), False, [str(other)])
    status.failed("the same on every rank", every_rank_raised=True)  # (not rank 0: nothing)
    assert _read(own)["status"] == _read(other)["status"] == "running"
    status.mark(str(own), True, [str(other)])
    status.failed("a first-epoch check", every_rank_raised=True, aborts_job=False)  # (exit 2: the others end alike)
    status.mark(None)
    assert _read(own)["error"] == "a first-epoch check" and _read(other)["status"] == "running"
    status.failed("after the run: nothing is marked")
    assert _read(other)["status"] == "running"


def test_a_missing_or_broken_run_json_is_no_second_error(tmp_path):
    (tmp_path / "run.json").write_text('{"status": "runn')
    status.mark(str(tmp_path / "run.json"), True, [str(tmp_path / "nothing" / "run.json")])
    try:
        status.failed("x")  # (never raises: it runs on the way out of a failure)
    finally:
        status.mark(None)
    assert (tmp_path / "run.json").read_text() == '{"status": "runn'


def test_a_failure_line_names_the_operating_systems_error_that_a_library_wrapped():
    """torch.save on a full disk raises RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos ...')
    from the OSError of the write: run.json's line names the cause (a new user's disk-full trial read only the
    first)."""
    import errno

    from sagips.run import failure_line

    def save():
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5120 vs 5072")  # noqa: B904

    try:
        save()
    except RuntimeError as e:
        assert failure_line(e) == ("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 5120 vs "
                                   "5072 (caused by OSError: No space left on device)")
    assert failure_line(ValueError("bad")) == "ValueError: bad"  # nothing wrapped: the line alone


def test_a_run_stopped_by_nan_gradients_is_one_line_and_a_crash_keeps_its_traceback(capsys, monkeypatch):
    """NonFiniteError's message says what happened and where the generator was: one line, no traceback (a new
    user's simulator, NaN in a corner of its bounds, ended in 30 lines); any other error keeps its traceback."""
    from sagips import run
    from sagips.io import status
    from sagips.trainer import NonFiniteError

    monkeypatch.setattr(status, "failed", lambda *a, **k: None)
    world = type("World", (), {"rank": 0, "size": 1})()
    for error in (NonFiniteError("rank 0: 14 generator steps in a row had NaN/Inf gradients"), ValueError("bug")):
        try:
            raise error
        except Exception:
            run.abort_job(world)
    err = capsys.readouterr().err
    assert err.startswith("sagips: error: rank 0: 14 generator steps in a row had NaN/Inf gradients\n"
                          "sagips: rank 0 failed:\nTraceback")
    assert err.rstrip().endswith("ValueError: bug")
