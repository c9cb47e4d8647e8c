"""Chat and completions through the official openai client against a real server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import RunningServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_health_answered_503_while_loading_then_200(server: RunningServer) -> None:
    assert server.health_seen[-1] == 200
    assert 503 in server.health_seen


def test_models_lists_the_chat_and_embedding_models(server: RunningServer) -> None:
    models = server.client().models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL, "all-MiniLM-L6-v2"]


def test_stream_and_whole_answers_agree_for_greedy(server: RunningServer) -> None:
    client = server.client()
    whole = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_completion_tokens=12
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            temperature=0,
            max_completion_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    # the second identical prompt found its full blocks in the prefix cache
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens > 0


def test_n_gives_that_many_choices(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL, messages=QUESTION, n=2, temperature=1.0, seed=3, max_tokens=6
    )
    assert sorted(c.index for c in reply.choices) == [0, 1]
    assert all(c.message.content for c in reply.choices)
    assert 2 <= reply.usage.completion_tokens <= 12
    chunks = list(
        server.client().chat.completions.create(
            model=MODEL, messages=QUESTION, n=2, temperature=1.0, seed=3, max_tokens=6, stream=True
        )
    )
    streamed = {0: "", 1: ""}
    finished = set()
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1}
    # the same seed gives the same two samples, streamed or not
    assert streamed == {c.index: c.message.content for c in reply.choices}


def test_stop_string_ends_the_answer_before_it(server: RunningServer) -> None:
    client = server.client()
    free = (
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
        .choices[0]
        .message.content
    )
    words = free.split()
    assert len(words) >= 3
    stop = words[2]
    cut = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, stop=[stop]
    ).choices[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.message.content
    assert free.startswith(cut.message.content)
    streamed = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, stop=[stop], stream=True
    )
    # no piece of the stop string leaks into the stream
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == cut.message.content


def test_seed_reproduces_a_sampled_answer(server: RunningServer) -> None:
    client = server.client()

    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=1.0, seed=seed, max_tokens=10
        )
        return reply.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_logprobs_have_openai_shape(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        # greedy: the chosen token is the most likely one
        assert entry.token == entry.top_logprobs[0].token


def test_completions_endpoint_with_echo_and_logprobs(server: RunningServer) -> None:
    client = server.client()
    prompt = "The capital of France is"
    reply = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    choice = reply.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    assert len(choice.logprobs.tokens) == reply.usage.completion_tokens == 5
    assert all(len(top) <= 3 for top in choice.logprobs.top_logprobs)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, temperature=0, stream=True
        )
        if c.choices
    )
    assert prompt + streamed == choice.text


def test_completions_batch_of_prompts(server: RunningServer) -> None:
    reply = server.client().completions.create(
        model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=3, temperature=0, n=2
    )
    assert [c.index for c in sorted(reply.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    assert reply.choices[0].text == reply.choices[1].text  # greedy siblings agree


def test_tokenize_detokenize_round_trip(server: RunningServer) -> None:
    http = server.http()
    text = "Hello, inhouse! Ünïcödé works too."
    tokens = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] > 0
    back = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back["prompt"] == text
    chat = http.post("/tokenize", json={"messages": QUESTION}).json()
    assert chat["count"] > tokens["count"] - 20


def test_version_reports_model_and_hashes(server: RunningServer) -> None:
    info = server.http().get("/version").json()
    assert info["served_model_name"] == MODEL
    assert len(info["model_sha256"]) == 64
    assert len(info["chat_template_sha256"]) == 64
    # the default on a CPU: the bundled GGUF's own Q4_1 blocks (q4) on our C++ kernels
    # where they build (make builds them), else native bf16 or fbgemm's fp16 weights;
    # /version says why. The cache is float16 under the kernels, else the dtype.
    assert (info["dtype"], info["quantization"], info["kv_cache_dtype"]) in {
        ("float32", "q4", "float16"),
        ("float32", "fp16", "float32"),
        ("bfloat16", "none", "bfloat16"),
    }
    assert info["path_reason"]
