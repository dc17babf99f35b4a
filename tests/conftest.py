"""What the test files share: the offline environment, a small demo checkpoint, a checkpoint whose head is fitted on AG
News (so its labels mean something), and the real server (`python -m distrinews.serve`) in a subprocess."""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# offline is the environment's decision; the test environment makes it here (run_tests.sh sets the same)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest

from distrinews.ddp import free_port

ROOT = Path(__file__).resolve().parents[1]
SPORTS_HEADLINE = "Striker scores twice as United beat Chelsea in the cup final"


def http_json(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    "GET (or POST `body` as JSON) with the standard library; the status code and the decoded JSON answer."
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@contextlib.contextmanager
def running_server(
    checkpoint=None,
    *args: str,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict | None = None,
    cwd=None,
    python: str = sys.executable,
    inherit_env: bool = True,
    timeout: float = 180,
):
    """Run `python -m distrinews.serve` in a subprocess; yield its base URL once /health answers (200 with a model,
    503 without one); stop it afterwards. `inherit_env=False`: only `env` (plus PATH), as in a container."""
    port = port or free_port(host)
    base = dict(os.environ) if inherit_env else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env = {**base, **(env or {})}
    if inherit_env:  # the repository's package, whether or not it is installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [str(python), "-m", "distrinews.serve", "--host", host, "--port", str(port), *args]
    if checkpoint is not None:
        cmd += ["--checkpoint", str(checkpoint)]
    logfile = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    url = f"http://{host}:{port}"

    def server_log():
        logfile.seek(0)
        return logfile.read()[-4000:]

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {proc.returncode}:\n{server_log()}")
            try:
                if http_json(url + "/health", timeout=2)[0] in (200, 503):
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from {url} in {timeout} s:\n{server_log()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()


def fit_head(checkpoint: Path, out: Path, n: int = 512, max_length: int = 64) -> Path:
    """A copy of `checkpoint` whose classification head is fitted on `n` AG News training items (a linear probe: the
    encoder stays frozen, ~5 s on a CPU), so it predicts like a trained model. Read with the library's CSV reader."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from distrinews.data import find_data_dir, read_agnews_csv, stratified_indices

    data_dir = find_data_dir()
    if data_dir is None or not (data_dir / "train.csv").is_file():
        pytest.skip("no local AG News (set DISTRINEWS_DATA_DIR) to fit a classification head on")
    texts, labels = read_agnews_csv(data_dir / "train.csv")
    rows = stratified_indices(labels, n, seed=0)
    texts, labels = [texts[i] for i in rows], torch.tensor([labels[i] for i in rows])
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    feats = []
    hook = model.classifier.register_forward_hook(lambda m, args, output: feats.append(args[0].detach()))
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            model(
                **tokenizer(
                    texts[i : i + 64], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
                )
            )
    hook.remove()
    x, head = torch.cat(feats), model.classifier
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(x), labels).backward()
        opt.step()
    accuracy = (head(x).argmax(-1) == labels).float().mean().item()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "run_config.json").write_text(
        json.dumps(
            {
                "name": "minilm-linear-probe",
                "model_name": "all-MiniLM-L6-v2",
                "max_length": max_length,
                "train_items": n,
                "train_accuracy": accuracy,
            }
        )
    )
    return out


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    "An untrained demo checkpoint (the packaged MiniLM and a fresh head), 32 tokens. Tests that change it undo it."
    from distrinews.inference import make_demo_checkpoint

    return make_demo_checkpoint(tmp_path_factory.mktemp("ckpt") / "demo", max_length=32)


@pytest.fixture(scope="session")
def probe_checkpoint(checkpoint, tmp_path_factory):
    "The demo checkpoint with its head fitted on 512 AG News items: an obvious sports headline comes out as Sports."
    return fit_head(checkpoint, tmp_path_factory.mktemp("probe") / "probe")
