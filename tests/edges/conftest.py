"""The edge tests' shared stack (see `stack`): serve with a small context, so that no
fuzzed request generates for long, and the gateway in front."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stack import Edges, Target, running_edges

__all__ = ["Edges", "Target"]  # the tests' fixture types

MAX_MODEL_LEN = 128  # bounds what any fuzzed request can generate


@pytest.fixture(scope="session")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edges]:
    with running_edges(tmp_path_factory.mktemp("edges"), MAX_MODEL_LEN, "64MiB") as stack:
        yield stack
