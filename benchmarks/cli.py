"""The command line of a measuring function of `distrinews.benchmarks`: one flag per keyword parameter
(`world_sizes` -> `--world-sizes 1 2`, `control=True` -> `--control/--no-control`), its help the comment beside the
parameter in the function (fastcore's `docments`, which nbdev shows in the docs too)."""

import argparse
import inspect

from fastcore.docments import docments


def run(function, **defaults):
    "Parse the command line into `function`'s parameters (`defaults` replace the function's own) and call it."
    p = argparse.ArgumentParser(description=inspect.getdoc(function))
    helps = docments(function)
    for name, param in inspect.signature(function).parameters.items():
        default = defaults.get(name, param.default)
        flag, kind = f"--{name.replace('_', '-')}", type(default)
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=helps.get(name))
        elif isinstance(default, (list, tuple)):
            p.add_argument(flag, nargs="+", type=type(default[0]), default=list(default), help=helps.get(name))
        else:
            p.add_argument(flag, type=kind, default=default, help=helps.get(name))
    args = vars(p.parse_args())
    try:
        return function(**args)
    except ValueError as e:  # a bad setting (the functions check theirs first): one line, not a traceback
        p.error(str(e))
