"""Render benchmarks/README.md and its PNG charts from the JSON results in benchmarks/results/.

Pure function of the JSON files: the same results give byte-identical Markdown and PNGs (a test re-renders and
compares). The report states what was measured; the project's goals for these figures live in tests/test_benchmarks.py.

    .venv/bin/python benchmarks/report.py                     # results/ -> README.md + *.png next to this file
    .venv/bin/python benchmarks/report.py --results R --out O
"""

import argparse
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The figures the original DistriNews write-up published for DistilBERT on Kaggle's 2xT4 (never measured by us): the
# report shows them once, as such, beside our own GPU rows; the notebooks cite them from here (tests/test_figures.py).
ORIGINAL_2XT4 = dict(
    minutes_per_epoch_1gpu=8.0,
    minutes_per_epoch_2gpu=4.5,
    samples_per_s_1gpu=250,
    samples_per_s_2gpu=444,
    speedup=1.78,
    efficiency=0.89,
)


def save(result: dict, out: str | Path) -> dict:
    """Write a benchmark script's `result` to the JSON file `out`, with the machine (unless `result` names one) and the
    date: the format `load` reads back (07 writes the same from its own cells)."""
    import datetime
    import os
    import platform

    import torch  # (only here: rendering the report needs no torch)

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cpu = dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), torch=torch.__version__)
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ATEN_CPU_CAPABILITY"):  # kernels limited on a CPU that has more: not that CPU kind's figure
        capability += f" kernels forced (ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']})"
    result.setdefault("machine", dict(cpu, capability=capability, gpu=gpu))
    result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return result


def load(results: Path) -> dict:
    """Every result file, by name (without .json). DDP runs whose gradients a shared-memory hook averaged
    (`grad_sync: shm`, a lesson that has left the course) stay in the JSON as measured, but are not shown."""
    R = {p.stem: json.loads(p.read_text()) for p in sorted(Path(results).glob("*.json"))}
    for r in R.values():
        if isinstance(r.get("runs"), list):
            r["runs"] = [x for x in r["runs"] if x.get("grad_sync") != "shm"]
    return R


def _savefig(fig, path: Path):
    # no timestamps or version strings in the file: the same data must give the same bytes
    fig.savefig(path, dpi=90, metadata={"Software": None}, format="png")


SYNC_NAMES = {
    "none": "–",
    "allreduce": "all-reduce (stock DDP)",
    "fp16": "fp16-compressed all-reduce (built-in hook)",
    "bf16": "bf16-compressed all-reduce (built-in hook)",
    "powersgd": "PowerSGD (built-in hook)",
}


def ddp_lines(r: dict) -> dict:
    "The runs as one line per way of averaging gradients, each starting at the 1-rank run."
    one = [x for x in r["runs"] if x["world_size"] == 1]
    syncs = sorted({x.get("grad_sync", "allreduce") for x in r["runs"] if x["world_size"] > 1})
    return {
        s: one + [x for x in r["runs"] if x["world_size"] > 1 and x.get("grad_sync", "allreduce") == s] for s in syncs
    }


