"""`inhouse bench run --mix`: class specs parsed and bounded, and refused with one clear line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inhouse.bench.mix import MixClass, parse_mix, parse_mix_class
from inhouse.bench.settings import SettingsError
from inhouse.cli import app


def parse(text: str) -> MixClass:
    return parse_mix_class(text, input_len=256, output_len=128)


def test_a_class_takes_its_shape_tags_and_the_runs_lengths_by_default() -> None:
    spec = parse(
        "interactive: max-concurrency=1, num-prompts=20, input-len=40, priority=-1, "
        "cache-salt=alice, delay=2.5s, api-key-env=ALICE_KEY"
    )
    assert (spec.name, spec.max_concurrency, spec.num_prompts) == ("interactive", 1, 20)
    assert (spec.input_len, spec.output_len, spec.delay) == (40, 128, 2.5)
    assert spec.extra_body() == {"priority": -1, "cache_salt": "alice"}
    assert not spec.background
    batch = parse("batch: max-concurrency=16")
    assert batch.background and batch.extra_body() == {}
    assert batch.to_json()["background"] is True


def test_a_class_key_comes_from_its_variable_and_never_reaches_the_record() -> None:
    spec = parse("a: num-prompts=1, api-key-env=A_KEY")
    assert spec.api_key("run-key", {"A_KEY": "secret-a"}) == "secret-a"
    assert parse("b: num-prompts=1").api_key("run-key", {}) == "run-key"
    assert "secret-a" not in str(spec.to_json()) and spec.to_json()["api_key_env"] == "A_KEY"
    with pytest.raises(SettingsError, match="A_KEY is not set"):
        spec.api_key("run-key", {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max-concurrency=2", "start with a class name"),
        ("bad name: num-prompts=1", "start with a class name"),
        ("a: max-concurrency=0", r"max-concurrency must lie in 1\.\.4096"),
        ("a: max-concurrency=two", "is not an integer"),
        ("a: input-len=0", "input-len must lie in"),
        ("a: num-prompts=10000000", "num-prompts must lie in"),
        ("a: priority=99999999999", "priority must lie in"),
        ("a: duration=nan", "duration must lie in"),
        ("a: delay=-1", "delay must lie in"),
        ("a: speed=9", "is not one of"),
        ("a: max-concurrency", "is not one of"),
        ("a: api-key-env=1BAD", "is not a variable name"),
        ("a: cache-salt=" + "x" * 1025, "cache-salt must have 1 to 1024"),
    ],
)
def test_a_bad_class_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse(text)


def test_a_mix_needs_two_distinct_classes_and_one_that_ends() -> None:
    with pytest.raises(SettingsError, match="2 to 8 classes, not 1"):
        parse_mix(["a: num-prompts=1"], input_len=8, output_len=8)
    with pytest.raises(SettingsError, match="names must differ"):
        parse_mix(["a: num-prompts=1", "a: num-prompts=2"], input_len=8, output_len=8)
    with pytest.raises(SettingsError, match="at least one class num-prompts"):
        parse_mix(["a: max-concurrency=1", "b: max-concurrency=2"], input_len=8, output_len=8)


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", "run", "--base-url", "http://127.0.0.1:9", *args])


def test_the_cli_refuses_a_bad_mix_before_sending_anything() -> None:
    one = ["--model", "m", "--mix", "a: num-prompts=1", "--mix", "b: max-concurrency=2"]
    result = bench(*one, "--max-concurrency", "4")
    assert result.exit_code == 2 and "drop --max-concurrency" in result.output
    result = bench("--model", "m", "--mix", "a: num-prompts=1", "--mix", "b: warp=9")
    assert result.exit_code == 2 and "'warp=9' is not one of" in result.output
    unset = "b: max-concurrency=2, api-key-env=INHOUSE_TEST_UNSET_KEY"
    result = bench("--model", "m", "--mix", "a: num-prompts=1", "--mix", unset)
    assert result.exit_code == 2 and "INHOUSE_TEST_UNSET_KEY is not set" in result.output
