"""Reference data at scale (issue 23): what a rank holds, reads and saves, against the file's size and the ranks.

    python benchmarks/data_scale.py [--sizes 1e6,1e7,1e8] [--ranks 1,2,4] [--repeats 3] [--tmp /tmp/sagips_data_scale]
    python benchmarks/data_scale.py --smoke --out DIR          # 1e5 events, N = 1, 2, blocks only (tests/)

For each size, `mpiexec -n 2 python -m sagips.data proxy1d` writes the file (two part files joined by a virtual
dataset) under --tmp; then for N ranks and each `data.subset` mode, `mpiexec -n N` runs 2 epochs of the quick preset
(8 parameter sets) on it, every rank wrapped by this script (`--child`), which records the rank's peak resident
memory (ru_maxrss), the rows h5py returned to it (patched `Dataset.__getitem__` and `read_direct`) and its bytes
read (/proc rchar). run.json gives `startup_s` and rank 0's phases, the state directory one state file. Each part
runs --repeats times and keeps the run of the median start-up; the bound's read is timed in as many fresh processes
(median). A run without a data file (1,000 generated events) gives the start-up without data. Each part is a JSON
file in docs/benchmarks/data_scale/, skipped when it exists (delete it to rerun); the files are deleted after their
size. The page, docs/benchmarks/data_scale.md, is generated whole from the JSON; notes by hand go into
docs/benchmarks/data_scale_notes.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FRACTION = 0.5  # the quick preset's subset_fraction (the paper's)
NOTES = "data_scale_notes.md"
RUN = ["--config", "configs/proxy1d-quick.yaml", "--mode", "ensemble", "--epochs", "2", "--no-progress",
       "--set", "environment.param_samples=8", "--set", "train.quality_samples=8", "--set", "train.amp=none",
       "--set", "train.state_every=2", "--set", "train.checkpoint_every=2", "--set", "train.log_every=1",
       "--set", "ensemble.analyze=false"]  # (measured: the data's path; no p^ +- sigma at the end)
# the measurements of the old path (rank 0 read the file and broadcast all of it; states held the indices)
OLD = {"ranks": 4, "file_growth_mb": 137, "rss_growth_mb": 274, "state_mb": {"2M": 9.2, "4M": 17.2, "20M": 81}}


# ----------------------------------------------------------------------------------------------- one rank (child)
def child(out_dir: str, args: list[str]) -> int:
    """Under mpiexec: sagips.run on this rank, then OUT/rankR.json with what the rank held and read."""
    import resource

    import torch  # noqa: F401  (imported before rchar0: its files are not the data's)
    from mpi4py import MPI

    from sagips.run import main
    from tests._h5count import count_reads

    read = count_reads("/events")
    rchar0 = _rchar()
    rc = main(args)
    rank = MPI.COMM_WORLD.rank
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "rc": rc, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
        "rows_read": read["rows"], "read_calls": read["calls"], "rchar_mb": (_rchar() - rchar0) / 1e6,
        "pss_mb": _pss_mb()}))
    return rc


def _pss_mb() -> float | None:
    """This process's proportional set size now (MB): shared pages (a node's window) count 1/(ranks mapping them)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return None


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


# ----------------------------------------------------------------------------------------------- the parent
def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def write_file(events: int, path: Path) -> dict:
    t0 = time.time()
    p = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "sagips.data", "proxy1d", "--events",
                        str(events), "--out", str(path), "--no-progress"], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=1200)
    if p.returncode != 0:
        raise SystemExit(f"data_scale: writing {path} failed:\n{p.stderr[-2000:]}")
    wall = time.time() - t0
    files = [path, *sorted(path.parent.glob(path.stem + ".part*"))]
    return {"write_s": round(wall, 2), "file_mb": sum(f.stat().st_size for f in files) / 1e6,
            "events_mb": events * 8 / 1e6, "write_ranks": 2}


