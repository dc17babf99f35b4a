"""Inference and API tests that need no network: safe and strict checkpoint loading, weights held in memory, bf16
choice, micro-batching, every route and every bad input through FastAPI's TestClient, a server without a model, a
client that leaves, and shutdown. (The real server over HTTP: test_server_http.py; deployment: test_deployment.py.)"""

import ast
import asyncio
import copy
import gzip
import json
import logging
import math
import shutil
import socket
import threading
from pathlib import Path

import pytest
import safetensors.torch
import torch
import uvicorn
from conftest import Payload, wait_until
from fastapi.testclient import TestClient
from pydantic_settings import CliApp

from distrinews import inference
from distrinews.convert import InvalidCheckpointError, weights_digest
from distrinews.ddp import free_port
from distrinews.guard import HeaderDeadline, _in_time, begin_shutdown
from distrinews.inference import PROBE_TEXTS, MicroBatcher, choose_dtype, load_classifier
from distrinews.model import LABELS, OFFLINE_ENCODER, build_classifier
from distrinews.serve import ServeSettings, create_app, main

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(
    device="cpu",
    dtype="fp32",
    max_text_chars=200,
    max_batch_size=4,
    queue_limit=16,
    max_body_bytes=2048,
    batch_wait_ms=2,
)


@pytest.fixture(scope="module")
def classifier(checkpoint):
    return load_classifier(checkpoint, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def client(checkpoint):
    "The app loading the checkpoint in its lifespan, as a deployment would."
    with TestClient(create_app(ServeSettings(checkpoint=checkpoint, **SMALL))) as c:
        yield c


# ---------------------------------------------------------------- loading


def test_loader_reads_labels_eval_mode_and_run_config(classifier):
    assert classifier.labels == LABELS
    assert classifier.model.training is False
    assert classifier.device == torch.device("cpu")
    assert (classifier.max_length, classifier.name, classifier.dtype_name) == (32, "demo-untrained", "fp32")
    assert len(classifier.version) == 12


def test_predict_and_predict_batch_keep_input_order(classifier):
    texts = [
        "A much, much longer headline about markets, the economy, oil and the dollar",
        "Short",
        "Mid-size news item",
    ]
    batch = classifier.predict_batch(texts)
    singles = [classifier.predict(t) for t in texts]
    for b, s in zip(batch, singles):
        assert list(b["probabilities"]) == LABELS
        assert b["label"] == s["label"]
        assert abs(b["confidence"] - s["confidence"]) < 1e-4
        assert abs(sum(b["probabilities"].values()) - 1) < 1e-4
        assert b["confidence"] == b["probabilities"][b["label"]]
    with pytest.raises(TypeError, match="list of strings"):
        classifier.predict_batch([1, 2])
    with pytest.raises(TypeError, match="expects a string"):
        classifier.predict(None)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing", "does not exist"),
        (lambda d: (d / "file.txt").write_text("x") and d / "file.txt", "is a file, not a folder"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "has no config.json"),
        (lambda d: _folder(d, {"config.json": "{not json"}), "not valid JSON"),
        (lambda d: _folder(d, {"config.json": "{}"}), "no `model_type`"),
        (lambda d: _folder(d, {"config.json": '{"model_type": "bert"}'}), "has no model.safetensors"),
        (
            lambda d: _folder(d, {"config.json": '{"model_type": "bert"}', "model.safetensors": "x"}),
            "no tokenizer files",
        ),
    ],
)
def test_not_a_checkpoint_gives_one_clear_message(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(InvalidCheckpointError, match=message):
        load_classifier(path)


def _folder(base, files):
    d = base / "ckpt"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_corrupt_weights_are_a_clear_error(tmp_path, checkpoint):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(InvalidCheckpointError, match="Could not load the checkpoint"):
        load_classifier(broken)


def _variant(base: Path, checkpoint: Path, edit_state=None, edit_config=None) -> Path:
    "A copy of `checkpoint` in `base` with its weights and/or config.json edited."
    out = base / "variant"
    shutil.copytree(checkpoint, out)
    if edit_state:
        state = safetensors.torch.load((out / "model.safetensors").read_bytes())
        safetensors.torch.save_file(edit_state(state), out / "model.safetensors")
    if edit_config:
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(edit_config(config)))
    return out


def _set(name, value):
    return lambda s: {**s, name: torch.full_like(s[name], value)}


