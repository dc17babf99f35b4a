"""The reference design's single `.pt` checkpoint (optional notebook 13): converted to a checkpoint folder with
`weights_only=True` and the same predictions, refused where it would run code or does not fit its architecture, from
Python and from a shell; the loader of notebook 05 serves folders only and says how to convert a `.pt` file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Payload

from distrinews.convert import convert_reference_checkpoint, load_reference_checkpoint, main
from distrinews.inference import InvalidCheckpointError, load_classifier
from distrinews.model import LABELS, OFFLINE_ENCODER, RANDOM_DISTILBERT, build_classifier, load_tokenizer, predict

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


class NewsClassifier(torch.nn.Module):
    "The reference design's wrapper: the HF model sits in `.model`."

    def __init__(self, model):
        super().__init__()
        self.model = model


def test_reference_checkpoint_converts_with_same_predictions(tmp_path):
    model = build_classifier(OFFLINE_ENCODER, seed=7).eval()
    state = {"module." + k: v for k, v in NewsClassifier(model).state_dict().items()}  # saved from DDP
    torch.save(
        {
            "epoch": 2,
            "model_state_dict": state,
            "optimizer_state_dict": {"state": {}, "param_groups": []},
            "accuracy": 91.5,
            "config": {"model_name": OFFLINE_ENCODER, "num_labels": 4, "max_length": 48},
        },
        tmp_path / "ref.pt",
    )
    out = convert_reference_checkpoint(tmp_path / "ref.pt", tmp_path / "converted")
    assert (out / "model.safetensors").exists() and not list(out.glob("*.pt"))
    clf = load_classifier(out, dtype="fp32")
    texts = ["Stocks rally", "Striker scores twice in the cup final"]
    expected = predict(model, load_tokenizer(OFFLINE_ENCODER), texts, max_length=48)
    for got, want in zip(clf.predict_batch(texts), expected):
        assert got["label"] == want["label"] and abs(got["confidence"] - want["confidence"]) < 1e-5
    assert clf.max_length == 48 and json.loads((out / "run_config.json").read_text())["accuracy"] == 91.5


def test_reference_distilbert_checkpoint_converts_offline(tmp_path):
    "The reference design's own case: distilbert-base-uncased, not downloadable here; every weight comes from the file."
    model = build_classifier(RANDOM_DISTILBERT, seed=5).eval()
    torch.save(
        {
            "model_state_dict": NewsClassifier(model).state_dict(),
            "config": {"model_name": "distilbert-base-uncased", "num_labels": 4, "max_length": 32},
        },
        tmp_path / "d.pt",
    )
    clf = load_classifier(convert_reference_checkpoint(tmp_path / "d.pt", tmp_path / "d"), dtype="fp32")
    want = predict(model, load_tokenizer(RANDOM_DISTILBERT), ["Mars rover lands"], max_length=32)[0]
    got = clf.predict("Mars rover lands")
    assert got["label"] == want["label"] and abs(got["confidence"] - want["confidence"]) < 1e-5
    assert clf.name == "distilbert-base-uncased-agnews"


def test_reference_checkpoint_with_wrong_architecture(tmp_path):
    state = build_classifier(OFFLINE_ENCODER, seed=0).state_dict()
    torch.save({"model_state_dict": state, "config": {"model_name": RANDOM_DISTILBERT}}, tmp_path / "x.pt")
    with pytest.raises(InvalidCheckpointError, match="does not match the architecture"):
        load_reference_checkpoint(tmp_path / "x.pt")
    torch.save({"model_state_dict": state, "config": {"num_labels": 20}}, tmp_path / "y.pt")
    with pytest.raises(InvalidCheckpointError, match="num_labels=20"):
        load_reference_checkpoint(tmp_path / "y.pt")
    (tmp_path / "z.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InvalidCheckpointError, match="not a PyTorch checkpoint"):
        load_reference_checkpoint(tmp_path / "z.pt")


def test_a_pickle_that_runs_code_is_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "pwned.txt"
    torch.save({"model_state_dict": {"w": torch.zeros(1)}, "epoch": Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(InvalidCheckpointError, match="Refused to load .* other than tensors and plain values"):
        convert_reference_checkpoint(tmp_path / "evil.pt", tmp_path / "out")
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "evil.pt"), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and err.startswith("python -m distrinews.convert: error: Refused to load")
    assert len(err.strip().splitlines()) == 1 and not marker.exists() and not (tmp_path / "out").exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)  # ...and the payload is real
    assert marker.exists()


def test_the_loader_serves_folders_and_says_how_to_convert_a_pt_file(tmp_path):
    torch.save({"model_state_dict": build_classifier(OFFLINE_ENCODER, seed=0).state_dict()}, tmp_path / "ref.pt")
    with pytest.raises(InvalidCheckpointError) as refused:
        load_classifier(tmp_path / "ref.pt")
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert f"Convert it first: python -m distrinews.convert {tmp_path / 'ref.pt'} OUT_DIR" in message


@pytest.mark.slow
def test_convert_from_a_shell(tmp_path):
    "`python -m distrinews.convert ref.pt out_dir` writes a folder that loads; a bad file exits 1 with one line."
    model = build_classifier(OFFLINE_ENCODER, seed=1).eval()
    torch.save({"model_state_dict": model.state_dict(), "config": {"model_name": OFFLINE_ENCODER}}, tmp_path / "r.pt")
    command = [sys.executable, "-m", "distrinews.convert", str(tmp_path / "r.pt"), str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "distrinews-serve --checkpoint" in done.stdout
    assert load_classifier(tmp_path / "out", dtype="fp32").labels == LABELS
    (tmp_path / "bad.pt").write_bytes(b"no")
    command[3:] = [str(tmp_path / "bad.pt"), str(tmp_path / "bad")]
    bad = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "not a PyTorch checkpoint" in bad.stderr
