"""The end of a job of several members (sagips/analysis/job.py): the last member to end, and only it, analyses."""
import json

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
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None and said == []  # not the last member
    members(tmp_path, "complete", "complete")  # complete, but no checkpoints: sagips.analyze refuses them
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None
    assert len(said) == 2 and said[0].startswith("sagips: all 2 members of the job are done")
    assert said[1].startswith("sagips: warning: the job's analysis failed (") and "\n" not in said[1]
    assert said[1].endswith(f"run python -m sagips.analyze {tmp_path} --out {tmp_path / job.ANALYSIS_DIR}")
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None and len(said) == 2  # claimed: never twice


def test_a_job_directory_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path):
    said = []
    members(tmp_path, "complete", "complete")
    (tmp_path / job.ANALYSIS_DIR).write_text("a file where the directory goes")
    assert job.job_result(tmp_path, 2, "t1", say=said.append) is None
    assert len(said) == 1 and said[0].startswith("sagips: warning: cannot claim the job's analysis (")
    assert "\n" not in said[0] and said[0].endswith(f"run python -m sagips.analyze {tmp_path} --out "
                                                    f"{tmp_path / job.ANALYSIS_DIR}")
