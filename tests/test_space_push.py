"""Pushing a staged Space with git and git-lfs (notebook 06's second road), rehearsed against a local bare repository
whose pre-receive hook refuses what a Hugging Face Space refuses: a blob over 10 MB that git stores itself instead of
as an LFS pointer. The folder `stage_space` makes goes through, its weights arriving in the remote's LFS store; the same
folder without its `.gitattributes` is refused. Debian's git-lfs pushes to a plain path with its built-in standalone
transfer, so no server is needed (tests/run_tests.sh installs git-lfs with apt-get where it runs as root).
"""

import hashlib
import json
import os
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, load_script
from safetensors.torch import save_file

staging = load_script(ROOT / "deployment" / "stage_space.py")  # what notebook 06 writes
SPACE_FILE_LIMIT, stage_space = staging.SPACE_FILE_LIMIT, staging.stage_space
pytestmark = pytest.mark.slow  # git and git-lfs processes
GIT_ENV = dict(
    os.environ,
    GIT_CONFIG_GLOBAL=os.devnull,  # none of the developer's settings
    GIT_CONFIG_NOSYSTEM="1",
    GIT_AUTHOR_NAME="learner",
    GIT_AUTHOR_EMAIL="learner@example.com",
    GIT_COMMITTER_NAME="learner",
    GIT_COMMITTER_EMAIL="learner@example.com",
)
# the Spaces rule, as the remote's pre-receive hook: no pushed blob over 10 MB (an LFS pointer is a blob of ~130 bytes)
HOOK = f"""#!/bin/sh
while read old new ref; do
  git rev-list --objects "$new" --not --all | git cat-file --batch-check='%(objecttype) %(objectsize) %(rest)' |
    awk '$1 == "blob" && $2 > {SPACE_FILE_LIMIT} {{ print "refused: " $3 " is " $2 " bytes: use Git LFS"; bad = 1 }}
         END {{ exit bad }}' || exit 1
done
"""


def git(cwd, *args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(["git", *map(str, args)], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 or not check, f"git {' '.join(map(str, args))} failed:\n{p.stderr}"
    return p


def space_remote(path):
    "A bare repository at `path` that refuses what a Space refuses."
    git(path.parent, "init", "-q", "--bare", "-b", "main", path)
    (path / "hooks" / "pre-receive").write_text(HOOK)
    (path / "hooks" / "pre-receive").chmod(0o755)
    return path


def push(folder, remote) -> subprocess.CompletedProcess:
    "06's git road: a repository in `folder` with the LFS hooks, everything committed, pushed to `remote`."
    git(folder, "init", "-q", "-b", "main")
    git(folder, "lfs", "install", "--local")
    git(folder, "add", ".")
    git(folder, "commit", "-q", "-m", "DistriNews API")
    git(folder, "remote", "add", "space", remote)  # git-lfs finds a named remote's LFS store (a bare URL: it cannot)
    return git(folder, "push", "space", "main", check=False)


@pytest.fixture
def staged(tmp_path):
    "A Space staged from a fake checkpoint: 12 MB of weights and an 11 MB tokenizer.json, both over the limit."
    if shutil.which("git-lfs") is None:
        pytest.skip("git-lfs is not installed: apt-get install git-lfs (or brew install git-lfs)")
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (ckpt / "tokenizer.json").write_text(json.dumps({"vocab": "x" * 11_000_000}))  # as large as XLM-R's
    save_file(
        {"weight": torch.randn(3_000_000, generator=torch.Generator().manual_seed(0))}, ckpt / "model.safetensors"
    )
    return stage_space(ckpt, tmp_path / "space", ROOT / "deployment")


def test_staged_space_pushes_with_lfs_and_is_refused_without(staged, tmp_path):
    pushed = push(staged, space_remote(tmp_path / "space.git"))
    assert pushed.returncode == 0, pushed.stderr
    stored = git(staged, "lfs", "ls-files", "--name-only").stdout.split()
    assert sorted(stored) == ["model/model.safetensors", "model/tokenizer.json"]  # by pattern, and by name
    for name in stored:  # the files themselves reached the remote's LFS store
        oid = hashlib.sha256((staged / name).read_bytes()).hexdigest()
        assert (tmp_path / "space.git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid).is_file(), name

    plain = tmp_path / "plain"  # the same files without the .gitattributes: git stores them itself
    shutil.copytree(staged, plain, ignore=shutil.ignore_patterns(".git", ".gitattributes"))
    refused = push(plain, space_remote(tmp_path / "refusing.git"))
    assert refused.returncode != 0, "a Space would have refused this push"
    assert "pre-receive hook declined" in refused.stderr, refused.stderr
    for name in ("model/model.safetensors", "model/tokenizer.json"):
        assert f"refused: {name} is" in refused.stderr, refused.stderr
