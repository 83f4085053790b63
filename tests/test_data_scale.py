"""benchmarks/data_scale.py --smoke: a file of 1e5 events written by 2 ranks (a virtual dataset), read by
`sagips.run` on 1 and 2 ranks; each rank reads its half, the state holds no data, and a second call resumes."""
import json
import time

from tests._bench import load_benchmark


def test_smoke_measures_reads_and_resumes(tmp_path):
    bench = load_benchmark("data_scale")
    out, tmp = tmp_path / "out", tmp_path / "files"
    assert bench.main(["--smoke", "--out", str(out), "--tmp", str(tmp)]) == 0
    parts = {p.stem: json.loads(p.read_text()) for p in (out / "data_scale").glob("*.json")}
    assert sorted(parts) == ["1e5_blocks_n1", "1e5_blocks_n2", "1e5_file"]
    assert parts["1e5_file"]["virtual"] and parts["1e5_file"]["block_rows"] == 1024  # 2^10 <= 1e5 / 64
    for n in (1, 2):
        run = parts[f"1e5_blocks_n{n}"]
        assert [r["rank"] for r in run["per_rank"]] == list(range(n))
        assert all(r["rows_read"] == 50_000 for r in run["per_rank"])  # its half, in blocks, not the file
        assert run["reference_data"]["rows"] == 50_000 and run["reference_data"]["subset"] == "blocks"
        assert 0.5 < run["state_mb"] < 3  # networks and optimisers, no indices
    assert list(tmp.iterdir()) == []  # the data files are deleted
    page = (out / "data_scale.md").read_text()
    assert parts["1e5_file"]["machine"]["cpu_model"] in page and "| 1e5 | blocks | 2 |" in page
    t0 = time.time()
    assert bench.main(["--smoke", "--out", str(out), "--tmp", str(tmp)]) == 0  # every part done: nothing runs
    assert time.time() - t0 < 5 and (out / "data_scale.md").read_text() == page
