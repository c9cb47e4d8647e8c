import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from inhouse.bench.datasets import (
    DatasetError,
    LengthSpec,
    random_dataset,
    read_jsonl,
    shared_prefix_dataset,
)
from inhouse.manifests.bundled import default_embedding_model


class LocalTokenizerCounter:
    """A real tokenizer (the bundled MiniLM's) standing where the server's /tokenize would."""

    def __init__(self) -> None:
        self._tokenizer = Tokenizer.from_file(str(default_embedding_model() / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    async def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def counter() -> LocalTokenizerCounter:
    return LocalTokenizerCounter()


async def _random(counter, **kwargs):  # type: ignore[no-untyped-def]
    return await random_dataset(
        40, LengthSpec(120, 0.5), LengthSpec(30, 0.2), seed=7, counter=counter, **kwargs
    )


def test_random_prompts_have_the_intended_token_lengths(counter: LocalTokenizerCounter) -> None:
    import asyncio

    requests = asyncio.run(_random(counter, endpoint="completions"))
    assert [r.index for r in requests] == list(range(40))
    lengths = [r.intended_input_tokens for r in requests]
    assert min(lengths) >= 60 and max(lengths) <= 180 and len(set(lengths)) > 10
    for request in requests:
        measured = asyncio.run(counter.count(request.prompt))
        assert abs(measured - request.intended_input_tokens) <= 1
        assert 24 <= request.max_tokens <= 36 and request.messages is None


def test_random_is_repeatable_by_seed_and_chat_shaped(counter: LocalTokenizerCounter) -> None:
    import asyncio

    first, second = asyncio.run(_random(counter)), asyncio.run(_random(counter))
    assert first == second
    assert first[0].endpoint == "chat" and first[0].messages[0]["role"] == "user"
    assert len({r.messages[0]["content"][:40] for r in first}) == 40  # no accidental shared prefix


def test_template_overhead_is_taken_off_the_text(counter: LocalTokenizerCounter) -> None:
    import asyncio

    requests = asyncio.run(
        random_dataset(
            5, LengthSpec(100), LengthSpec(8), seed=1, counter=counter, template_overhead=10
        )
    )
    for request in requests:
        assert request.intended_input_tokens == 100
        assert abs(asyncio.run(counter.count(request.messages[0]["content"])) - 90) <= 1


def test_shared_prefix_has_one_system_prompt_and_distinct_questions(
    counter: LocalTokenizerCounter,
) -> None:
    import asyncio

    requests = asyncio.run(
        shared_prefix_dataset(20, 4, 300, LengthSpec(20), LengthSpec(16), seed=3, counter=counter)
    )
    systems = {r.messages[0]["content"] for r in requests}
    questions = [r.messages[1]["content"] for r in requests]
    assert len(systems) == 1 and abs(asyncio.run(counter.count(systems.pop())) - 300) <= 1
    assert len(set(questions)) == 4 and questions[0] == questions[4]
    completions = asyncio.run(
        shared_prefix_dataset(
            4, 2, 50, LengthSpec(5), LengthSpec(4), seed=3, endpoint="completions", counter=counter
        )
    )
    assert len({r.prompt.split("\n\n")[0] for r in completions}) == 1


def test_jsonl_reads_chat_and_completion_lines(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 40},
        {"prompt": "Once upon a time"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    chat, completion = read_jsonl(path, default_max_tokens=64)
    assert chat.endpoint == "chat" and chat.max_tokens == 40
    assert completion.endpoint == "completions" and completion.max_tokens == 64
    assert completion.prompt == "Once upon a time"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 1: not JSON"),
        ('{"text": "x"}', 'needs "messages"'),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        ("", "holds no prompts"),
        ('{"messages": [{"content": "x"}]}', "role, content"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(DatasetError, match=message):
        read_jsonl(path, 16)
    with pytest.raises(DatasetError, match="cannot read"):
        read_jsonl(tmp_path / "missing.jsonl", 16)


def test_several_prefixes_ask_each_question_of_each_document_once_per_round(
    counter: LocalTokenizerCounter,
) -> None:
    import asyncio

    requests = asyncio.run(
        shared_prefix_dataset(
            24, 3, 60, LengthSpec(8), LengthSpec(4), seed=5, counter=counter, num_prefixes=4
        )
    )
    pairs = [(r.messages[0]["content"], r.messages[1]["content"]) for r in requests]
    assert len(set(pairs[:12])) == 12 and pairs[12:] == pairs[:12]  # each pair once a round
    documents = [document for document, _ in pairs[:12]]
    assert len(set(documents)) == 4 and all(documents.count(d) == 3 for d in documents)
    assert documents != sorted(documents, key=documents.index)  # shuffled, not doc by doc
    single = asyncio.run(
        shared_prefix_dataset(8, 4, 60, LengthSpec(8), LengthSpec(4), seed=5, counter=counter)
    )  # one prefix: as before, its questions in turn
    assert [r.messages[1]["content"] for r in single[:4]] == [
        r.messages[1]["content"] for r in single[4:]
    ]
