"""The kernels' work pool under stress: a C++ program (``work_pool_stress.cpp``) runs
100,000 short jobs over more threads than this machine's cores, the pool's helpers pausing
at random between their reads of the shared job (``INHOUSE_POOL_WINDOW``), and checks
that every job ran each index once, all before ``run()`` returned.

The pool used to publish a job's size before closing the last job to claims: a helper
that had read the last job's state just as it ended could then claim a chunk with the
new job's size, run the new body on it and count it done, so the caller returned while
a real chunk still ran against freed memory (CI's two segfaults in a helper thread). This
program found that within ~15-70k jobs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from inhouse.engine.kernels.build import HEADERS

STRESS = Path(__file__).with_name("work_pool_stress.cpp")
COMPILER = shutil.which("g++") or shutil.which("c++")


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler to build the stress program")
@pytest.mark.timeout(300)
def test_every_job_runs_each_index_once_before_run_returns(tmp_path: Path) -> None:
    from torch.utils.cpp_extension import include_paths

    program = tmp_path / "work_pool_stress"
    torch_lib = Path(torch.__file__).parent / "lib"
    subprocess.run(
        [
            COMPILER,
            "-O2",
            "-std=c++17",
            "-pthread",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{HEADERS[0].parent}",
            *(f"-I{p}" for p in include_paths()),
            str(STRESS),
            f"-L{torch_lib}",
            "-lc10",
            "-ltorch_cpu",
            f"-Wl,-rpath,{torch_lib}",
            "-o",
            str(program),
        ],
        check=True,
        capture_output=True,
    )
    run = subprocess.run([program, "100000", "3"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stdout + run.stderr