def chart_ddp(r: dict, path: Path):
    import matplotlib.pyplot as plt

    ws = sorted({x["world_size"] for x in r["runs"]})
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    first = r["runs"][0]
    base = first["samples_per_s"] / first["world_size"]
    lines = ddp_lines(r)
    for sync, runs in lines.items():
        label = f"DDP, {SYNC_NAMES.get(sync, sync)}" if len(lines) > 1 else "measured"
        a.plot([x["world_size"] for x in runs], [x["samples_per_s"] for x in runs], "o-", label=label)
        b.plot([x["world_size"] for x in runs], [x["speedup"] for x in runs], "o-", label=label)
    a.plot(ws, [base * w for w in ws], "--", color="grey", label="ideal (linear)")
    ctl = sorted({(x["world_size"], x["control_samples_per_s"]) for x in r["runs"] if "control_samples_per_s" in x})
    if ctl:
        a.plot(
            [ws[0]] + [w for w, _ in ctl],
            [base * ws[0]] + [v for _, v in ctl],
            "s:",
            color="#d8883b",
            label="independent workers, no communication",
        )
    a.set(xlabel="workers (ranks)", ylabel="samples / s", title="DDP training throughput", xticks=ws)
    a.legend(fontsize=7)
    b.plot(ws, ws, "--", color="grey", label="ideal")
    b.set(xlabel="workers (ranks)", ylabel="speed-up over 1 rank", title="Speed-up", xticks=ws)
    b.legend()
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def chart_trainer(r: dict, path: Path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.6))
    names = [
        "plain loop\n(pad to 128, fp32)",
        f"our trainer, cpu profile\n({r['ours_precision']}, length-grouped, frozen)",
    ]
    vals = [r["reference_samples_per_s"], r["ours_samples_per_s"]]
    ax.barh(names, vals, color=["#bbbbbb", "#3b7dd8"])
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.0f}", va="center")
    ax.set(xlabel="training samples / s", title=f"Same model, same samples: {r['speedup']:.1f}x")
    ax.set_xlim(0, max(vals) * 1.2)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def chart_serving(rows: list, path: Path):
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    clients = [c for c, _ in rows]
    for mode, style in (("on", "o-"), ("off", "s--")):
        a.plot(clients, [r["runs"][mode]["throughput_rps"] for _, r in rows], style, label=f"micro-batching {mode}")
        b.plot(clients, [r["runs"][mode]["p99_ms"] for _, r in rows], style, label=f"micro-batching {mode}")
    a.set(xlabel="concurrent clients", ylabel="requests / s", title="Serving throughput", xscale="log", xticks=clients)
    b.set(xlabel="concurrent clients", ylabel="p99 latency (ms)", title="Tail latency", xscale="log", xticks=clients)
    for ax in (a, b):
        ax.set_xticklabels([str(c) for c in clients])
        ax.legend()
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def chart_accuracy(rows: list, path: Path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(rows)))
    names = [f"{r['profile']}\n{r['mode']}" for r in rows]  # two lines: long names leave no room for the bars
    vals = [100 * r["accuracy"] for r in rows]
    ax.barh(names, vals, color="#3b7dd8")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f} %", va="center")
    ax.set(
        xlabel="accuracy on the AG News test rows (%)", xlim=(min(vals + [85]) - 1, 100), title="Accuracy per profile"
    )
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def _machine(m: dict) -> str:
    return f"{m['cpu']}, {m['cores']} cores" + (f", GPU {m['gpu']}" if m.get("gpu") else "")


