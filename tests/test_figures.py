"""One source for every figure: a number that the notebooks' prose or the README cites for a benchmark is the number in
benchmarks/results/*.json (or the run the notebook itself just made), so the two cannot drift apart.

- `CITED`: the figures prose quotes, each found by its wording and compared with its JSON, formatted as the prose
  prints it. A reworded sentence that no longer matches is caught by the sweep below.
- The sweep: every figure with a unit (samples/s, req/s, a decimal speed-up "1.69x", a decimal percentage, minutes) in
  the notebooks' markdown must be one of `CITED`, a value of the benchmark JSON (rounded as printed), a figure the
  notebook's own outputs show, or listed in `NOT_FROM_A_BENCHMARK` with the reason.
- README.md is nbs/index.ipynb (swept here) followed by benchmarks/README.md (rendered from the JSON by
  benchmarks/report.py: tests/test_benchmarks.py re-renders it); tools/check_generated.sh checks that README.md is
  what `make readme` writes.
- Learner-facing text uses no private vocabulary of this project.

Reads files only: about a second."""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
report = load_script(BENCH / "report.py")

R = report.load(BENCH / "results")
R["original_writeup"] = report.ORIGINAL_2XT4  # the original write-up's 2xT4 figures (not measured by us)


def gpu(precision: str) -> dict:
    return next(g for k, g in R.items() if k.startswith("gpu") and g.get("precision") == precision)


def per_class(a: dict) -> str:
    return ", ".join(f"{k} {v:.1%}" for k, v in a["per_class_accuracy"].items())


@dataclass
class Cite:
    "Wherever `pattern` occurs in a learner-facing text, its group `fig` must read `expected()`."

    pattern: str
    expected: Callable[[], str]
    required_in: tuple = ()  # texts (notebook stems, "index") that must cite it

    def finditer(self, text: str):
        "The matches in `text`; a space in the pattern matches any run of white space (prose wraps anywhere)."
        return re.finditer(self.pattern.replace(" ", r"\s+"), text)


ACC = R["accuracy_cpu"]
CITED = [
    # the `cpu` profile's time on 2 cores: `make main`'s measured run (train + evaluation)
    Cite(r"~(?P<fig>\d+) min on 2 cores", lambda: f"{ACC['wall_s'] / 60:.0f}", ("01_model", "index")),
    Cite(r"(?P<fig>\d+\.\d) min for training \+ evaluation", lambda: f"{ACC['wall_s'] / 60:.1f}", ("index",)),
    Cite(
        r"Test accuracy (?P<fig>[^\n]+)",
        lambda: f"{ACC['accuracy']:.2%} on {ACC['eval_count']} rows ({per_class(ACC)})",
        ("index",),
    ),
    # our one GPU measurement (an H100, DistilBERT's shape)
    Cite(
        r"in fp16: (?P<fig>[\d,]+) samples/s",
        lambda: f"{gpu('fp16')['runs'][0]['samples_per_s']:,.0f}",
        ("09_interview_prep",),
    ),
    Cite(r"in bf16: (?P<fig>[\d,]+) samples/s", lambda: f"{gpu('bf16')['runs'][0]['samples_per_s']:,.0f}"),
    Cite(
        r"about (?P<fig>\d+) s per epoch of 120,000 rows",
        lambda: f"{120_000 / gpu('fp16')['runs'][0]['samples_per_s']:.0f}",
        ("09_interview_prep",),
    ),
    # dropout off in the `cpu` profile (notebook 03)
    Cite(
        r"it trained (?P<fig>\d\.\d\d)x as many samples a second",
        lambda: f"{R['dropout_cpu']['ratio_off_over_on']:.2f}",
        ("03_single_gpu",),
    ),
    # the original write-up's 2xT4 figures, wherever they are quoted
    Cite(r"(?P<fig>[\d.]+) min per epoch on one T4", lambda: f"{report.ORIGINAL_2XT4['minutes_per_epoch_1gpu']:g}"),
    Cite(r"(?P<fig>[\d.]+) min\**\s+on\s+two", lambda: f"{report.ORIGINAL_2XT4['minutes_per_epoch_2gpu']:g}"),
]

# Figures with a unit in prose that come from no benchmark, and why (the sweep accepts exactly these).
NOT_FROM_A_BENCHMARK = {
    ("08_debugging_ddp", "30"): "gloo's default process-group timeout (30 minutes), a PyTorch setting",
}

NUM = r"\d[\d,]*(?:\.\d+)?"
UNITS = {
    "samples/s": re.compile(rf"(?<![\w.])({NUM})\s*samples/s"),
    "req/s": re.compile(rf"(?<![\w.])({NUM})\s*req(?:uests)?/s"),
    "x": re.compile(r"(?<![\w.])(\d+\.\d+)\s*[x×](?!\w)"),
    # "89.25 → **90.85** → 90.60 %": every number of the chain
    "%": re.compile(r"(?<![\w.])(\d+\.\d+(?:\*\*)?(?:\s*→\s*(?:\*\*)?\d+\.\d+(?:\*\*)?)*)\s*%"),
    "min": re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\**\s*min(?:utes?)?\b"),
}
# how an output shows a figure of each unit (the number, then this)
SHOWN_UNIT = {"samples/s": "samples/s", "req/s": "req(?:uests)?/s", "x": "[x×]", "%": "%", "min": "min"}


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, str(k)))
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v, path)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, float(obj)


