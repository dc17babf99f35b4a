"""A virtual environment shaped like a fresh Kaggle session, for the Kaggle rehearsal (tests/kaggle_rehearsal.sh).

Usage: python tests/kaggle_env.py VENV WHEEL [EXTRA...]

Kaggle's image comes with torch, transformers, Jupyter and the rest preinstalled; what a notebook's first cell adds is
the course itself and the few requirements the image lacks. This builds that picture without a download: a new venv
whose site-packages holds links to the packages of *this* environment that the wheel's base requirements need (their
whole dependency closure, nothing else: no dev or scale extras), plus pip and the Jupyter kernel papermill drives, less
the packages Kaggle's image does not have (tools/wheelhouse.py's NOT_ON_KAGGLE, with the image's package lists it was
read from). DistriNews itself is NOT in it: each notebook's install cell puts it there, from WHEEL
(DISTRINEWS_INSTALL_SPEC) or from the wheelhouse attached as an input, and with it what the image lacks. (The Jupyter
kernel's own dependencies are this environment's: Kaggle's kernel is an older IPython with others.) Console scripts
(torchrun, papermill) are written afresh so that they run the new interpreter, never this environment's (where the
course is an editable install of the clone).
"""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from lock_image import closure  # noqa: E402  (every installed distribution some requirements need)
from wheelhouse import NOT_ON_KAGGLE  # noqa: E402

# what Kaggle's image has besides the course's requirements: pip (the install cell), Jupyter (papermill, the kernel)
HARNESS = ["pip", "papermill", "ipykernel"]


def wheel_requirements(wheel: Path, extras: tuple[str, ...] = ()) -> list[str]:
    "The requirements in WHEEL's metadata that `pip install WHEEL` (with `extras`: `pip install 'WHEEL[x]'`) brings."
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    wanted = [r for r in reqs if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *extras))]
    for r in wanted:
        r.marker = None  # evaluated: an `extra == "scale"` marker has done its work
    return [str(r) for r in wanted]


def main(venv: str, wheel: str, *extras: str):
    venv, wheel = Path(venv), Path(wheel)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    here = Path(sysconfig.get_paths()["purelib"])
    dists = closure(wheel_requirements(wheel, extras) + HARNESS)
    for name in ("distrinews", *NOT_ON_KAGGLE[""]):  # what the install cell brings (the image has the rest)
        dists.pop(name, None)
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if top in ("__pycache__",) or top.endswith(".pth"):
                continue
            src, dst = base / top, site / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
        for ep in dist.entry_points:
            if ep.group == "console_scripts":
                module, _, attr = ep.value.partition(":")
                script = venv / "bin" / ep.name
                script.write_text(
                    f"#!{py}\nimport sys\nfrom {module} import {attr.split('.')[0]}\nsys.exit({attr}())\n"
                )
                script.chmod(0o755)
    print(f"{venv}: {len(dists)} distributions linked from {here}; the course is not installed (its install cell does)")


if __name__ == "__main__":
    main(*sys.argv[1:])
