"""The course as a reader sees it on GitHub: every numbered notebook is committed with the outputs of a real run
(`make course`, tools/course.py), and no output shows this machine's paths, a stray warning or an unexpected traceback.
Also: prose that sends the reader to "notebook NN" points at a notebook that exists."""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
course = load_script(ROOT / "tools" / "course.py")

NOTEBOOKS = sorted((ROOT / "nbs").glob("[0-9][0-9]_*.ipynb"))
EXECUTED = NOTEBOOKS + sorted((ROOT / "benchmarks" / "runs").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"/work/|/tmp/(?![\w.-]*…)|/root/|/home/[a-z]|site-packages")  # /tmp/name-…: tidied
WITH_IMAGE = {"00", "03", "04", "07"}
# calls that end a cell without showing anything (checks, clean-up)
SILENT_CALLS = re.compile(
    r"^(test_\w*|assert\w*|shutdown_workers|close|rmtree|shutdown|manual_seed|"
    r"set_num_threads|destroy_process_group|cleanup_distributed|write_text|mkdir|unlink)$"
)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def tags(cell) -> list:
    return cell["metadata"].get("tags", [])


def outputs_text(cell) -> str:
    "Everything a cell's outputs show as text (streams, rich text, errors)."
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif out["output_type"] == "error":
            parts += [out["ename"], out["evalue"], *out["traceback"]]
        else:
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/"):
                    parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def shows_something(source: str) -> bool:
    """A cell a reader expects output from: it prints, plots, displays, runs a shell command or a `%%writefile`, or ends
    in an expression (not a check such as `test_eq(...)`). Exported and hidden cells never count."""
    if source.startswith(("#|export", "#|hide")):
        return False
    if source.startswith("%%writefile"):
        return True
    lines = source.splitlines()
    if any(line.lstrip().startswith("!") for line in lines):
        return True
    body = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "#|")))
    try:
        statements = ast.parse(body).body
    except SyntaxError:
        return False

    def name(call):
        return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")

    # prints/plots run by the cell itself (not inside a function or class it only defines)
    run = [s for s in statements if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    calls = [n for s in run for n in ast.walk(s) if isinstance(n, ast.Call)]
    if any(name(c) in ("print", "display", "show", "Markdown", "show_outputs") for c in calls):
        return True
    if not statements or not isinstance(statements[-1], ast.Expr):
        return False
    value = statements[-1].value
    if isinstance(value, ast.Constant):
        return False
    return not (isinstance(value, ast.Call) and SILENT_CALLS.match(name(value)))


def test_shows_something_tells_printing_cells_from_silent_ones():
    assert shows_something("x = 1\nprint(x)") and shows_something("!torchrun --standalone x.py")
    assert shows_something("df.head()") and shows_something("x") and shows_something("%%writefile a.py\nprint()")
    assert (
        not shows_something("test_eq(1, 1)")
        and not shows_something("x = 1")
        and not shows_something("#|export\nprint(1)")
    )
    assert not shows_something("shutil.rmtree(d)") and not shows_something("def f():\n    print(1)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_with_its_outputs(path):
    nb = load(path)
    expected = [c for c in nb["cells"] if c["cell_type"] == "code" and shows_something("".join(c["source"]))]
    empty = [("".join(c["source"])[:70]) for c in expected if not c["outputs"]]
    assert expected, f"{path.name}: no cell prints or plots?"
    shown = 1 - len(empty) / len(expected)
    assert shown >= 0.8, (
        f"{path.name}: only {shown:.0%} of the {len(expected)} cells that print or plot have outputs "
        f"(run `make course`); empty: {empty}"
    )
    run_line = [c for c in nb["cells"] if course.COURSE_RUN_TAG in tags(c)]
    assert len(run_line) == 1, f"{path.name}: needs one markdown cell tagged {course.COURSE_RUN_TAG!r} under its title"
    text = "".join(run_line[0]["source"])
    assert re.search(r"profile `\w+`.*executed by `make course` on .+ ran in [\d.]+ (s|min)", text), (
        f"{path.name}: its outputs do not say how they were made (run `make course`): {text!r}"
    )


@pytest.mark.parametrize("number", sorted(WITH_IMAGE))
def test_notebook_shows_a_chart(number):
    nb = load(next(p for p in NOTEBOOKS if p.name.startswith(number)))
    assert any(
        "image/png" in out.get("data", {}) for c in nb["cells"] if c["cell_type"] == "code" for out in c["outputs"]
    )


@pytest.mark.parametrize("number", ["03", "04"])
def test_training_notebooks_show_the_cpu_profile_on_the_whole_test_set(number):
    nb = load(next(p for p in NOTEBOOKS if p.name.startswith(number)))
    text = "\n".join(outputs_text(c) for c in nb["cells"] if c["cell_type"] == "code")
    assert "profile 'cpu'" in text, f"{number}: its outputs are not from the cpu profile"
    found = re.findall(r"accuracy [^\n]*?(\d+\.\d)% on 7600 test rows", text)
    assert found, f"{number}: no test accuracy over all 7,600 rows in its outputs"
    assert float(found[-1]) > 85, found


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_outputs_are_fit_to_publish(path):
    problems = []
    for i, cell in enumerate(c for c in load(path)["cells"] if c["cell_type"] == "code"):
        text, on_purpose = outputs_text(cell), "raises-exception" in tags(cell)
        stderr = "\n".join("".join(o["text"]) for o in cell["outputs"] if o.get("name") == "stderr")
        where = f"code cell {i} ({''.join(cell['source'])[:50]!r})"
        if MACHINE_PATH.search(text):
            problems.append(f"{where}: a machine path: {MACHINE_PATH.search(text).group()}")
        if not on_purpose and ("Traceback" in text or any(o["output_type"] == "error" for o in cell["outputs"])):
            problems.append(f"{where}: a traceback (tag the cell 'raises-exception' if the error is the point)")
        if on_purpose and text.count("\n") > 5 and "Traceback" in text:
            problems.append(f"{where}: show the error's message, not its stack")
        if re.search(r"\b\w+Warning\b", stderr):
            problems.append(f"{where}: a warning: {stderr.strip()[:200]}")
        if "\r" in text or re.search(course._FRAME + r"(?=\S)", text):  # redrawn, or cut off by the next line
            problems.append(f"{where}: an unsettled progress bar")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_committed_results_hold_no_machine_path():
    "The benchmark JSON a reader opens beside the report: paths inside the clone, never the measuring machine's."
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    found = {p.name: m.group() for p in results if (m := MACHINE_PATH.search(p.read_text()))}
    assert results and not found, found


def test_course_stays_small():
    tracked = subprocess.run(["git", "ls-files", "-z", "nbs"], cwd=ROOT, capture_output=True, text=True, check=True)
    size = sum((ROOT / f).stat().st_size for f in tracked.stdout.split("\0") if f and (ROOT / f).exists())
    assert size < 5e6, f"nbs/ holds {size / 1e6:.1f} MB"


def test_nbdev_clean_keeps_outputs(tmp_path):
    source = next(p for p in NOTEBOOKS if p.name.startswith("03"))
    copy = tmp_path / source.name
    shutil.copy(source, copy)
    subprocess.run([str(Path(sys.executable).parent / "nbdev_clean"), "--fname", str(copy)], cwd=ROOT, check=True)
    count = lambda p: sum(len(c.get("outputs", [])) for c in load(p)["cells"])
    assert count(copy) == count(source) > 0


def test_tidy_makes_outputs_fit_to_publish():
    root = Path("/work/clone")
    raw = (
        "epoch 1:  10%|#   | 1/10\repoch 1: 100%|####| 10/10\nsaved /work/clone/runs/cpu/checkpoint and "
        "/tmp/distrinews-03-x1y2_z3w/checkpoint, /tmp/tmpa8b7c6d5\n"
        "/work/clone/.venv/lib/python3.11/site-packages/torch/x.py:3: note\n"
    )
    assert course.tidy_text(raw, root) == (
        "epoch 1: 100%|####| 10/10\nsaved runs/cpu/checkpoint and /tmp/distrinews-03-…/checkpoint, /tmp/tmp…\n"
        "torch/x.py:3: note\n"
    )
    frames = (
        "Tokenizing:   0%|          | 0/32 [00:00<?, ? examples/s]"
        "Tokenizing: 100%|##########| 32/32 [00:00<00:00, 3011.86 examples/s]\n"
        "epoch 1/3:   3%|▎         | 5/163 [00:10<05:16,  2.00s/it]epoch 1: train loss 0.5728\n"
    )
    assert course.tidy_text(frames, root) == (
        "Tokenizing: 100%|##########| 32/32 [00:00<00:00, 3011.86 examples/s]\nepoch 1: train loss 0.5728\n"
    )
    cell = {
        "cell_type": "code",
        "metadata": {},
        "source": [],
        "execution_count": 3,
        "outputs": [
            {
                "output_type": "error",
                "ename": "ValueError",
                "evalue": "bad /work/clone/x",
                "traceback": ["long", "stack"],
            }
        ],
    }
    tidied = course.tidy_outputs(cell, root)
    assert tidied["outputs"][0]["traceback"] == ["ValueError: bad x"] and tidied["execution_count"] is None


# --- prose that points elsewhere -------------------------------------------------------------------------------------
def notebook_titles() -> dict:
    return {p.name[:2]: "".join(load(p)["cells"][0]["source"]).splitlines()[0] for p in NOTEBOOKS}


def test_notebook_references_in_prose_exist():
    "Every 'notebook NN' (or 'notebooks NN and MM') in the course and the README names a notebook that exists."
    titles, missing = notebook_titles(), []
    texts = {
        p.name: "\n".join("".join(c["source"]) for c in load(p)["cells"])
        for p in [*NOTEBOOKS, ROOT / "nbs" / "index.ipynb"]
    }
    texts["README.md"] = (ROOT / "README.md").read_text()
    for name, text in texts.items():
        for m in re.finditer(r"\bnotebooks? (\d\d)((?:,? (?:and |or )?\d\d)*)", text):
            for number in re.findall(r"\d\d", m.group(0)):
                if number not in titles:
                    missing.append(f"{name}: {m.group(0)!r}")
    assert not missing, missing


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_cell_ids_are_unique(path):
    "nbformat renames an id used twice when it loads the notebook (papermill warns): every cell keeps one of its own."
    ids = [c["id"] for c in load(path)["cells"]]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"{path.name}: cell ids used twice: {twice}"
