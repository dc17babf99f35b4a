"""The training scripts that notebooks 03 and 04 write here, installed as `distrinews.scripts` (see setup.py)."""
