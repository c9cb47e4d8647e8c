import subprocess
import sys

from typer.testing import CliRunner

from inhouse import __version__
from inhouse.cli import app


def test_version_command_prints_package_version() -> None:
    result = CliRunner().invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == __version__


def test_a_bad_serve_flag_is_one_line_and_exit_2() -> None:
    for flags, message in (
        (["--quantization", "int3"], "unknown quantization 'int3'"),
        (["--max-num-seqs", "0"], "max_num_seqs must be at least 1"),
        (["--kv-cache-memory", "lots"], "cannot read 'lots' as a size"),
        (["--scheduling-policy", "lottery"], "unknown scheduling policy 'lottery'"),
        (["--long-prefill-token-threshold", "-1"], "must be at least 0, got -1"),
    ):
        result = CliRunner().invoke(app, ["serve", *flags])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())


def test_python_dash_m_inhouse_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inhouse", "version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __version__


def test_help_shows_config_sections_in_brackets() -> None:
    """Typer's rich help takes `[cost]` for markup unless it is escaped."""
    for command in (["cost", "--help"], ["teams", "create", "--help"], ["up", "--help"]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "[cost]" in result.output, command