NOT_THE_CLASSIFIER = {
    "classifier tensors missing": (
        dict(edit_state=lambda s: {k: v for k, v in s.items() if not k.startswith("classifier.")}),
        "2 of its 105 tensors are missing (classifier.weight, classifier.bias)",
    ),
    "only the classifier tensors": (
        dict(edit_state=lambda s: {k: v for k, v in s.items() if k.startswith("classifier.")}),
        "103 of its 105 tensors are missing",
    ),
    "one encoder tensor missing": (
        dict(edit_state=lambda s: {k: v for k, v in s.items() if k != "bert.pooler.dense.bias"}),
        "1 of its 105 tensors are missing (bert.pooler.dense.bias)",
    ),
    "a tensor of another shape": (
        dict(edit_state=lambda s: {**s, "classifier.bias": torch.zeros(5)}),
        "classifier.bias (5,), not (4,)",
    ),
    "an extra tensor": (
        dict(edit_state=lambda s: {**s, "lm_head.weight": torch.zeros(2, 2)}),
        "1 tensors are not part of it (lm_head.weight)",
    ),
    "config says llama": (
        dict(edit_config=lambda c: {**c, "model_type": "llama"}),
        "not those of the LlamaForSequenceClassification its config.json describes (model_type 'llama')",
    ),
    "config of an unknown architecture": (
        dict(edit_config=lambda c: {**c, "model_type": "no-such-model"}),
        "no-such-model",
    ),
    "labels of another task": (
        dict(edit_config=lambda c: {**c, "id2label": {"0": "NEGATIVE", "1": "POSITIVE"}}),
        "labels its 2 outputs ['NEGATIVE', 'POSITIVE'], not ['World', 'Sports', 'Business', 'Sci/Tech']",
    ),
    "labels in another order": (
        dict(edit_config=lambda c: {**c, "id2label": {"0": "Sports", "1": "World", "2": "Business", "3": "Sci/Tech"}}),
        "labels its 4 outputs ['Sports', 'World', 'Business', 'Sci/Tech']",
    ),
    "NaN in the classifier bias": (
        dict(edit_state=_set("classifier.bias", math.nan)),
        "NaN or Inf values in 1 of its weight tensors (classifier.bias)",
    ),
    "Inf in an encoder weight": (
        dict(edit_state=_set("bert.encoder.layer.0.output.dense.weight", math.inf)),
        "NaN or Inf values in 1 of its weight tensors (bert.encoder.layer.0.output.dense.weight)",
    ),
}


@pytest.mark.parametrize("name", list(NOT_THE_CLASSIFIER))
def test_a_checkpoint_that_is_not_the_classifier_is_refused(tmp_path, checkpoint, name, capsys):
    "Refused by the loader; the app is not ready and says why (no absolute path); the CLI exits 1 with the same reason."
    edits, message = NOT_THE_CLASSIFIER[name]
    bad = _variant(tmp_path, checkpoint, **edits)
    with pytest.raises(InvalidCheckpointError) as refused:
        load_classifier(bad, device="cpu", dtype="fp32")
    assert message in str(refused.value)
    with TestClient(create_app(ServeSettings(checkpoint=bad, **SMALL))) as c:
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "unavailable" and message in h.json()["error"]
        r = c.post("/predict", json={"text": "Oil prices climb"})
        assert r.status_code == 503 and message in r.json()["detail"]
        assert str(tmp_path) not in h.text + r.text  # the folder by its name, not where it lies on the server's disk
    with pytest.raises(SystemExit) as stopped:
        main(["--checkpoint", str(bad), "--device", "cpu", "--dtype", "fp32", "--port", "0"])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and err.startswith("distrinews-serve: error: ") and message in err
    assert "Traceback" not in err


def test_weights_are_held_in_memory(tmp_path, checkpoint):
    "Writing another model over the loaded file, or truncating it, changes nothing the loaded classifier answers."
    served = tmp_path / "served"
    shutil.copytree(checkpoint, served)
    clf = load_classifier(served, device="cpu", dtype="fp32")
    before = clf.predict_batch(PROBE_TEXTS)
    assert clf.version == weights_digest(served)
    safetensors.torch.save_file(build_classifier(OFFLINE_ENCODER, seed=1).state_dict(), served / "model.safetensors")
    assert load_classifier(served, device="cpu", dtype="fp32").predict_batch(PROBE_TEXTS) != before  # it differs...
    assert clf.predict_batch(PROBE_TEXTS) == before  # ...but not for the classifier loaded before
    (served / "model.safetensors").write_bytes(b"\0" * 100)  # truncated: a memory-mapped model would die (SIGBUS)
    assert clf.predict_batch(PROBE_TEXTS) == before
    with pytest.raises(InvalidCheckpointError, match="is not a valid safetensors file"):
        load_classifier(served)


