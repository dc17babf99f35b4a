"""DDP scaling on this machine: throughput of N ranks x T threads vs 1 rank x T threads, same model and data, one run.

Each world size is a real torchrun job (gloo on CPU, nccl on GPUs) running our DDPTrainer on the same rows with the same
per-rank batch (weak scaling: more workers, more samples per step). We time optimizer steps after a warm-up and report
samples/s, speed-up over 1 rank and efficiency = speed-up / N.

    DISTRINEWS_DATA_DIR=../shared/data/ag_news .venv/bin/python benchmarks/ddp_scaling.py                 # 1 and 2 ranks, ~4 min
    .venv/bin/python benchmarks/ddp_scaling.py --world-sizes 1 2 --steps 3 --warmup 1 --out /tmp/s.json   # smoke
"""
import argparse, json, os, platform, subprocess, sys, tempfile
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def worker(a):
    "One rank of the timed job (runs under torchrun)."
    import torch
    from distrinews.ddp import DDPTrainer, cleanup_distributed, setup_distributed
    from distrinews.model import get_config
    from distrinews.train import make_trainer
    info = setup_distributed()
    try:
        rows = a.batch_size * info.world_size * (a.warmup + a.steps)
        cfg = get_config("cpu", model_name=a.model, train_size=rows, test_size=64, batch_size=a.batch_size,
                         precision=a.precision, epochs=1, output_dir=tempfile.mkdtemp(prefix="ddp-bench-"))
        trainer = make_trainer(cfg, DDPTrainer, dist_info=info, progress=False, log=lambda *x: None,
                               loader_kwargs=dict(num_replicas=info.world_size, rank=info.rank))
        trainer._run_epoch(0, stop_at_step=a.warmup)                       # warm-up: allocator, kernels, DDP buckets
        timed = trainer._run_epoch(0, stop_at_step=a.warmup + a.steps)     # the rest of the same epoch, timed
        seconds = torch.tensor([timed["train_seconds"]], dtype=torch.float64)
        if info.distributed: torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)  # the slowest rank sets the pace
        if info.is_main:
            Path(a.result).write_text(json.dumps(dict(world_size=info.world_size, samples=timed["train_samples"],
                                                      seconds=seconds.item(), precision=trainer.precision)))
    finally:
        cleanup_distributed()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (OMP_NUM_THREADS)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--precision", default="auto")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "ddp_scaling.json"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker: return worker(a)
    import torch
    runs = []
    for n in a.world_sizes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__, "--worker",
                   "--result", f.name, "--model", a.model, "--batch-size", str(a.batch_size), "--precision", a.precision,
                   "--steps", str(a.steps), "--warmup", str(a.warmup)]
            subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)), stdout=subprocess.DEVNULL)
            r = json.loads(Path(f.name).read_text())
        r["samples_per_s"] = r["samples"] / r["seconds"]
        runs.append(r)
        print(f"{n} rank(s) x {a.threads} thread(s): {r['samples_per_s']:7.1f} samples/s ({r['precision']})", flush=True)
    base = runs[0]["samples_per_s"] / runs[0]["world_size"]
    for r in runs:
        r["speedup"] = round(r["samples_per_s"] / base, 3)
        r["efficiency"] = round(r["speedup"] / r["world_size"], 3)
        r["samples_per_s"] = round(r["samples_per_s"], 2)
    result = dict(benchmark="ddp_scaling", model=a.model, batch_size_per_rank=a.batch_size, threads_per_rank=a.threads,
                  timed_steps=a.steps, runs=runs, backend="nccl" if torch.cuda.is_available() else "gloo",
                  machine=dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), torch=torch.__version__,
                               gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in runs[1:]:
        print(f"{r['world_size']} ranks: speed-up {r['speedup']:.2f}x, efficiency {r['efficiency']:.0%}")
    print(f"-> {a.out}")
    return result


if __name__ == "__main__":
    main()
