"""Pin all that the API image installs. deployment/requirements.txt (notebook 06 writes it) pins what the server
imports; this writes deployment/constraints.txt, which pins every package those pull in, all the way down, each at the
version this environment holds: the versions the tests ran with. An image built from scratch months from now then
installs these very versions, not whatever was released since; and `make venv` takes both files as its constraints.

    .venv/bin/python tools/lock_image.py            # write deployment/constraints.txt
    .venv/bin/python tools/lock_image.py --check    # exit 1 if it is not what this would write
"""

import argparse
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement

DEPLOY = Path(__file__).resolve().parents[1] / "deployment"
HEADER = """\
# What the API image's requirements.txt pulls in, each at the version the course is tested with (this environment's).
# Written by tools/lock_image.py; write it again after changing a pin in requirements.txt (notebook 06).
"""


def closure(roots: list[str]) -> dict[str, md.Distribution]:
    "Every installed distribution the requirements `roots` need, transitively (markers evaluated, extras followed)."
    found, todo = {}, [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"{req} is required but not installed in {sys.prefix}")
        extras = set(req.extras)
        if key in found and not extras:
            continue
        found[key] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *extras)):
                sub.marker = None
                todo.append(sub)
    return found


def constraints(requirements: str) -> str:
    "constraints.txt for the text of requirements.txt: the versions of all its pins pull in, less the pins themselves."
    pins = [line for line in requirements.splitlines() if "==" in line and not line.startswith("#")]
    pinned = [line.split("==")[0].lower().replace("_", "-") for line in pins]
    rest = sorted((name, d.version.split("+")[0]) for name, d in closure(pinned).items() if name not in pinned)
    return HEADER + "".join(f"{name}=={v}\n" for name, v in rest)  # (torch's "+cpu": the image has it from its index)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only say whether constraints.txt is what this would write")
    text = constraints((DEPLOY / "requirements.txt").read_text())
    if p.parse_args(argv).check:
        sys.exit(0 if (DEPLOY / "constraints.txt").read_text() == text else "stale: run tools/lock_image.py")
    (DEPLOY / "constraints.txt").write_text(text)


if __name__ == "__main__":
    main()