def test_a_manifest_is_checked_where_training_wrote_one(tmp_path, checkpoint):
    "manifest.json (written by the training scripts) records each file's SHA-256: weights that differ are refused."
    import hashlib

    sealed = shutil.copytree(checkpoint, tmp_path / "sealed")
    digest = hashlib.sha256((sealed / "model.safetensors").read_bytes()).hexdigest()
    (sealed / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": digest}}))
    assert load_classifier(sealed, device="cpu", dtype="fp32").version == digest[:12]
    (sealed / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": "0" * 64}}))
    with pytest.raises(InvalidCheckpointError, match="differs from the one in manifest.json"):
        load_classifier(sealed, device="cpu", dtype="fp32")


def test_payload_is_real(tmp_path):
    "The payload below does run under a plain pickle load: the safety tests that follow are meaningful."
    marker = tmp_path / "ran.txt"
    torch.save({"x": Payload(marker)}, tmp_path / "p.pt")
    torch.load(tmp_path / "p.pt", weights_only=False)
    assert marker.exists()


def test_malicious_pickles_never_run(tmp_path, checkpoint):
    marker = tmp_path / "pwned.txt"
    # 1. a reference-style .pt whose unpickling would run code: the loader serves folders only, and says how to convert
    # it (notebook 13's recipe, with weights_only=True); one line
    torch.save({"model_state_dict": {"w": torch.zeros(1)}, "epoch": Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(InvalidCheckpointError, match=r"evil.pt is a single .pt file .* notebook 13's recipe\.$"):
        load_classifier(tmp_path / "evil.pt")
    # 2. a valid checkpoint folder with a booby-trapped training_state.pt: loads, and the file is never opened
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in checkpoint.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    torch.save({"optimizer": Payload(marker)}, ckpt / "training_state.pt")
    assert load_classifier(ckpt, dtype="fp32").labels == LABELS
    # 3. a folder with only pickle weights is refused before anything is unpickled
    (ckpt / "model.safetensors").unlink()
    torch.save({"w": Payload(marker)}, ckpt / "pytorch_model.bin")
    with pytest.raises(InvalidCheckpointError, match="a pickle file such as pytorch_model.bin"):
        load_classifier(ckpt)
    assert not marker.exists()


# ---------------------------------------------------------------- precision


def _hooked(classifier, hook):
    model = copy.deepcopy(classifier.model)
    model.register_forward_hook(hook)
    return model


def test_bf16_is_refused_when_it_changes_labels(classifier):
    def flip(module, args, out):
        if torch.is_autocast_enabled("cpu"):
            out.logits = out.logits.flip(-1)
        return out

    dtype, why = choose_dtype(_hooked(classifier, flip), classifier.tokenizer, "cpu", "bf16")
    assert dtype is None and "changed the label" in why


def test_bf16_is_used_when_labels_agree(classifier):
    def confident(module, args, out):  # the same clear winner per text in both precisions
        out.logits = torch.eye(4)[torch.arange(out.logits.shape[0]) % 4].to(out.logits.dtype) * 10
        return out

    dtype, why = choose_dtype(_hooked(classifier, confident), classifier.tokenizer, "cpu", "bf16")
    assert dtype == torch.bfloat16 and "same labels" in why


def test_auto_stays_fp32_without_native_bf16(classifier, monkeypatch):
    monkeypatch.setattr(inference, "native_bf16", lambda device: False)
    assert choose_dtype(classifier.model, classifier.tokenizer, "cpu", "auto") == (
        None,
        "fp32: this cpu has no native bf16",
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(checkpoint):
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_classifier(checkpoint, device="cuda")


# ---------------------------------------------------------------- micro-batcher


def test_microbatcher_skips_cancelled_jobs_and_reports_stats():
    calls = []
    mb = MicroBatcher(lambda xs: calls.append(list(xs)) or xs, max_batch_size=8)
    first, second = mb.submit(["a"]), mb.submit(["b"])
    assert first.cancel()
    with mb:
        assert second.result(10) == ["b"]
    assert calls == [["b"]] and mb.stats["items"] == 1
    with pytest.raises(RuntimeError, match="stopped"):
        mb.submit(["late"])


def test_microbatcher_rejects_bad_sizes():
    with pytest.raises(ValueError):
        MicroBatcher(lambda x: x, max_batch_size=0)
    with pytest.raises(ValueError):
        MicroBatcher(lambda x: x, max_wait_ms=-1)


def test_microbatcher_wrong_result_count_fails_the_jobs():
    with MicroBatcher(lambda xs: xs[:1], max_batch_size=4) as mb:
        with pytest.raises(RuntimeError, match="returned 1 results for 2 items"):
            mb.submit(["a", "b"]).result(10)


# ---------------------------------------------------------------- routes


def test_health(client):
    h = client.get("/health").json()
    assert (h["status"], h["model_loaded"], h["device"], h["dtype"], h["error"]) == ("ok", True, "cpu", "fp32", None)
    assert h["model_name"] == "demo-untrained" and len(h["model_version"]) == 12 and h["labels"] == LABELS
    assert h["limits"] == {
        "max_text_chars": 200,
        "max_batch_size": 4,
        "max_body_bytes": 2048,
        "queue_limit": 16,
        "max_pending_bytes": 100 * 2**20,
        "max_header_bytes": 16384,
        "header_timeout_s": 10,
        "body_timeout_s": 30,
        "keep_alive_s": 5,
    }
    assert h["batching"]["enabled"] is True and h["batching"]["max_size"] == 32


def test_predict(client, classifier):
    r = client.post("/predict", json={"text": "Oil prices climb as stocks slide"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"label", "confidence", "probabilities"} and list(body["probabilities"]) == LABELS
    assert body["label"] == classifier.predict("Oil prices climb as stocks slide")["label"]


def test_predict_batch(client, classifier):
    texts = ["Striker scores twice", "A long sentence about central banks raising interest rates again", "NASA"]
    r = client.post("/predict/batch", json={"texts": texts})
    assert r.status_code == 200
    preds = r.json()["predictions"]
    assert [p["label"] for p in preds] == [p["label"] for p in classifier.predict_batch(texts)]


def test_docs_openapi_and_demo_page(client):
    assert client.get("/docs").status_code == 200 and "swagger" in client.get("/docs").text.lower()
    spec = client.get("/openapi.json").json()
    assert {"/", "/health", "/predict", "/predict/batch"} <= set(spec["paths"])
    assert "503" in spec["paths"]["/health"]["get"]["responses"]  # not ready: documented, as 200 is
    assert '"maxLength": 200' in json.dumps(spec) and '"maxItems": 4' in json.dumps(spec)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    shipped = (ROOT / "distrinews" / "static" / "index.html").read_text(encoding="utf-8")
    assert page.text == shipped and 'fetch("predict"' in page.text  # the package-data file, served as it is
    assert "h.limits.max_text_chars" in page.text  # the page takes its text limit from /health


BAD_INPUTS = {
    "empty text": ("post", "/predict", dict(json={"text": ""}), 422, "at least 1 character"),
    "white space only": ("post", "/predict", dict(json={"text": " \t\n "}), 422, "only white space"),
    # nothing to read: zero-width space, byte-order mark, NUL, right-to-left marks, an accent alone
    "invisible characters only": (
        "post",
        "/predict",
        dict(json={"text": "\u200b\ufeff\x00\u202e\u0301"}),
        422,
        "invisible",
    ),
    "compressed body": (
        "post",
        "/predict",
        dict(
            content=gzip.compress(b'{"text": "a"}'),
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        ),
        415,
        "Content-Encoding 'gzip' is not supported",
    ),
    "Content-Type twice": (  # the first counts, as FastAPI reads it: not a 422 for a body FastAPI would not parse
        "post",
        "/predict",
        dict(content=b'{"text": "a"}', headers=[("content-type", "text/plain"), ("content-type", "application/json")]),
        415,
        "not 'text/plain'",
    ),
    "JSON nested too deep": (
        "post",
        "/predict",
        dict(content=b"[" * 2000, headers={"content-type": "application/json"}),
        400,
        "could not be read as JSON (maximum recursion depth",
    ),
    "80 unknown keys": (
        "post",
        "/predict",
        dict(json={f"k{i}": 0 for i in range(80)}),
        422,
        "81 problems, the first 10",
    ),
    "text over the limit": ("post", "/predict", dict(json={"text": "x" * 201}), 422, "at most 200 characters"),
    "lone surrogate": (
        "post",
        "/predict",
        dict(content=b'{"text": "\\ud800"}', headers={"content-type": "application/json"}),
        422,
        "unicode",
    ),
    "empty batch": ("post", "/predict/batch", dict(json={"texts": []}), 422, "at least 1 item"),
    "batch over the limit": ("post", "/predict/batch", dict(json={"texts": ["a"] * 5}), 422, "at most 4 items"),
    "blank text in a batch": ("post", "/predict/batch", dict(json={"texts": ["ok", ""]}), 422, "texts"),
    "text is a number": ("post", "/predict", dict(json={"text": 42}), 422, "valid string"),
    "text is null": ("post", "/predict", dict(json={"text": None}), 422, "valid string"),
    "text is a list": ("post", "/predict", dict(json={"text": ["a"]}), 422, "valid string"),
    "texts is a string": ("post", "/predict/batch", dict(json={"texts": "abc"}), 422, "valid list"),
    "texts holds a number": ("post", "/predict/batch", dict(json={"texts": ["a", 1]}), 422, "valid string"),
    "body is a list": ("post", "/predict", dict(json=["text"]), 422, "valid dictionary"),
    "missing field": ("post", "/predict", dict(json={}), 422, "Field required"),
    "unknown field": ("post", "/predict", dict(json={"text": "a", "lang": "en"}), 422, "Extra inputs"),
    "invalid JSON": (
        "post",
        "/predict",
        dict(content=b'{"text": "a"', headers={"content-type": "application/json"}),
        422,
        "invalid JSON",
    ),
    "not JSON at all": (
        "post",
        "/predict",
        dict(content=b"text=hello", headers={"content-type": "text/plain"}),
        415,
        "Content-Type must be application/json, not 'text/plain'",
    ),
    "form-encoded (curl -d without -H)": (
        "post",
        "/predict/batch",
        dict(content=b'{"texts": ["a"]}', headers={"content-type": "application/x-www-form-urlencoded"}),
        415,
        "not 'application/x-www-form-urlencoded'",
    ),
    "no Content-Type": ("post", "/predict", dict(content=b'{"text": "a"}'), 415, "not ''"),
    # announced by Content-Length: refused before the body is read, in the same JSON as the chunked one below
    "body over the byte limit": ("post", "/predict", dict(json={"text": "y" * 3000}), 413, "limit of 2048 bytes"),
    "chunked body over the limit": (
        "post",
        "/predict",
        dict(content=iter([b'{"text": "', b"z" * 3000, b'"}']), headers={"content-type": "application/json"}),
        413,
        "larger than the limit of 2048 bytes",
    ),
    "not UTF-8": (
        "post",
        "/predict",
        dict(content=b'{"text": "caf\xe9"}', headers={"content-type": "application/json"}),
        400,
        "not valid UTF-8",
    ),
    "unknown route": (
        "get",
        "/predict/now",
        {},
        404,
        "no such path; this API has /, /health, /predict, /predict/batch",
    ),
    "trailing slash (no redirect)": ("get", "/health/", {}, 404, "no such path"),
    "unknown route (POST)": ("post", "/classify", dict(json={"text": "a"}), 404, "no such path"),
    "GET on a POST route": ("get", "/predict", {}, 405, "GET is not allowed on /predict: use POST"),
    "DELETE on /health": ("delete", "/health", {}, 405, "DELETE is not allowed on /health: use GET"),
    "PUT on /predict/batch": ("put", "/predict/batch", dict(json={"texts": ["a"]}), 405, "use POST"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_a_clear_4xx(client, name):
    method, path, kwargs, status, fragment = BAD_INPUTS[name]
    r = getattr(client, method)(path, **kwargs) if method != "delete" else client.delete(path)
    assert r.status_code == status, r.text
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-type"] == "application/json"
    detail = r.json()["detail"]
    assert fragment.lower() in json.dumps(detail).lower(), detail
    assert "Traceback" not in r.text


def test_head_health_and_nosniff(client):
    r = client.head("/health")
    assert (r.status_code, r.content) == (200, b"")
    assert client.get("/").headers["x-content-type-options"] == "nosniff"
    head, page = client.head("/"), client.get("/")  # an uptime probe's HEAD /: the page's headers, no body
    assert (head.status_code, head.content, head.headers["content-type"]) == (200, b"", page.headers["content-type"])
    assert "head" not in client.get("/openapi.json").json()["paths"]["/health"]
    head, scrape = client.head("/metrics"), client.get("/metrics")  # HEAD wherever GET is served (RFC 9110 9.1)
    assert (head.status_code, head.headers["content-type"]) == (200, scrape.headers["content-type"])  # (was a 405)


def test_settings_come_from_the_environment(checkpoint, monkeypatch, classifier):
    monkeypatch.setenv("DISTRINEWS_MAX_TEXT_CHARS", "10")
    monkeypatch.setenv("DISTRINEWS_BATCHING", "false")
    with TestClient(create_app(classifier=classifier)) as c:
        r = c.post("/predict", json={"text": "x" * 11})
        assert r.status_code == 422 and "at most 10 characters" in r.text
        assert c.post("/predict", json={"text": "x" * 10}).status_code == 200
        assert c.get("/health").json()["batching"]["max_size"] == 1


@pytest.mark.parametrize(
    "env, argv, says",
    [
        ({}, ["--batch-wait-ms", "-5"], "batch_wait_ms: Input should be greater than or equal to 0"),
        ({"DISTRINEWS_BATCH_WAIT_MS": "2000"}, [], "batch_wait_ms: Input should be less than or equal to 1000"),
        ({}, ["--threads", "many"], "num_threads: Input should be a valid integer"),
        ({}, ["--dtype", "fp8"], "dtype: Input should be 'auto', 'fp32' or 'bf16'"),
        ({}, ["--queue-limit", "2"], "queue_limit (2) must be at least max_batch_size (64)"),
        ({}, ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        ({}, ["--checkpoint"], "expected one argument"),
    ],
)
def test_a_bad_setting_stops_the_command_with_one_line(monkeypatch, capsys, env, argv, says):
    "From a flag or from the environment: exit code 2 and one line naming the setting; no traceback, no usage dump."
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith("distrinews-serve: error: ") and says in err, err
    assert err.count("\n") == 1 and "usage:" not in err, err


def test_flags_and_environment_variables_follow_from_serve_settings(monkeypatch, capsys):
    "Every field of ServeSettings is a flag and an environment variable (--help shows both); the flag wins."
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: distrinews-serve")
    for name in ServeSettings.model_fields:
        assert f"--{name.replace('_', '-')}" in out and f"DISTRINEWS_{name.upper()}" in out, name
    assert "--no-batching" in out and "--threads" in out
    monkeypatch.setenv("DISTRINEWS_BATCH_WAIT_MS", "3")
    monkeypatch.setenv("DISTRINEWS_PORT", "8000")
    s = CliApp.run(ServeSettings, cli_args=["--batch-wait-ms", "4", "--no-batching", "--threads", "2"])
    assert (s.batch_wait_ms, s.port, s.batching, s.num_threads) == (4.0, 8000, False, 2)


# ---------------------------------------------------------------- no model


@pytest.mark.parametrize(
    "setup, reason",
    [
        (lambda tmp: None, "no checkpoint configured"),
        (lambda tmp: tmp / "nowhere", "does not exist"),
        (lambda tmp: (tmp / "config.json").write_text("{oops") and tmp, "not valid JSON"),
    ],
)
def test_server_without_a_model_stays_up_and_says_why(tmp_path, setup, reason):
    with TestClient(create_app(ServeSettings(checkpoint=setup(tmp_path), **SMALL))) as c:
        h = c.get("/health")
        assert h.status_code == 503  # not ready: a platform sends it no traffic
        assert (h.json()["status"], h.json()["model_loaded"]) == ("unavailable", False) and reason in h.json()["error"]
        for r in (c.post("/predict", json={"text": "hello"}), c.post("/predict/batch", json={"texts": ["hello"]})):
            assert r.status_code == 503 and "model not loaded" in r.json()["detail"] and reason in r.json()["detail"]
            assert str(tmp_path) not in r.text and str(tmp_path) not in h.text
        assert c.head("/health").status_code == 503
        assert c.get("/").status_code == 200  # the demo page still renders
        assert c.post("/predict", json={"text": ""}).status_code == 422  # bad input is still the client's fault


# ---------------------------------------------------------------- batching and backpressure through the app


def _blocking(classifier):
    "A copy of `classifier` whose forward passes wait for `release`, and that records batch sizes."
    clf = copy.copy(classifier)
    clf.entered, clf.release, clf.sizes = threading.Event(), threading.Event(), []
    real = classifier.predict_batch

    def predict_batch(texts):
        clf.sizes.append(len(texts))
        clf.entered.set()
        clf.release.wait(30)
        return real(texts)

    clf.predict_batch = predict_batch
    return clf


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_requests_share_forward_passes(classifier, batching):
    clf = _blocking(classifier)
    settings = ServeSettings(**{**SMALL, "batching": batching, "batch_wait_ms": 0})
    with TestClient(create_app(settings, classifier=clf)) as c:
        batcher = c.app.state.batcher
        blocker = batcher.submit(["occupies the worker"])
        clf.entered.wait(10)
        results = {}

        def call(i):
            results[i] = c.post("/predict", json={"text": f"headline number {i}"})

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        wait_until(lambda: batcher.queued == 6)
        clf.release.set()
        for t in threads:
            t.join(30)
        blocker.result(30)
    assert all(r.status_code == 200 for r in results.values()) and len(results) == 6
    assert clf.sizes == ([1, 6] if batching else [1] * 7)
    want = {i: classifier.predict(f"headline number {i}")["label"] for i in range(6)}
    assert {i: r.json()["label"] for i, r in results.items()} == want


def test_full_queue_answers_503_with_retry_after(classifier):
    clf = _blocking(classifier)
    settings = ServeSettings(**{**SMALL, "queue_limit": 4, "retry_after_s": 3})
    with TestClient(create_app(settings, classifier=clf)) as c:
        batcher = c.app.state.batcher
        running = batcher.submit(["occupies the worker"])
        clf.entered.wait(10)
        waiting = batcher.submit(["a", "b", "c", "d"])  # the queue is now full
        r = c.post("/predict", json={"text": "one more"})
        assert r.status_code == 503 and r.headers["retry-after"] == "3" and "queue limit 4" in r.json()["detail"]
        r = c.post("/predict/batch", json={"texts": ["x", "y"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert c.get("/health").json()["batching"]["rejected"] == 2
        clf.release.set()
        assert len(waiting.result(30)) == 4 and running.result(30)
        assert c.post("/predict", json={"text": "after the rush"}).status_code == 200


# ---------------------------------------------------------------- clients that leave, and shutdown


async def _asgi_post(app, path: str, body: dict, leave: asyncio.Event) -> list[dict]:
    "POST `body` straight into the ASGI app; the client disconnects once `leave` is set. The messages the app sent."
    sent, pending = [], [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive():
        if pending:
            return pending.pop()
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"host", b"test")]
    scope = dict(
        type="http", asgi={"version": "3.0"}, http_version="1.1", method="POST", scheme="http", path=path,
        raw_path=path.encode(), query_string=b"", root_path="", headers=headers, client=("127.0.0.1", 5000),
        server=("test", 80),
    )  # fmt: skip
    await app(scope, receive, send)
    return sent


def test_an_abandoned_request_is_not_computed(classifier, caplog):
    "A client that disconnects while its request waits in the queue: dropped before the forward pass, and logged."
    clf = _blocking(classifier)
    with TestClient(create_app(ServeSettings(**SMALL), classifier=clf)) as c:
        batcher = c.app.state.batcher
        running = batcher.submit(["occupies the worker"])
        assert clf.entered.wait(10)

        async def scenario():
            leave = asyncio.Event()
            call = asyncio.ensure_future(_asgi_post(c.app, "/predict", {"text": "a client that leaves"}, leave))
            while batcher.queued == 0:  # its text is in the queue
                await asyncio.sleep(0.005)
            leave.set()
            return await asyncio.wait_for(call, 10)

        with caplog.at_level(logging.INFO, logger="distrinews.serve"):
            sent = asyncio.run(scenario())
        assert sent[0]["status"] == 499 and batcher.queued == 0
        clf.release.set()
        running.result(10)
        c.post("/predict", json={"text": "after"})  # the worker has gone past the abandoned job
        assert batcher.stats["cancelled"] == 1
        metrics = c.get("/metrics").text  # issue 37: the 499 is counted, and the one forward pass since the start
        assert 'distrinews_requests_total{route="/predict",status="499"} 1.0' in metrics
        assert 'distrinews_requests_total{route="/predict",status="200"} 1.0' in metrics
        assert "distrinews_batch_size_count 2.0" in metrics  # the blocker and "after"
    assert clf.sizes == [1, 1]  # the blocker, then "after": the abandoned text never reached the model
    assert any("499 client disconnected; its 1 text(s) dropped before their forward pass" in m for m in caplog.messages)


def test_an_abandoned_request_over_a_socket_is_not_computed(classifier, caplog):
    "The same through uvicorn as `distrinews-serve` runs it (in this process, on a loopback port): a client hangs up."
    clf = _blocking(classifier)
    app = create_app(ServeSettings(**SMALL), classifier=clf)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, http=HeaderDeadline, log_config=None, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started)
        batcher = app.state.batcher
        running = batcher.submit(["occupies the worker"])
        assert clf.entered.wait(10)
        body = json.dumps({"text": "a client that hangs up"}).encode()
        head = "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n"
        with caplog.at_level(logging.INFO, logger="distrinews.serve"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(head.encode() + body)
                wait_until(lambda: batcher.queued == 1)
            wait_until(lambda: batcher.stats["cancelled"] == 1)  # gone from the queue as the connection closed
        assert batcher.queued == 0
        clf.release.set()
        running.result(10)
    finally:
        clf.release.set()
        server.should_exit = True
        thread.join(10)
    assert clf.sizes == [1]  # only the forward pass that occupied the worker
    assert any("499 client disconnected; its 1 text(s) dropped before their forward pass" in m for m in caplog.messages)


def test_shutdown_refuses_new_work_and_finishes_or_refuses_queued(classifier):
    "After SIGTERM (begin_shutdown): not ready, new requests 503; queued texts run for half the shutdown time, then 503"
    clf = _blocking(classifier)
    settings = ServeSettings(**{**SMALL, "shutdown_timeout_s": 0.2, "retry_after_s": 2})
    with TestClient(create_app(settings, classifier=clf)) as c:
        batcher = c.app.state.batcher
        running = batcher.submit(["occupies the worker"])
        assert clf.entered.wait(10)
        results = {}
        waiting = threading.Thread(target=lambda: results.update(r=c.post("/predict", json={"text": "queued"})))
        waiting.start()
        wait_until(lambda: batcher.queued == 1)
        begin_shutdown(c.app)
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["error"] == "server is shutting down" and h.json()["model_loaded"]
        r = c.post("/predict", json={"text": "new"})
        assert r.status_code == 503 and r.headers["retry-after"] == "2" and "shutting down" in r.json()["detail"]
        waiting.join(10)  # the drain time (0.1 s) passes while the forward pass still runs: the queued text is refused
        assert results["r"].status_code == 503 and "shutting down" in results["r"].json()["detail"]
        clf.release.set()
        assert running.result(10)
    assert clf.sizes == [1]


def test_the_server_module_imports_no_training_module():
    """The Docker image runs `python -m distrinews.serve`: the server's own imports (read from its source) name none of
    the training stack, the benchmark harness or the scripts."""
    tree = ast.parse((ROOT / "distrinews" / "serve.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {"." * n.level + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    ours = {
        m.removeprefix("distrinews.").lstrip(".").split(".")[0] for m in imported if m.startswith(("distrinews.", "."))
    }
    assert ours == {"guard", "inference"}, ours  # guard: its defences (notebook 16), no training either


@pytest.mark.parametrize("held_by_others, max_body, refused", [(7_500, 10_000, 503), (0, 2_500, 413)])
def test_a_streamed_body_is_counted_chunk_by_chunk(held_by_others, max_body, refused):
    """The guard's byte count, one chunk at a time (a TestClient sends a body as one chunk): each chunk is counted as it
    arrives, and the one that would take the bodies in progress past `max_pending_bytes` (503), or this body past
    `max_body_bytes` (413), is refused and not counted."""
    from types import SimpleNamespace

    from fastapi import HTTPException

    settings = SimpleNamespace(body_timeout_s=5, max_body_bytes=max_body, max_pending_bytes=10_000, retry_after_s=1)
    state = SimpleNamespace(settings=settings, pending_bytes=held_by_others)
    chunks = iter([{"type": "http.request", "body": b"x" * 1000, "more_body": True}] * 3)

    async def receive():
        return next(chunks)

    async def read_three():
        counted = _in_time(receive, state)
        await counted()
        await counted()
        assert (counted.held, state.pending_bytes) == (2000, held_by_others + 2000)
        with pytest.raises(HTTPException) as e:
            await counted()  # 1,000 more: past one limit or the other
        assert (e.value.status_code, counted.held, state.pending_bytes) == (refused, 2000, held_by_others + 2000)

    asyncio.run(read_three())
