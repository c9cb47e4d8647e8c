"""``python -m inhouse``: the same CLI as the ``inhouse`` command."""

from inhouse.cli import main

main()
