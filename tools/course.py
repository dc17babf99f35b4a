"""Execute the course: run every numbered notebook in nbs/ on the profile it is about and write its outputs back into
the notebook, so that a reader on GitHub, nbviewer or Kaggle sees what a run shows (`make course` calls this).

    make course                                   # all notebooks, in order (about an hour on 2 CPU cores)
    .venv/bin/python tools/course.py 03 04 05     # some of them (05 and 06 read the checkpoint 04 trains)
    .venv/bin/python tools/course.py --tidy X.ipynb   # only make an executed notebook fit to commit (benchmarks/run.py)

What it does, per notebook: papermill executes a copy with the parameters below (the source in nbs/ is never edited by
the run); the outputs are copied back cell by cell, made fit to read (progress bars settled to their last frame, paths
of this machine made relative, a deliberate error shown as its one-line message), and the notebook's "Outputs on this
page" line says which profile, hardware and how long. `nbdev_clean` then strips execution metadata, not the outputs.
The tests (`nbdev_test`, the papermill rehearsal) run the notebooks from scratch and never write back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"
COURSE_RUN_TAG = "course-run"  # the markdown cell under each notebook's title that says how its outputs were made
ERROR_TAG = "raises-exception"  # Jupyter's tag for a cell that fails on purpose (its error stays, shortened)

# The profile each notebook is about, and what a reader should know about its outputs. `cpu` is the real thing: all
# 10,429 training rows and all 7,600 test rows. The demonstrations in 00 and 08-11 use their own small inputs anyway.
PLAN = {
    "03": dict(
        params={}, note="the full `cpu` run in one process: all 10,429 training rows, 3 epochs, all 7,600 test rows"
    ),
    "04": dict(
        params={},
        note="the torchrun cell trains the `cpu` profile with 2 workers into `runs/cpu/` "
        "(notebooks 05 and 06 use that checkpoint)",
    ),
    "05": dict(params={}, needs="runs/cpu/checkpoint", note="predictions from the checkpoint notebook 04 trained"),
    "06": dict(params={}, needs="runs/cpu/checkpoint", note="the API serves the checkpoint notebook 04 trained"),
    "07": dict(
        params={"measure": ""},
        note="nothing is re-measured on this page: each section shows the committed results, `benchmarks/results/`, as "
        "`benchmarks/report.py` renders them (`benchmarks/run.py` measures them, see its header)",
    ),
}
PROFILE = "cpu"


def hardware() -> str:
    "This machine in a few words: the CPU model and cores, and the GPUs if any."
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor() or platform.machine()
    )
    import torch

    gpus = torch.cuda.device_count()
    gpu = f", {gpus} x {torch.cuda.get_device_name(0)}" if gpus else ", no GPU"
    # the CPU kernels torch uses (AVX2, AVX512), and bf16 in hardware: what decides fp32 or bf16 on a CPU (notebook 01)
    isa = torch.backends.cpu.get_cpu_capability() + (" with BF16" if torch.cpu._is_avx512_bf16_supported() else "")
    isa += " and AMX" if torch.cpu._is_amx_tile_supported() else ""
    return f"{model} ({os.cpu_count()} cores, {isa}{gpu}), torch {torch.__version__}"


# Warnings that say nothing about the course: tqdm.auto's complaint in a kernel without ipywidgets (its bars still work,
# as text). `main` silences it in the kernels it starts; this drops it from notebooks executed elsewhere.
# Also torchrun's banner that it set OMP_NUM_THREADS=1 for each worker (what the course wants on CPUs: said in 04's
# prose) and the profiler's start/stop lines (kineto writes them to stderr, sometimes inside a progress bar's line).
NOISE = re.compile(
    r"[^\n]*TqdmWarning: IProgress not found[^\n]*\n(  from \.autonotebook import[^\n]*\n)?"
    r"|W\d{4} [\d:.]+ \d+ torch/distributed/run\.py:\d+\][^\n]*\n"
    r"|USDT:[\d-]+ [\d:]+ \d+:\d+ SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)\n"
)
# gloo's error messages open with its source file on PyTorch's build machine: "[/__w/pytorch/.../pair.cc:537] "
GLOO_SOURCE = re.compile(r"\[/__w/pytorch/pytorch/third_party/gloo/[^\]]*\] ")


# one tqdm frame: "Tokenizing:  98%|█████████▊| 1000/1024 [00:00<00:00, 6798.04 examples/s]"
_FRAME = r"[^\n|\]]*?: *\d{1,3}%\|[^|\n]*\|[^\n\[]*\[[^\]\n]*\]"


def _settle(text: str) -> str:
    """Keep only the last frame of every line a progress bar redrew with carriage returns; a frame with more text after
    it on its line (another frame, or the line that followed a bar that never settled) goes."""
    text = "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))
    return re.sub(f"{_FRAME}(?=[^\\s])", "", text)


def tidy_text(text: str, root: Path = ROOT) -> str:
    """Text fit to publish: progress bars settled; this clone's folder made relative, scratch folders without
    their random letters, installed packages named without this machine's paths."""
    text = re.sub(
        r"/[^\s'\"]*/(site|dist)-packages/", "", GLOO_SOURCE.sub("", _settle(NOISE.sub("", text)))
    )  # a library's file: named from its package
    text = text.replace(str(root) + "/", "").replace(str(root), ".")
    # a scratch folder keeps its readable name, not the random letters tempfile adds: /tmp/distrinews-fault-…/checkpoint
    return re.sub(r"/tmp/([^\s'\"),/]*?)[a-z0-9_]{8}(?=[/\s'\"),]|$)", "/tmp/\\1…", text)


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _merged_streams(outputs: list) -> list:
    "Consecutive outputs of one stream joined into one (a progress bar arrives as one output per redraw)."
    merged = []
    for out in outputs:
        if (
            merged
            and out.get("output_type") == "stream"
            and merged[-1].get("output_type") == "stream"
            and merged[-1]["name"] == out["name"]
        ):
            merged[-1] = dict(merged[-1], text="".join(merged[-1]["text"]) + "".join(out["text"]))
        else:
            merged.append(dict(out))
    return merged


