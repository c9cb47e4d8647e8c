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