def json_values() -> dict:
    "Every number of the benchmark JSON, by the unit prose would give it."
    values = {unit: set() for unit in UNITS}
    for data in R.values():
        for path, v in _leaves(data):
            key, full = (path[-1] if path else ""), ".".join(path)
            if "samples_per_s" in full or key in ("repeats", "control_repeats"):
                values["samples/s"].add(v)
            if "throughput" in full:
                values["req/s"].add(v)
            if "speedup" in key or key.startswith(("vs_", "ratio_")):
                values["x"].add(v)
            if 0 <= v <= 1:
                values["%"].add(100 * v)
            if key.endswith("_s") or "seconds" in key:
                values["min"].add(v / 60)
            if key.startswith("minutes"):
                values["min"].add(v)
    return values


VALUES = json_values()


def printed_as(value: float, printed: str) -> bool:
    "`value` rounded to as many decimals as `printed` shows is `printed`."
    p = printed.replace(",", "")
    decimals = len(p.split(".")[1]) if "." in p else 0
    return abs(round(value, decimals) - float(p)) < 1e-9


def texts() -> dict:
    "Learner-facing prose by name: every notebook's markdown (the generated banner under the title excluded)."
    out = {}
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        prose = [
            "".join(c["source"])
            for c in cells
            if c["cell_type"] == "markdown" and not "".join(c["source"]).startswith("*Outputs on this page")
        ]
        shown = []
        for c in cells:
            for o in c.get("outputs", []):
                shown.append("".join(o.get("text", "")))
                shown += ["".join(v) for k, v in o.get("data", {}).items() if k.startswith("text/")]
        out["index" if nb.stem == "index" else nb.stem] = ("\n\n".join(prose), "\n".join(shown))
    return out


TEXTS = texts()


def test_cited_figures_match_their_json():
    stale, missing = [], []
    for cite in CITED:
        found = {name for name, (prose, _) in TEXTS.items() if any(cite.finditer(prose))}
        missing += [(cite.pattern, name) for name in cite.required_in if name not in found]
        for name in found:
            for m in cite.finditer(TEXTS[name][0]):
                if m["fig"] != cite.expected():
                    stale.append(f"{name}: {m[0]!r} — the JSON says {cite.expected()!r}")
    assert not stale, "stale figures in prose:\n" + "\n".join(stale)
    assert not missing, f"prose no longer cites these (update CITED in {Path(__file__).name}): {missing}"


def unsourced(name: str, prose: str, shown: str, used: set | None = None) -> list:
    """Figures with a unit in `prose` that no citation, JSON value, output of the notebook or listed reason explains;
    the listed reasons that were needed are added to `used`."""
    cited = [m.span() for c in CITED for m in c.finditer(prose)]
    bad = []
    for unit, pattern in UNITS.items():
        for m in pattern.finditer(prose):
            if any(a <= m.start() < b for a, b in cited):
                continue
            for num in re.findall(NUM, m[1]):
                if any(printed_as(v, num) for v in VALUES[unit]):
                    continue
                if re.search(rf"(?<![\d.]){re.escape(num)}\s*{SHOWN_UNIT[unit]}", shown):
                    continue  # the run the notebook just made
                if (name, num) in NOT_FROM_A_BENCHMARK:
                    (used if used is not None else set()).add((name, num))
                    continue
                bad.append(f"{name}: {num} {unit} in {prose[max(0, m.start() - 60) : m.end() + 10]!r}")
    return bad


def test_every_figure_in_prose_has_a_source():
    used = set()
    bad = [line for name, (prose, shown) in TEXTS.items() for line in unsourced(name, prose, shown, used)]
    assert not bad, (
        "figures in prose that match no benchmark JSON, no output of their notebook and no listed reason "
        "(cite the JSON, or add a Cite/NOT_FROM_A_BENCHMARK entry):\n" + "\n".join(bad)
    )
    # and every listed reason is still needed: a stale entry could hide a future figure
    assert used == set(NOT_FROM_A_BENCHMARK), f"no longer needed: {set(NOT_FROM_A_BENCHMARK) - used}"


def test_the_sweep_finds_a_stale_figure():
    "The check can fail: the figures this issue found disagreeing are caught."
    assert unsourced("09_interview_prep", "an H100 trained 1,140 samples/s", "")
    assert unsourced("08_debugging_ddp", "DDP reached 1.97x on 2 ranks", "")
    assert unsourced("01_model", "a laptop, ~40 min", "40 rows")
    assert not unsourced("08_debugging_ddp", "DDP reached 1.97x on 2 ranks", "speed-up 1.97x")  # the run just made
    h100 = next(c for c in CITED if c.pattern.startswith("in fp16"))
    assert next(h100.finditer("in fp16:\n1,140 samples/s"))["fig"] != h100.expected()


PRIVATE = re.compile(r"reference design|short of the target|meets the target|\btargets? of \d", re.I)
# notebooks other helpers are rewriting in this round (#23): expected to pass once they land
PENDING: set[str] = set()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="another helper's, in #23: drop from PENDING"))
        if n in PENDING
        else n
        for n in sorted(TEXTS)
    ],
)
def test_no_private_vocabulary(name):
    prose, shown = TEXTS[name]
    found = sorted({m[0] for m in PRIVATE.finditer(prose + "\n" + shown)})
    assert not found, f"{name}: {found} — say what is meant (e.g. 'the original write-up's 2×T4 figures')"
