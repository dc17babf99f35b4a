#!/usr/bin/env bash
# Are the generated files what their sources write? distrinews/ (nbdev_export of nbs/), the notebooks' metadata
# (nbdev_clean) and README.md (`make readme`). Checked on a copy, so a hand edit is reported, never overwritten, and
# uncommitted work is fine. Used by `make check` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.venv/bin"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp -r settings.ini setup.py nbs distrinews "$tmp"/
(cd "$tmp" && "$BIN/nbdev_export" && "$BIN/nbdev_clean")
status=0
diff -r -q -x __pycache__ "$tmp/distrinews" distrinews \
  || { echo "distrinews/ is not what nbs/ export: edit the notebook, then run nbdev_export."; status=1; }
for nb in nbs/*.ipynb; do
  cmp -s "$tmp/$nb" "$nb" || { echo "$nb: execution metadata left (run nbdev_clean, or make install-hooks)"; status=1; }
done
make -s readme README_OUT="$tmp/README.md"
cmp -s "$tmp/README.md" README.md || { echo "README.md is not what nbs/index.ipynb renders: run 'make readme'."; status=1; }
exit $status