def ddp_section(key: str, r: dict, first: dict | None = None) -> list:
    """One DDP scaling table: the runs, the headline (stock DDP) and what the control says. `first`: the first DDP
    table of the report, when this is a later one (a different precision is then said)."""
    accum, repeats = r.get("grad_accum", 1), r.get("repeats", 1)
    precision = r.get("precision")
    timed = (
        f"timed: one pass over the same {r['rows']:,} rows for every job, after {r['warmup_passes']} untimed pass(es)"
        if "rows" in r
        else f"{r['timed_steps']} timed steps"
    )
    md = [
        "## DDP scaling"
        + (f" with gradient accumulation ({accum} micro-batches per all-reduce)" if accum > 1 else "")
        + (f", {precision}" if precision else ""),
        "",
        f"`{r['model']}`, {precision or 'precision not recorded'}, {r['batch_size_per_rank']} samples per rank per "
        "micro-batch"
        + (f", {accum} micro-batches per optimizer step (`no_sync` on all but the last)" if accum > 1 else "")
        + f", {r['threads_per_rank']} thread(s) per rank, backend {r['backend']}, {timed}"
        + (
            f"; each figure is the median of {repeats} interleaved runs (all of them are in the JSON)"
            if repeats > 1
            else ""
        )
        + f". Machine: {_machine(r['machine'])}"
        + (f"; measured {r['date'][:10]}" if r.get("date") else "")
        + ".",
    ]
    if first is not None and precision != first.get("precision"):
        md += [
            "",
            f"Not comparable with the first DDP table's samples/s: that one was measured in "
            f"{first.get('precision') or 'an unrecorded precision'}, this one in {precision or 'an unrecorded one'}, "
            "in another run. Compare the speed-ups within each table; the 1-rank rows differ by precision and run, "
            "not only by accumulation.",
        ]
    md += [
        "",
        "| ranks | gradients averaged by | samples/s | speed-up | efficiency "
        "| control: N workers, no communication | DDP / control |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for x in r["runs"]:
        control = (
            f"{x['control_samples_per_s']:.1f} ({x['control_speedup']:.2f}x) | {x['vs_control']:.0%} |"
            if "vs_control" in x
            else "– | – |"
        )
        md.append(
            f"| {x['world_size']} | {SYNC_NAMES.get(x.get('grad_sync', 'allreduce'), '')} | {x['samples_per_s']:.1f} "
            f"| {x['speedup']:.2f}x | {x['efficiency']:.0%} | {control}"
        )
    for n in sorted({x["world_size"] for x in r["runs"]} - {1}):
        # the headline is stock DDP (what every learner runs); other ways of averaging are side rows
        rows = [x for x in r["runs"] if x["world_size"] == n]
        best = next((x for x in rows if x.get("grad_sync", "allreduce") == "allreduce"), rows[0])
        others = [x for x in rows if x is not best]
        md += [
            "",
            f"{n} ranks, {SYNC_NAMES.get(best.get('grad_sync', 'allreduce'))}: speed-up {best['speedup']:.2f}x, "
            f"efficiency {best['efficiency']:.1%}."
            + "".join(
                f" Side row, {SYNC_NAMES.get(x.get('grad_sync'), x.get('grad_sync'))}: "
                f"{x['speedup']:.2f}x ({x['efficiency']:.0%})."
                for x in others
            ),
        ]
        if "vs_control" in best and round(best["vs_control"], 2) < 1:  # (0.996 would print "keeps 100 %")
            md += [
                f"The control shows what this machine allows {n} workers at all: {best['control_speedup']:.2f}x with "
                f"no communication. DDP keeps {best['vs_control']:.0%} of that: the rest is the cost of averaging "
                "gradients and of waiting for the slower rank at every step."
            ]
        elif "vs_control" in best:
            spread = best.get("control_repeats") or [best["control_samples_per_s"]]
            md += [
                f"The control (what this machine allows {n} workers at all, with no communication) got "
                f"{best['control_speedup']:.2f}x (its runs: {min(spread):.1f}–{max(spread):.1f} samples/s): DDP did "
                "as well. At this much computation per exchange, averaging gradients costs less than the machine's "
                "run-to-run noise."
            ]
    return md + ["", f"![DDP scaling]({key}.png)", ""]


def program_speed_section(r: dict) -> list:
    "Today's training program beside an earlier commit's: samples/s on the `make main` path, alternating runs."
    s, old, new = r["settings"], r["programs"]["old"], r["programs"]["new"]
    runs = {name: [x["samples_per_s"] for x in r["runs"] if x["program"] == name] for name in ("old", "new")}
    m = r["machine"]
    md = [
        f"## The training program: `train_ddp.py` at `{new['commit'][:7]}` beside an earlier commit's",
        "",
        "Measured by `benchmarks/program_speed.py`, on its own (it checks out the earlier commit, so it is not a row "
        "of `benchmarks/run.py`). "
        f"`make main`'s path: torchrun, {s['nproc']} CPU workers of {s['threads_per_worker']} thread each, "
        f"`train_ddp.py --profile {s['profile']} --global-batch-size {s['global_batch_size']}`, on "
        f"{s['train_size']:,} training rows ({s['epochs']} epoch{'s' if s['epochs'] > 1 else ''}, "
        f"{r['train_samples_per_run']:,} samples per run, the same for every run) and {s['test_size']} test rows. "
        f"The earlier program is commit `{old['commit'][:7]}`, checked out beside and run with its "
        f"own package; runs alternate ({s['order']}), {s['repeats']} each, in one session. samples/s: what each run's "
        "`metrics.json` reports (the epoch's training loop on rank 0, the samples of all ranks). "
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; measured {r['date'][:10]}.",
        "",
        "| program | samples/s, each run | median | spread (max - min) / median |",
        "|---|---|---:|---:|",
    ]
    for name, label in (("old", f"earlier (`{old['commit'][:7]}`)"), ("new", f"later (`{new['commit'][:7]}`)")):
        x = r["samples_per_s"][name]
        md.append(f"| {label} | {', '.join(f'{v:.2f}' for v in runs[name])} | {x['median']:.2f} | {x['spread']:.1%} |")
    apart = ranges_apart(runs["new"], runs["old"])
    x = f"{r['ratio_new_over_old']:.3f}x"
    ratio = f"**{x}** (medians)" if apart else f"{x} (medians; the ranges overlap: no result)"
    md += [
        "",
        f"Later / earlier: {ratio}; round by round: " + ", ".join(f"{v:.3f}x" for v in r["ratio_per_round"]) + ".",
    ]
    if r.get("note"):
        md += ["", f"Note: {r['note']}."]
    return md + [""]


def paired_gap(r: dict, side: str, other: str) -> float:
    """The median over the seeds of `side`'s test accuracy minus `other`'s: each seed's two runs trained the same rows
    from the same weights, so the difference is taken seed by seed (not between the two sides' medians)."""
    accuracy = {(x["side"], x["seed"]): x["accuracy"] for x in r["runs"]}
    seeds = sorted({seed for name, seed in accuracy if name == side and (other, seed) in accuracy})
    return statistics.median(accuracy[side, s] - accuracy[other, s] for s in seeds)


def ranges_apart(a: list[float], b: list[float]) -> bool:
    "True where every run of one side beat every run of the other: else the gap is inside the run-to-run spread."
    return min(a) > max(b) or min(b) > max(a)


def versus(r: dict, side: str, other: str) -> str:
    "`side`'s median samples/s over `other`'s: bold only where their ranges do not overlap (else no result)."
    v, o = (r["summary"][k]["samples_per_s"] for k in (side, other))
    x, label = f"{v['median'] / o['median']:.2f}x", f"{side} / {'Trainer' if other == 'trainer' else other}"
    overlap = not ranges_apart([v["min"], v["max"]], [o["min"], o["max"]])
    return f"{x} {label} (the ranges overlap: no result)" if overlap else f"**{x}** {label}"


def trainer_peer_section(peers: list[dict]) -> list:
    "The training script against Hugging Face's Trainer: one table row per side of each run (`trainer_peer.py`)."
    md = [
        "## The training script vs Hugging Face's `Trainer`",
        "",
        "Same encoder, rows, epoch, batch, schedule, optimizer, length-grouped batches, precision and data loader; "
        "alternating runs, one seed per round for both sides (`benchmarks/trainer_peer.py`). Medians, with the range "
        "over the rounds. `before`: the script before the loss was read only every `--log-every` steps; `variant`: the "
        "script with the flags its row names. `Trainer` trains every weight with the model's dropout; since 2026-11-27 "
        "the script keeps the word embeddings frozen by default and, in the `cpu` profile, has no dropout, and since "
        "2026-12-06 keeps the `cpu` profile's two lowest layers frozen too: rows measured before say so (`word "
        "embeddings trained`, `dropout on`, `lowest layers trained`). `Trainer, own sampler`: rows "
        "measured before 2026-11-28, when `Trainer` grouped the rows by length with its own sampler. Below 6,400 rows "
        "it sorts fewer rows at a time than the script's, so it padded more (at 1,024 rows, 11-12 % more tokens in one "
        "process, 3-4 % with 2 workers); and, given the dataset's length column, it read the lengths a row at a time "
        "inside its timed epoch (with datasets 5.2, 0.17 s at 1,024 rows and 1.8 s at 10,429 on the AVX512-BF16 EPYC: "
        "little beside a CPU row's minute, much beside a GPU row's 10-21 s; the GPU rows ran datasets 4.8, not "
        "measured). Since then `Trainer` gets the script's very batches in one process, and with workers its own "
        "sampler, the lengths read before its clock starts. A note's command is the one that ran then: with today's "
        "`cpu` profile, `--no-freeze-word-embeddings` needs `--freeze-layers 0` beside it.",
        "",
        "| machine | precision | side | runs | samples/s | accuracy | ratio | accuracy gap by seed (seed spread) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]

    def rate(x: float) -> str:  # samples/s: a decimal where they are few
        return f"{x:.1f}" if x < 100 else f"{x:.0f}"

    for r in peers:
        threads = r["settings"].get("threads") or "default"
        where = (
            r["gpu"]
            or f"{_machine(r['machine'])}, {r['machine'].get('capability', '')}, {threads} thread(s) per process"
        )
        where += f", {r['workers']} workers (torchrun)" if r["workers"] > 1 else ""
        for side, s in r["summary"].items():
            v, a = s["samples_per_s"], s["accuracy"]
            ratio = versus(r, "script", "trainer") if side == "script" else ""
            if side not in ("script", "trainer"):  # before (another checkout) or variant (other flags): vs both
                ratio = f"{versus(r, side, 'script')}; {versus(r, side, 'trainer')}"
            gap = (
                f"{paired_gap(r, 'script', 'trainer'):+.2%} ({r['accuracy_seed_spread']:.2%})"
                if side == "script"
                else ""
            )
            name = f"{side} `{r['settings']['variant']}`" if side == "variant" else side
            name = "Trainer, own sampler" if side == "trainer" and "trainer_sampler" not in r else name
            if side == "script":  # measured before a default changed: named by what it did differently
                old = {"word embeddings trained": not r.get("script_freezes_word_embeddings"),
                       "dropout on": r.get("script_dropout") != 0,
                       "lowest layers trained": not r.get("script_freeze_layers")}  # fmt: skip
                name = ", ".join(["script", *(k for k, v in old.items() if v)])
            md.append(
                f"| {where} | {r['settings']['precision']} | {name} | {sum(x['side'] == side for x in r['runs'])} "
                f"| {rate(v['median'])} ({rate(v['min'])}-{rate(v['max'])}) "
                f"| {a['median']:.2%} ({a['min']:.2%}-{a['max']:.2%}) | {ratio} | {gap} |"
            )
    notes = [r for r in peers if r.get("note")]
    md += [""] + [
        f"- {r['gpu'] or 'CPU ' + r['machine'].get('capability', '')}, {r['settings']['precision']}, {r['workers']} "
        f"worker(s): {r['note']}"
        for r in notes
    ]
    return md + [""]


def compile_section(rows: list[dict]) -> list:
    "`torch.compile` against the eager training step, on the same batches in one process (`compile_step.py`)."
    md = [
        "## `torch.compile` measured alone",
        "",
        "The scripts' training step (forward, loss, backward, clipping, fused AdamW) on `train_single.py`'s batches, "
        "eager against `torch.compile` with its defaults, two copies of the model from one seed in one process "
        "(`benchmarks/compile_step.py`). Each side first makes one warm-up pass over the rows, what a run's first "
        "epoch pays (the compiling; oneDNN's kernel for each new shape on both sides), then timed passes, alternating. "
        "Medians, with the range over the passes.",
        "",
        "| machine | precision | rows (batch shapes) | warm-up pass, eager / compiled | eager samples/s "
        "| compiled samples/s | compiled / eager |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        where = r["gpu"] or f"{_machine(r['machine'])}, {r['machine'].get('capability', '')}"
        e, c, w = r["summary"]["eager"], r["summary"]["compiled"], {k: v["seconds"] for k, v in r["warmup"].items()}
        ratio = f"{r['ratio_compiled_over_eager']:.2f}x"
        ratio = f"**{ratio}**" if ranges_apart([e["min"], e["max"]], [c["min"], c["max"]]) else f"{ratio} (no result)"
        md.append(
            f"| {where}, {r['settings']['threads'] or 'default'} thread(s) | {r['settings']['precision']} "
            f"| {r['settings']['rows']:,} ({r['shapes']}) | {w['eager']:.0f} s / {w['compiled']:.0f} s "
            f"| {e['median']:.1f} ({e['min']:.1f}-{e['max']:.1f}) | {c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f}) "
            f"| {ratio} |"
        )
    return md + [""] + [f"- {r['settings']['precision']}: {r['note']}" for r in rows if r.get("note")] + [""]


WHOLE_RUNS = {  # the `cpu` run with one setting both ways, seeds side by side: title, (the new side, the old side)
    "freeze_word_embeddings": ("Frozen word embeddings on the whole `cpu` run", ("frozen", "trained")),
    "dropout": ("No dropout on the whole `cpu` run", ("dropout off", "dropout on")),
    "freeze_layers": ("The two lowest layers frozen on the whole `cpu` run", ("frozen", "trained")),
}


def whole_run_section(r: dict, title: str, sides: tuple) -> list:
    "The whole `cpu` run with one setting changed, seeds side by side (the results files named in WHOLE_RUNS)."
    md = [f"## {title}", "", f"`{r['command']}`, code at {r['code']}. {r['note']}"]
    md += ["", "| side | runs | samples/s | test accuracy | wall time |", "|---|---:|---:|---:|---:|"]
    for side, s in r["summary"].items():
        v, a, w = s["samples_per_s"], s["accuracy"], s["wall_s"]
        runs = [x for x in r["runs"] if x["side"] == side]
        timed = sum(x.get("train_samples_per_s") is not None for x in runs)  # a lost timing: its accuracy counts
        md.append(f"| {side}: {r['sides'][side]} | {len(runs)}{f' ({timed} timed)' if timed < len(runs) else ''} "
                  f"| {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f}) | {a['median']:.2%} ({a['min']:.2%}-"
                  f"{a['max']:.2%}) | {w['median']} s ({w['min']}-{w['max']} s) |")  # fmt: skip
    gap = paired_gap(r, *sides)
    within = "within" if abs(gap) <= r["accuracy_seed_spread"] else "beyond"
    accuracy = {(x["side"], x["seed"]): x["accuracy"] for x in r["runs"]}
    seeds = sorted({seed for _, seed in accuracy})
    by_seed = ", ".join(f"{accuracy[sides[0], s] - accuracy[sides[1], s]:+.2%} (seed {s})" for s in seeds)
    return md + ["", f"{versus(r, *sides)}; test accuracy {gap:+.2%}, the median seed by seed (seed-to-seed spread "
                     f"{r['accuracy_seed_spread']:.2%}: {within} it); seed by seed, {sides[0]} minus {sides[1]}: "
                     f"{by_seed}.", ""]  # fmt: skip


def scrape_section(r: dict) -> list:
    "serving_scrape_c<clients>.json: one server's /metrics read every N s during its load, beside the same unscraped."
    st, on, scraped = r["settings"], r["runs"]["on"], r["runs"]["on_scraped"]
    rows = []
    for name, x in (("not scraped", on), ("scraped", scraped)):
        per_round = ", ".join(map(str, x["throughput_per_round"]))
        cpu = ", ".join(f"{ms:.2f}" for ms in x["server_cpu_ms_per_request_per_round"])
        rows.append(f"| {name} | {x['throughput_rps']:.1f} | {per_round} | {cpu} | {x['p99_ms']:.1f} |")
    rounds, reads = r["scrape_cost_per_round"], scraped.get("metrics_scrapes", {})
    verdict = {True: "within 2 %", False: "over 2 %"}.get(
        r["targets"]["/metrics scraped: throughput within 2 %"], "the rounds spread over more than 2 %: no result"
    )
    return [
        "## Serving: `/metrics` scraped vs not",
        "",
        f"Two servers of the same checkpoint, batching on, {st['concurrency']} clients, {st['requests']:,} requests"
        f" each in {st['rounds']} alternating rounds; one has its `/metrics` read every {st['scrape_metrics_s']:g} s"
        f" during its load ({sum(reads.values())} reads, answered {', '.join(f'{n} x {c}' for c, n in reads.items())})."
        f" Machine: {r['machine']}; {str(r['date'])[:10]}.",
        "",
        "| server | req/s | req/s per round | server CPU ms per request, per round | p99 ms |",
        "|---|---:|---|---|---:|",
        *rows,
        "",
        f"Throughput lost to scraping: {r['scrape_cost']:+.1%} in all, {min(rounds):+.1%} to {max(rounds):+.1%} per"
        f" round ({verdict}). Measured on its own, one read of `/metrics` costs the server"
        f" {scraped['server_cpu_ms_per_scrape']:.2f} ms of CPU: once every {st['scrape_metrics_s']:g} s, that is"
        f" {scraped['scrape_cpu_share']:.2%} of the CPU time it spent serving under this load (the goal: 2 %).",
        "",
    ]


def render(results: Path = HERE / "results", out: Path = HERE) -> str:
    "Write README.md and the charts for the results in `results` into `out`; return the Markdown."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "distrinews", "font.size": 9})
    R, out = load(results), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = [
        "# DistriNews benchmarks",
        "",
        "Generated by `benchmarks/report.py` from the JSON files in `benchmarks/results/` — do not edit by hand.",
        "Regenerate the measurements of notebook 07 (papermill over the parameter matrix, ~30 min on 2 cores; the peer "
        "comparison with `Trainer`, `torch.compile` and the program's speed have scripts of their own, "
        "`benchmarks/trainer_peer.py`, `benchmarks/compile_step.py` and `benchmarks/program_speed.py`, and the three "
        "whole-run sections give the command their shell loops ran):",
        "",
        "```bash",
        "HF_HUB_OFFLINE=1 DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/run.py",
        "```",
        "",
        "Ratios are the headline: each is measured side by side in one run on one machine. Absolute numbers are only",
        "meaningful together with the machine they came from (listed with each table). Executed notebooks: "
        "`benchmarks/runs/`.",
        "",
    ]
    if "trainer_vs_reference" in R:
        r = R["trainer_vs_reference"]
        md += [
            "## Our trainer vs a plain training loop",
            "",
            f"Same model (`{r['model']}`), same {r['samples']} rows, batch {r['batch_size']}, {r['timed_steps']} timed "
            f"steps each, {r['threads']} thread(s). Machine: {_machine(r['machine'])}, torch {r['machine']['torch']}. "
            "The plain loop trains every weight with the model's dropout; ours as its profile has it (`cpu`: no "
            f"dropout, the word embeddings and two lowest layers frozen; notebook 03): `{r['ours_command']}`.",
            "",
            "| loop | samples/s |",
            "|---|---:|",
            f"| plain (pad every batch to 128 tokens, fp32, random batches) | {r['reference_samples_per_s']:.1f} |",
            f"| ours (the `cpu` profile: {r['ours_precision']}, length-grouped batches, dynamic padding, no dropout, "
            "frozen layers) "
            f"| {r['ours_samples_per_s']:.1f} |",
            f"| **speed-up** | **{r['speedup']:.2f}x** |",
            "",
            "![trainer vs a plain loop](trainer_vs_reference.png)",
            "",
        ]
        chart_trainer(r, out / "trainer_vs_reference.png")
    peers = [R[k] for k in sorted(R) if k.startswith("trainer_peer")]
    if peers:
        md += trainer_peer_section(peers)
    compiled = [R[k] for k in sorted(R) if k.startswith("compile_")]
    if compiled:
        md += compile_section(compiled)
    for prefix, (title, sides) in WHOLE_RUNS.items():
        for key in sorted(k for k in R if k.startswith(prefix)):
            md += whole_run_section(R[key], title, sides)
    ddp_keys = sorted(k for k in R if k.startswith("ddp_scaling"))
    for key in ddp_keys:
        md += ddp_section(key, R[key], R[ddp_keys[0]] if key != ddp_keys[0] else None)
        chart_ddp(R[key], out / f"{key}.png")
    if "program_speed" in R:
        md += program_speed_section(R["program_speed"])
    # serving_c<clients>.json: micro-batching on vs off (other serving_* files compare something else)
    serving = sorted((r["settings"]["concurrency"], r) for k, r in R.items() if re.fullmatch(r"serving_c\d+", k))
    if serving:
        md += [
            "## Serving: dynamic micro-batching on vs off",
            "",
            f"Same checkpoint, same requests; machine: {serving[-1][1]['machine']}.",
            "",
            "| clients | batching | req/s | p50 ms | p99 ms | mean batch |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for c, r in serving:
            for mode in ("on", "off"):
                x = r["runs"][mode]
                md.append(
                    f"| {c} | {mode} | {x['throughput_rps']:.1f} | {x['p50_ms']:.1f} | {x['p99_ms']:.1f} "
                    f"| {x['mean_batch']:.1f} |"
                )
        c, r = serving[-1]
        md += [
            "",
            f"At {c} clients, micro-batching on vs off: throughput {r['speedup']:.2f}x, p99 latency "
            f"{r['p99_on_over_off']:.2f}x.",
            "",
            "![serving](serving.png)",
            "",
        ]
        chart_serving(serving, out / "serving.png")
    for key in sorted(k for k in R if re.fullmatch(r"serving_scrape_c\d+", k)):
        md += scrape_section(R[key])
    accuracy = [R[k] for k in sorted(R) if k.startswith("accuracy")]
    if accuracy:
        md += [
            "## Accuracy",
            "",
            "| profile | how | model | samples per epoch | epochs | test rows | accuracy | train + eval time |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        md += [
            f"| {a['profile']} | {a['mode']} | `{a['model']}` | {a['train_rows']} | {a['epochs']} "
            f"| {a['eval_count']} | {a['accuracy']:.2%} | {a['wall_s'] / 60:.1f} min |"
            for a in accuracy
        ]
        md += [
            f"\n`{a['profile']}` profile, per class: "
            + ", ".join(f"{k} {v:.1%}" for k, v in a["per_class_accuracy"].items())
            + f". Machine: {a['machine']}. Samples per epoch: the training rows, which `DistributedSampler` pads to a "
            "multiple of the workers."
            for a in accuracy
            if a.get("per_class_accuracy")
        ]
        md += ["", "![accuracy](accuracy.png)", ""]
        chart_accuracy(accuracy, out / "accuracy.png")
    gpu = [R[k] for k in sorted(R) if k.startswith("gpu")]
    md += ["## GPU", ""]
    md += [
        f"- {g['machine']['gpu']}, `{g['model']}`, {g.get('precision', '?')}, {g['batch_size_per_rank']} per GPU, "
        f"backend {g['backend']}: "
        + ", ".join(f"{x['world_size']} GPU(s) {x['samples_per_s']:.0f} samples/s" for x in g["runs"])
        for g in gpu
    ] or [
        "No GPU run recorded yet: run `benchmarks/run.py` on a GPU machine (e.g. Kaggle 2xT4) to add the "
        "`kaggle`-shaped measurement (DistilBERT shape, the GPU name recorded)."
    ]
    o = ORIGINAL_2XT4
    md += [
        "",
        "For comparison, the figures the original DistriNews write-up published for DistilBERT on Kaggle's 2×T4 "
        f"(not measured by us): {o['minutes_per_epoch_1gpu']:g} min per epoch on one T4 "
        f"({o['samples_per_s_1gpu']} samples/s), {o['minutes_per_epoch_2gpu']:g} min on two "
        f"({o['samples_per_s_2gpu']} samples/s): {o['speedup']:.2f}x, {o['efficiency']:.0%} efficiency.",
    ]
    text = "\n".join(md).rstrip() + "\n"
    (out / "README.md").write_text(text)
    return text


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(HERE / "results"))
    p.add_argument("--out", default=str(HERE))
    a = p.parse_args()
    print(render(Path(a.results), Path(a.out)))
