"""Packaging for DistriNews, driven by `settings.ini` (the nbdev 2 convention)."""

from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]


def split(key):
    "A space-separated list from settings.ini (empty when the key is missing)."
    return cfg.get(key, "").split()


readme = Path(__file__).parent / "README.md"
setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=readme.read_text(encoding="utf-8") if readme.exists() else cfg["description"],
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    url=cfg["git_url"],
    keywords=cfg["keywords"],
    python_requires=f">={cfg['min_python']}",
    # the training scripts that notebooks 03 and 04 write into nbs/ ship inside the package as `distrinews.scripts`, so
    # that a session without this repository (Kaggle, Ray workers) runs the very same files: one program, one copy
    packages=[
        *setuptools.find_packages(include=[cfg["lib_name"], f"{cfg['lib_name']}.*"]),
        f"{cfg['lib_name']}.scripts",
    ],
    package_dir={f"{cfg['lib_name']}.scripts": "nbs"},
    include_package_data=True,
    package_data={cfg["lib_name"]: ["static/*"]},  # the demo page (distrinews/static/index.html)
    install_requires=split("requirements") + split("pip_requirements"),
    extras_require={
        "dev": split("dev_requirements"),
        "scale": split("scale_requirements"),
        "track": split("track_requirements"),
    },
    entry_points={
        "console_scripts": split("console_scripts"),
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    zip_safe=False,
)
