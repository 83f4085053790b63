"""The end of a job of several members (sagips/analysis/job.py): the last member to end, and only it, analyses."""
import json
from pathlib import Path

from sagips.analysis import job


def members(tmp_path, *states, token="t1"):
    for m, status in enumerate(states):
        d = tmp_path / f"member{m:03d}"
        d.mkdir(exist_ok=True)
        (d / "run.json").write_text(json.dumps({"status": status, "job": token}))


def test_only_a_job_whose_members_are_all_complete_is_analysed(tmp_path):
    members(tmp_path, "complete", "running")
    assert not job.members_complete(tmp_path, 2, "t1")
    assert not job.members_complete(tmp_path, 3, "t1")  # member002 has no run.json yet
    members(tmp_path, "complete", "complete")
    assert job.members_complete(tmp_path, 2, "t1")
    assert not job.members_complete(tmp_path, 2, "t2")  # complete, but members of an earlier job in the directory
    (tmp_path / "member001" / "run.json").write_text('{"status": "compl')  # being replaced
    assert not job.members_complete(tmp_path, 2, "t1")


def test_one_claim_per_job_and_earlier_claims_are_removed(tmp_path):
    assert job.claim(tmp_path, "old")
    assert job.claim(tmp_path, "t1") and not job.claim(tmp_path, "t1")
    assert sorted(p.name for p in (tmp_path / job.ANALYSIS_DIR).iterdir()) == [".claimed-t1"]


def test_the_last_member_analyses_once_and_a_failed_analysis_is_one_line(tmp_path):
    said = []
    members(tmp_path, "complete", "running")
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None  # not the last member: one line, no analysis
    again = f"python -m sagips.analyze {tmp_path} --out {tmp_path / job.ANALYSIS_DIR}"
    assert said == [f"sagips: the job's p̂ ± σ comes from its last member to end (or at any time: {again})"]
    members(tmp_path, "complete", "complete")  # complete, but no checkpoints: sagips.analyze refuses them
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None
    assert len(said) == 3 and said[1].startswith("sagips: all 2 members of the job are done")
    assert said[2].startswith("sagips: warning: the job's analysis failed (") and "\n" not in said[2]
    assert said[2].endswith(f"run {again}")
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None and len(said) == 4  # claimed: never twice
    assert said[3].startswith("sagips: the job's p̂ ± σ comes from its last member")


def test_only_this_jobs_members_are_analysed(tmp_path, monkeypatch):
    """A member directory left by an earlier, larger job (member002 of 3, now 2) is named and left out."""
    import sagips.analyze

    members(tmp_path, "complete", "complete", "complete")
    seen, said = [], []
    monkeypatch.setattr(sagips.analyze, "run_analysis", lambda args: seen.append(args.run_dirs) or {"groups": []})
    monkeypatch.setattr(sagips.analyze, "quotable", lambda summary: ["TABLE"])
    assert job.job_result(tmp_path, 2, "t1", say=said.append) == {"groups": []}
    assert seen == [[str(tmp_path / "member000"), str(tmp_path / "member001")]]
    assert said[0].endswith(f"(python -m sagips.analyze {tmp_path}/member{{000..001}} --out "
                            f"{tmp_path / job.ANALYSIS_DIR})")
    assert said[1] == f"sagips: note: {tmp_path} also holds member002 of an earlier job: not in this analysis"
    assert said[2].startswith("TABLE\n\nsagips: the job's analysis (summary.md, summary.json, figures) is in ")


def test_a_failure_after_the_analysis_is_a_warning_too(tmp_path, monkeypatch):
    """Whatever fails once the members are complete (here the table itself) is one line, never an exception that
    would abort a finished job."""
    import sagips.analyze

    members(tmp_path, "complete", "complete")
    said = []
    monkeypatch.setattr(sagips.analyze, "run_analysis", lambda args: {"groups": []})
    monkeypatch.setattr(sagips.analyze, "quotable", lambda summary: summary["missing"])
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None
    assert said[-1].startswith("sagips: warning: the job's analysis failed (KeyError: 'missing')")

    def closed(line):
        raise BrokenPipeError(32, "Broken pipe")

    (tmp_path / "again").mkdir()
    members(tmp_path / "again", "complete", "complete")
    assert job.job_result(tmp_path / "again", 2, "t1", say=closed) is None  # stdout gone: still no exception


def test_a_job_directory_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path):
    said = []
    members(tmp_path, "complete", "complete")
    (tmp_path / job.ANALYSIS_DIR).write_text("a file where the directory goes")
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None
    assert len(said) == 1 and said[0].startswith("sagips: warning: the job's analysis failed (")
    assert "\n" not in said[0] and said[0].endswith(f"run python -m sagips.analyze {tmp_path} --out "
                                                    f"{tmp_path / job.ANALYSIS_DIR}")


def test_a_run_that_analyses_itself_fails_in_one_line_whatever_its_path(tmp_path, monkeypatch):
    """The end of a --mode ensemble run of several ranks (job.run_result): a failed analysis is one warning line that
    names the command, never an exception (not even argparse's exit for a directory named like an option)."""
    said = []
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"status": "complete"}))  # complete, but no checkpoints
    assert job.run_result(run, 4, say=said.append) is None
    again = f"python -m sagips.analyze {run} --out {run / job.ANALYSIS_DIR}"
    assert said[0] == f"sagips: the 4 ranks are independent members; analysing them ({again})"
    assert len(said) == 2 and said[1].startswith("sagips: warning: the run's analysis failed (") and "\n" not in said[1]
    assert said[1].endswith(f"the run is complete: run {again}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-x").mkdir()
    said.clear()
    assert job.run_result("-x", 2, say=said.append) is None  # (no SystemExit from argparse)
    assert said[1].startswith("sagips: warning: the run's analysis failed (")
    import sagips.analyze

    seen = []
    monkeypatch.setattr(sagips.analyze, "run_analysis", lambda args: seen.append((args.run_dirs, args.out)) or {})
    monkeypatch.setattr(sagips.analyze, "quotable", lambda summary: ["TABLE"])
    assert job.run_result("-x", 2, say=said.append) == {} and seen == [(["-x"], str(Path("-x") / job.ANALYSIS_DIR))]