def tidy_outputs(cell: dict, root: Path = ROOT) -> dict:
    "The cell with outputs fit to read and commit (see `tidy_text`); a deliberate error keeps only its last line."
    outputs = []
    for out in _merged_streams(cell.get("outputs", [])):
        if out.get("output_type") == "stream":
            text = re.sub(r"\n{3,}", "\n\n", tidy_text("".join(out["text"]), root))  # no runs of blank lines
            if not text.strip():
                continue
            out["text"] = _lines(text)
        elif out.get("output_type") == "error":
            out["traceback"] = [f"{out['ename']}: {tidy_text(out['evalue'], root)}"]
            out["evalue"] = tidy_text(out["evalue"], root)
        else:
            data = dict(out.get("data", {}))
            for kind in [k for k in data if k.startswith("text/")]:
                value = data[kind] if isinstance(data[kind], str) else "".join(data[kind])
                data[kind] = _lines(tidy_text(value, root))
            out["data"] = data
        if "execution_count" in out:
            out["execution_count"] = None
        outputs.append(out)
    return dict(cell, outputs=outputs, execution_count=None)


def tidy(path: Path, root: Path = ROOT):
    """Tidy every output of the notebook at `path` in place (used for the executed benchmark notebooks too), and the
    parameters papermill injected and recorded in the metadata: they name folders of this machine too."""
    nb = json.loads(Path(path).read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            nb["cells"][i] = cell = tidy_outputs(cell, root)
        if "injected-parameters" in cell["metadata"].get("tags", []):
            cell["source"] = _lines(tidy_text("".join(cell["source"]), root))
    if "papermill" in nb["metadata"]:
        nb["metadata"]["papermill"] = json.loads(tidy_text(json.dumps(nb["metadata"]["papermill"]), root))
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def course_run_line(profile: str, params: dict, seconds: float, note: str = "") -> str:
    "The text of a notebook's 'Outputs on this page' cell."
    extra = "".join(f", `{k}={v!r}`" for k, v in params.items())
    took = f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return (
        f"*Outputs on this page: profile `{profile}`{extra}, executed by `make course` on {hardware()}, "
        f"{datetime.date.today():%Y-%m-%d}; the whole notebook ran in {took}.*" + (f" *Here: {note}.*" if note else "")
    )


def execute(notebook: Path, profile: str, params: dict) -> tuple[dict, float]:
    "Run a copy of `notebook` with papermill in nbs/; return the executed notebook and its wall time."
    import papermill as pm

    with tempfile.TemporaryDirectory(prefix="distrinews-course-") as scratch:
        executed = Path(scratch) / notebook.name
        started = time.perf_counter()
        pm.execute_notebook(
            notebook,
            executed,
            parameters=dict(profile=profile, **params),
            cwd=NBS,
            progress_bar=False,
            log_output=False,
        )
        return json.loads(executed.read_text()), time.perf_counter() - started


def write_back(notebook: Path, executed: dict, line: str):
    "Copy the executed outputs into the notebook's own cells (sources untouched) and fill its course-run cell."
    nb = json.loads(notebook.read_text())
    ran = [c for c in executed["cells"] if "injected-parameters" not in c["metadata"].get("tags", [])]
    if [c["source"] for c in ran] != [c["source"] for c in nb["cells"]]:
        raise RuntimeError(f"{notebook.name} changed while it ran; run it again.")
    for mine, theirs in zip(nb["cells"], ran):
        if mine["cell_type"] == "code":
            tidied = tidy_outputs(theirs)
            mine["outputs"], mine["execution_count"] = tidied["outputs"], None
        if COURSE_RUN_TAG in mine["metadata"].get("tags", []):
            mine["source"] = _lines(line)
    notebook.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("only", nargs="*", help="notebook numbers to run (default: every numbered notebook)")
    p.add_argument(
        "--tidy", nargs="+", metavar="NOTEBOOK", help="only tidy these executed notebooks in place (benchmarks/run.py)"
    )
    a = p.parse_args(argv)
    if a.tidy:
        for path in a.tidy:
            tidy(Path(path))
        return
    notebooks = sorted(NBS.glob("[0-9][0-9]_*.ipynb"))
    if a.only:
        notebooks = [n for n in notebooks if n.name[:2] in a.only]
    if not notebooks:
        p.error(f"no notebook matches {a.only}")
    from distrinews.model import env_overrides

    for field in [*env_overrides(), "profile"]:  # the outputs must show the profile itself
        os.environ.pop(f"DISTRINEWS_{field.upper()}", None)
    if os.environ.get("DISTRINEWS_DATA_DIR"):  # from where this was started: the notebooks run in nbs/
        os.environ["DISTRINEWS_DATA_DIR"] = str(Path(os.environ["DISTRINEWS_DATA_DIR"]).expanduser().resolve())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # tqdm.auto (imported by datasets and transformers) warns in every kernel without ipywidgets; its progress bars
    # work as text anyway, and text is what a committed notebook can show (widgets render as nothing on GitHub)
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"])
    )
    total = time.perf_counter()
    for notebook in notebooks:
        plan = PLAN.get(notebook.name[:2], {})
        needs = plan.get("needs")
        if needs and not (ROOT / needs).exists():
            sys.exit(
                f"{notebook.name} shows the model notebook 04 trains, and {needs} does not exist: run 04 first "
                f"(`tools/course.py 04 {notebook.name[:2]}`)."
            )
        print(f"== {notebook.name} (profile {PROFILE})", flush=True)
        executed, seconds = execute(notebook, PROFILE, plan.get("params", {}))
        write_back(notebook, executed, course_run_line(PROFILE, plan.get("params", {}), seconds, plan.get("note", "")))
        print(f"   {seconds / 60:.1f} min", flush=True)
    for notebook in sorted(NBS.glob("[0-9][0-9]_*.ipynb")):
        tidy(notebook)  # idempotent: also what ran before
    subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", str(NBS)], check=True, cwd=ROOT)
    print(f"course executed in {(time.perf_counter() - total) / 60:.1f} min")


if __name__ == "__main__":
    main()