def cached_read(path: Path, repeats: int) -> dict:
    """Seconds for a fresh process to read FRACTION of the file in blocks (as one rank does: `shard.read_subset`
    into new memory) from the page cache, warmed first: the median of `repeats` processes. On a virtual machine the
    first touch of new memory varies several-fold from process to process, hence fresh processes and a median."""
    from sagips.io import shard

    for f in [path, *sorted(path.parent.glob(path.stem + ".part*"))]:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    layout = shard.read_layout(path, {"events": 2})
    code = ("import sys, time; from sagips.io import shard; p = sys.argv[1]; "
            "lay = shard.read_layout(p, {'events': 2}); r = shard.subset_ranges(1, lay, %r, 'blocks'); "
            "t = time.perf_counter(); a = shard.read_subset(p, lay, r, {'events': 2}); "
            "print(time.perf_counter() - t, len(a['events']))" % FRACTION)
    times = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"data_scale: the timed read of {path} failed:\n{p.stderr[-2000:]}")
        dt, rows = p.stdout.split()
        times.append(float(dt))
    import h5py

    with h5py.File(path, "r") as f:
        virtual = f["events"].is_virtual
    return {"cached_read_half_s": round(sorted(times)[len(times) // 2], 3), "cached_read_all_s": times,
            "layout_bytes": len(json.dumps(layout)), "virtual": virtual, "block_rows": shard.block_rows(layout),
            "read_rows": int(rows)}


def run(n: int, data: Path | None, mode: str, work: Path) -> dict:
    out, ranks_dir = work / "run", work / "ranks"
    shutil.rmtree(work, ignore_errors=True)
    ranks_dir.mkdir(parents=True)
    subset = ["--set", "data.subset=blocks", "--set", "data.share=node"] if mode == "node" else \
        ["--set", f"data.subset={mode}"]  # node: blocks, one copy per node in a shared window (data.share=node)
    extra = (["--set", f"environment.data_file={data}", *subset] if data else
             ["--set", "environment.reference_events=1000"])
    t0 = time.time()
    p = subprocess.run([_mpiexec(), "-n", str(n), sys.executable, str(Path(__file__).resolve()), "--child",
                        str(ranks_dir), "--", *RUN, *extra, "--output-dir", str(out)], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"data_scale: the run (N={n}, {data}, {mode}) failed:\n{p.stderr[-2000:]}")
    info = json.loads((out / "run.json").read_text())
    ranks = sorted((json.loads(f.read_text()) for f in ranks_dir.glob("rank*.json")), key=lambda r: r["rank"])
    states = sorted((out / "state" / "rank0000").glob("*.pt"))
    return {"ranks": n, "mode": mode if data else "none", "command_wall_s": round(wall, 2),
            "startup_s": info["startup_s"], "phases": info["startup"]["rank0_phases_s"],
            "reference_data": info.get("reference_data"), "per_rank": ranks,
            "state_mb": states[-1].stat().st_size / 1e6 if states else None}


def run_median(n: int, data: Path | None, mode: str, work: Path, repeats: int) -> dict:
    """`run` `repeats` times: the run of the median start-up (with its memory and reads), and every start-up."""
    res = [run(n, data, mode, work) for _ in range(repeats)]
    best = sorted(res, key=lambda x: x["startup_s"])[len(res) // 2]
    return {**best, "startup_all_s": [x["startup_s"] for x in res]}


def label(events: int) -> str:
    e = len(str(events)) - 1
    return f"1e{e}" if events == 10**e else str(events)


def measure(a) -> list[dict]:
    parts_dir = Path(a.out) / "data_scale"
    parts_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(a.tmp)
    from benchmarks.loop_closure import machine

    mach = machine()
    for n in a.ranks:  # the start-up without data
        part = parts_dir / f"none_n{n}.json"
        if not part.exists() and not a.smoke:
            load = os.getloadavg()[0]
            res = run_median(n, None, "none", tmp / "work", a.repeats)
            part.write_text(json.dumps({"size": "none", "events": 0, "machine": mach, "load_before": load, **res}, indent=1) + "\n")
            print(f"data_scale: no data, N={n}: startup {res['startup_s']:.2f} s", flush=True)
    for events in a.sizes:
        name = label(events)
        todo = [(n, m) for n in a.ranks for m in a.modes if not (parts_dir / f"{name}_{m}_n{n}.json").exists()
                and not (m == "rows" and events > a.rows_max)]
        if not todo and (parts_dir / f"{name}_file.json").exists():
            continue
        need = events * 8 * 1.1 + (1 << 30)
        if shutil.disk_usage(tmp.parent if not tmp.exists() else tmp).free < need:
            raise SystemExit(f"data_scale: {tmp} has too little free disk for {name} events ({need / 2**30:.1f} GB)")
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / f"proxy1d_{name}.h5"
        try:
            load = os.getloadavg()[0]
            info = write_file(events, path)
            file_part = parts_dir / f"{name}_file.json"
            if not file_part.exists():  # (kept when only runs are added: the page's bound stays the one measured)
                info.update(cached_read(path, a.repeats))
                file_part.write_text(json.dumps({"size": name, "events": events, "machine": mach, "load_before": load,
                                                 **info}, indent=1) + "\n")
            print(f"data_scale: {name}: written in {info['write_s']:.1f} s, {info['file_mb']:.0f} MB", flush=True)
            for n, mode in todo:
                load = os.getloadavg()[0]
                res = run_median(n, path, mode, tmp / "work", a.repeats)
                (parts_dir / f"{name}_{mode}_n{n}.json").write_text(json.dumps(
                    {"size": name, "events": events, "machine": mach, "load_before": load, **res}, indent=1) + "\n")
                rss = max(r["maxrss_mb"] for r in res["per_rank"])
                print(f"data_scale: {name} {mode} N={n}: startup {res['startup_s']:.2f} s, peak RSS {rss:.0f} MB, "
                      f"state {res['state_mb']:.2f} MB", flush=True)
        finally:
            for f in tmp.glob(f"proxy1d_{name}*"):
                f.unlink()
            shutil.rmtree(tmp / "work", ignore_errors=True)
    return [json.loads(p.read_text()) for p in sorted(parts_dir.glob("*.json"))]


# ----------------------------------------------------------------------------------------------- the page
def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = c + s x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - s * mx, s


def _gb(mb: float) -> str:
    """MB (10^6 bytes) as text, in GB from 1000 MB and in TB from 10^6 MB."""
    if mb >= 1e6:
        return f"{mb / 1e6:,.1f} TB"
    return f"{mb / 1000:,.1f} GB" if mb >= 1000 else f"{mb:,.0f} MB" if mb >= 10 else f"{mb:.2f} MB"


def write_page(parts: list[dict], path: Path) -> None:
    from benchmarks.loop_closure import describe_machine

    files = {p["size"]: p for p in parts if "write_s" in p}
    runs = [p for p in parts if "per_rank" in p]
    none = {p["ranks"]: p for p in runs if p["mode"] == "none"}
    data = sorted((p for p in runs if p["mode"] != "none"), key=lambda p: (p["events"], p["mode"], p["ranks"]))
    machines = sorted({describe_machine(p["machine"]) for p in parts})
    L = ["# Reference data at scale: what each rank holds, reads and saves", "",
         f"<!-- generated whole by benchmarks/data_scale.py from docs/benchmarks/data_scale/*.json; notes by hand go "
         f"into {NOTES}, which the script never writes -->", "",
         "Machine: " + ("; ".join(machines) if machines else "no part has run yet") + ".", "",
         f"Hand-written notes: [{NOTES}]({NOTES}).", "",
         "Command: `python benchmarks/data_scale.py` (files of proxy1d events written by `mpiexec -n 2 python -m "
         "sagips.data proxy1d`, two part files joined by an HDF5 virtual dataset; each run `mpiexec -n N python -m "
         "sagips.run --config configs/proxy1d-quick.yaml --mode ensemble --epochs 2` with 8 parameter sets, "
         f"subset_fraction {FRACTION}, one state saved at epoch 2).", "",
         "The machine was shared with other jobs: *load before* is its 1-minute load average (2 cores) when a part "
         "started; times grow with it, memory, rows and sizes do not.", "",
         "## Files", "", "| events | file | written in (2 ranks) | rows per block | layout broadcast | "
         "one rank's half read from the page cache | load before |", "|---|---|---|---|---|---|---|"]
    for name, f in sorted(files.items(), key=lambda kv: kv[1]["events"]):
        L.append(f"| {name} | {_gb(f['file_mb'])} | {f['write_s']:.1f} s ({f['events'] / f['write_s'] / 1e6:.2f} "
                 f"M events/s) | {f['block_rows']} | {f['layout_bytes']} B | {f['cached_read_half_s']:.2f} s | "
                 f"{f.get('load_before', 0):.1f} |")
    L += ["", "## Runs", "",
          "Per rank: the largest over the ranks. *rows read* are the event rows that h5py returned to the rank "
          "(`blocks`: its own subset; `rows`: the whole file, in blocks, of which it keeps its rows); *rchar* the "
          "bytes the process read after its imports (Python modules included). The start-up runs from the launch "
          "of the processes to the first epoch (slowest rank); *reference data* is rank 0's phase of it.", "",
          "| events | subset | N | startup_s | reference data (rank 0) | peak RSS per rank | rows read per rank | "
          "rchar per rank | state file | load before |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, p in sorted(none.items()):
        L.append(f"| none (1,000 generated) | – | {n} | {p['startup_s']:.2f} s | "
                 f"{p['phases'].get('reference_data', 0):.2f} s | {_gb(max(r['maxrss_mb'] for r in p['per_rank']))} "
                 f"| 0 | {_gb(max(r['rchar_mb'] for r in p['per_rank']))} | {p['state_mb']:.2f} MB | "
                 f"{p.get('load_before', 0):.1f} |")
    for p in data:
        pr = p["per_rank"]
        L.append(f"| {p['size']} | {p['mode']} | {p['ranks']} | {p['startup_s']:.2f} s | "
                 f"{p['phases'].get('reference_data', 0):.2f} s | {_gb(max(r['maxrss_mb'] for r in pr))} | "
                 f"{max(r['rows_read'] for r in pr):,} (rank 0: {pr[0]['rows_read']:,}) | "
                 f"{_gb(max(r['rchar_mb'] for r in pr))} | {p['state_mb']:.2f} MB | {p.get('load_before', 0):.1f} |")
    L += _figures(files, none, data)
    path.write_text("\n".join(L) + "\n")


def _figures(files: dict, none: dict, data: list[dict]) -> list[str]:
    """The issue's figures, checked, and each figure projected to 400 ranks and 1e10 events."""
    L = ["", "## The issue's figures", ""]
    blocks = [p for p in data if p["mode"] == "blocks"]
    if not blocks:
        return L + ["No sharded run yet."]
    ns = sorted({p["ranks"] for p in blocks})
    ratios = []
    for n in ns:
        pts = sorted((p["events"] * 8 / 1e6, max(r["maxrss_mb"] for r in p["per_rank"]))
                     for p in blocks if p["ranks"] == n)
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            ratios.append((n, x0, x1, (y1 - y0) / (x1 - x0)))
    if ratios:
        worst = max(r[3] for r in ratios)
        each = ", ".join(f"N={n} {_gb(a)}→{_gb(b)}: {r:.2f}×" for n, a, b, r in ratios)
        L.append(f"- **Peak memory per rank grows by at most {worst:.2f}× the file's growth** (wanted ≤ 0.7× at "
                 f"subset {FRACTION}; {'met' if worst <= 0.7 else 'missed'}): {each}. The old broadcast path, "
                 f"measured in the issue with {OLD['ranks']} ranks: +{OLD['rss_growth_mb']} MB per rank for "
                 f"+{OLD['file_growth_mb']} MB of file, 2.0×.")
    states = sorted({round(p["state_mb"], 2) for p in data})
    L.append(f"- **State file size**: {', '.join(f'{s:.2f} MB' for s in states)} at every size, N and mode (wanted: "
             f"independent of the events, about 1.2 MB; {'met' if max(states) - min(states) < 0.05 else 'missed'}). "
             f"The old path stored the subset's indices: {OLD['state_mb']['2M']} MB at 2M events, "
             f"{OLD['state_mb']['4M']} MB at 4M, {OLD['state_mb']['20M']} MB at 20M.")
    lay = max(f["layout_bytes"] for f in files.values())
    L.append(f"- **Event data over MPI at start-up: none.** Only the layout crosses MPI (at most {lay} B here: "
             f"names, shapes, chunk rows, attributes and the part files' names), by construction "
             f"(`sagips/io/shard.py`, `load_subset`); every rank's rows above come from its own h5py reads.")
    big = max(blocks, key=lambda p: (p["events"], p["ranks"]))
    if big["size"] in files:
        half = files[big["size"]]["cached_read_half_s"]
        cores = big["machine"].get("cores") or 1
        L.append(f"- **Start-up at {big['size']} events** (medians of the runs; the bound: the start-up without data "
                 f"+ {half:.2f} s, the median time for a fresh process to read half the file from the page cache):")
        for p in sorted((p for p in blocks if p["size"] == big["size"] and p["ranks"] in none),
                        key=lambda p: p["ranks"]):
            n, base = p["ranks"], none[p["ranks"]]["startup_s"]
            ok = p["startup_s"] <= base + half
            line = (f"  - N={n}: {p['startup_s']:.2f} s against {base:.2f} + {half:.2f} = {base + half:.2f} s "
                    f"({'met' if ok else 'missed'}; rank 0's reference-data phase {p['phases'].get('reference_data', 0):.2f} s "
                    f"against {none[n]['phases'].get('reference_data', 0):.2f} s without data)")
            if n > cores:  # the N reads share the cores: at least ceil(N / cores) lone reads one after the other
                k = -(-n // cores)
                ok2 = p["startup_s"] <= base + k * half
                line += (f"; {n} ranks on {cores} cores read at least {k} halves one after another: {base:.2f} + "
                         f"{k} × {half:.2f} = {base + k * half:.2f} s ({'met' if ok2 else 'missed'})")
            L.append(line)
        for p in sorted((p for p in data if p["mode"] == "node" and p["size"] == big["size"] and p["ranks"] in none),
                        key=lambda p: p["ranks"]):
            n, base = p["ranks"], none[p["ranks"]]["startup_s"]
            ok = p["startup_s"] <= base + half
            pss = [r.get("pss_mb") for r in p["per_rank"]]
            mem = (f"; memory per rank at the end, shared pages divided among the ranks (PSS): at most "
                   f"{_gb(max(pss))}, against {_gb(max(r['maxrss_mb'] for r in p['per_rank']))} peak RSS, which "
                   f"counts the whole window in every rank" if all(x is not None for x in pss) else "")
            L.append(f"  - N={n} with `data.share: node` (the node's ranks read its one subset, each 1/{n} of it, into a "
                     f"shared window): {p['startup_s']:.2f} s against {base:.2f} + {half:.2f} = {base + half:.2f} s "
                     f"({'met' if ok else 'missed'}){mem}")
    L += ["", "## Projected to 400 ranks and 10¹⁰ events (80 GB)", "",
          "Lines fitted to the sharded (`blocks`) runs over the file sizes, per rank; the old path's from the issue's "
          "measurements.", "", "| figure | grows with | here (largest run) | at 10¹⁰ events, 400 ranks | old broadcast "
          "path at 10¹⁰, 400 ranks |", "|---|---|---|---|---|"]
    n_max = max(ns)
    pts = sorted((p["events"] * 8 / 1e6, max(r["maxrss_mb"] for r in p["per_rank"])) for p in blocks
                 if p["ranks"] == n_max)
    c, s = _fit([x for x, _ in pts], [y for _, y in pts])
    mb10 = 1e10 * 8 / 1e6
    L.append(f"| peak RSS per rank | the data (× subset_fraction), not N | {_gb(pts[-1][1])} | "
             f"{_gb(c + s * mb10)} ({_gb(c)} + {s:.2f} × file) | {_gb(2 * mb10)} + the same constant (2.0 × file) |")
    L.append(f"| event rows read per rank | the data (× subset_fraction), not N | "
             f"{max(r['rows_read'] for r in big['per_rank']):,} | {FRACTION * 1e10:,.0f} ({_gb(FRACTION * mb10)}) | "
             f"rank 0: 10¹⁰ (80 GB); the others receive it over MPI |")
    L.append(f"| event rows read by the job | the data × N | {sum(r['rows_read'] for r in big['per_rank']):,} | "
             f"{400 * FRACTION * 1e10:,.0f} ({_gb(400 * FRACTION * mb10)} from the file system) | 10¹⁰ read, "
             f"{_gb(399 * mb10)} sent over MPI |")
    lay = max(f["layout_bytes"] for f in files.values())
    L.append(f"| bytes over MPI at start-up | neither (the layout; a few names per part file) | {lay} B | about "
             f"{lay} B + 30 B per part file | {_gb(399 * mb10)} |")
    L.append(f"| state file | neither | {big['state_mb']:.2f} MB | {big['state_mb']:.2f} MB | indices: "
             f"{_gb(FRACTION * mb10)} per rank, {_gb(400 * FRACTION * mb10)} per save |")
    sizes = sorted({p["events"] for p in blocks})
    half = {f["events"]: f["cached_read_half_s"] for f in files.values()}
    if len(sizes) > 1 and all(e in half for e in sizes):
        c2, s2 = _fit([float(e) for e in sizes], [half[e] for e in sizes])
        L.append(f"| start-up | the data per rank (the read), plus N through the launch | {big['startup_s']:.2f} s | "
                 f"≥ {c2 + s2 * 1e10:,.0f} s to read 40 GB per rank from the page cache at this machine's rate; "
                 f"from a parallel file system: 16 TB in all at its aggregate bandwidth | rank 0 reads 80 GB, then "
                 f"the broadcast of 80 GB to 399 ranks |")
    return L


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7,1e8", help="events per file, comma-separated")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--modes", default="blocks,rows", help="data.subset modes, and `node` (blocks with "
                    "data.share=node: one copy per node)")
    ap.add_argument("--rows-max", type=float, default=1e6, help="no `rows` run above this many events (the row "
                    "mode keeps ~120 B per kept row per rank and walks the rows in Python: 6 GB per rank at 1e8)")
    ap.add_argument("--tmp", default="/tmp/sagips_data_scale", help="where the data files are written and deleted")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ap.add_argument("--repeats", type=int, default=3, help="runs per part (and timed reads per file); the page "
                    "gives the median start-up: on a shared virtual machine one start-up varies by tens of percent")
    ap.add_argument("--smoke", action="store_true", help="1e5 events, N = 1, 2, blocks only: a check that it runs")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    if a.smoke:
        a.sizes, a.ranks, a.modes, a.repeats = "1e5", "1,2", "blocks", 1
    a.sizes = [int(float(x)) for x in a.sizes.split(",")]
    a.ranks = [int(x) for x in a.ranks.split(",")]
    a.modes = a.modes.split(",")
    parts = measure(a)
    write_page(parts, Path(a.out) / "data_scale.md")
    print(f"data_scale: wrote {Path(a.out) / 'data_scale.md'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[sys.argv.index("--") + 1:]))
    sys.exit(main())
