"""Stage a Docker build context / Hugging Face Space: the files of deployment/, the whole distrinews package, model/.

    python deployment/stage_space.py runs/cpu/checkpoint space

Written by nbs/06_deploy.ipynb."""

import shutil
import sys
from pathlib import Path

import distrinews

SPACE_FILE_LIMIT = 10_000_000  # bytes: a Space's git refuses a larger file that is not stored with Git LFS
SERVABLE = (".json", ".safetensors", ".txt", ".model")  # config, weights, tokenizer; not training_state.pt
HERE = Path(__file__).resolve().parent  # deployment/


def stage_space(checkpoint, out_dir, deployment=HERE) -> Path:
    checkpoint, out_dir, package = Path(checkpoint), Path(out_dir), Path(distrinews.__file__).resolve().parent
    for needed in (checkpoint / "config.json", Path(deployment) / "Dockerfile"):
        if not needed.is_file():
            sys.exit(f"stage_space.py: {needed} is missing: pass a checkpoint folder (keep this file in deployment/)")
    for sub in ("distrinews", "model"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    shutil.copytree(deployment, out_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("stage_space.py", "__*"))
    shutil.copytree(package, out_dir / "distrinews", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    unservable = lambda _, names: [n for n in names if not n.endswith(SERVABLE)]  # training_state.pt, ...
    shutil.copytree(checkpoint, out_dir / "model", ignore=unservable)
    big = [f.relative_to(out_dir) for f in out_dir.rglob("*") if f.is_file() and f.stat().st_size > SPACE_FILE_LIMIT]
    lfs = ["*.safetensors", *sorted(p.as_posix() for p in big if p.suffix != ".safetensors" and ".git" not in p.parts)]
    (out_dir / ".gitattributes").write_text("".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in lfs))
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python deployment/stage_space.py CHECKPOINT OUT_DIR")
    print(f"staged {stage_space(*sys.argv[1:])}")
