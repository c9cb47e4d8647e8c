"""Speculative decoding by prompt lookup against none, same engine, same weights, same run.

The workload it pays on: summaries and edits of a ~500-token text given in the prompt.
For each concurrency c, ``max(c, --requests)`` such requests (the tasks in turn) run in
rounds of c at a time, and each generates up to ``--new-tokens`` tokens greedily (EOS ends
them early, as it would a user's). Each round runs on the engine without speculation and
on the one with ``--speculative-config``, the first of the two alternating by round, so
both halves of a ratio see the same drift of a shared host (at c=1, request by request).
Greedy outputs are checked equal.
Reported: output tok/s each way and their ratio, the acceptance rate (accepted / drafted
tokens) and the mean accepted length (tokens a drafting step yields: 1 + accepted / drafts,
vLLM's "mean acceptance length").

    .venv/bin/python benchmarks/speculative.py [--concurrency 1,16] [--new-tokens 256]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 16, ...}']
        [--quantization auto|none|fp16|q8|q4]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import torch

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.speculative.config import SpeculativeConfig

DEFAULT_SPEC = (
    '{"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_max": 16, '
    '"prompt_lookup_min": 2}'
)
TEXT = """\
Incident report, storage cluster east-2, written for the operations review.

On Tuesday at 09:14 the monitoring system raised an alert: write latency on the storage
cluster east-2 had risen from 4 milliseconds to 180 milliseconds within two minutes. The
on-call engineer, Priya, acknowledged the alert at 09:17 and opened an incident channel.
Her first check showed that one of the twelve storage nodes, node seven, was answering
slowly, while the other eleven nodes were healthy. The load balancer kept sending one
twelfth of all writes to node seven, so every client that touched it waited.

At 09:26 Priya drained node seven from the load balancer. Write latency fell back to 6
milliseconds within a minute, and the alert cleared at 09:29. The cluster then ran on
eleven nodes, which is within its planned capacity of ten nodes at peak load. No data was
lost, because every write is stored on three nodes before it is acknowledged, and node
seven only held copies that also lived elsewhere.

The cause was found at 10:40. A firmware update, rolled out to node seven on Monday
evening, had changed the disk controller's write cache from write-back to write-through.
With the cache in write-through mode, every write waited for the disk itself. The update
had been tested on a spare node, but the spare used a different disk controller, so the
test could not show the problem. The other eleven nodes had not received the update yet,
because the rollout was scheduled in waves of one node per day.

The team rolled the firmware back on node seven at 11:05, checked that the write cache
was back in write-back mode, and returned the node to the load balancer at 11:20. The
rollout of the firmware update was paused for all remaining nodes.

Actions agreed in the review: first, the spare node gets the same disk controller as the
production nodes, so that tests match production. Second, the rollout checks the write
cache mode after every update and stops on its own if the mode changed. Third, the alert
for write latency fires per node as well as for the whole cluster, so that one slow node
is named in the alert itself. Priya owns the first action, Marco the second, and Lena the
third; all three are due by the end of next month.
"""
TASKS = [
    "Summarize the incident report above in five bullet points.",
    "Rewrite the incident report above for a non-technical manager, keeping every time.",
    "Copy the incident report above, fixing nothing, but replace 'node seven' by 'node 7'.",
    "List every time mentioned in the report above with what happened at that time.",
    "Write the three agreed actions from the report above as a checklist with owners.",
    "Rewrite the second and third paragraphs of the report above in the past perfect.",
    "Quote the sentence of the report above that explains why no data was lost.",
    "Edit the report above into a shorter version of about half its length.",
    "Summarize the incident report above in three sentences.",
    "Rewrite the first paragraph of the report above in the first person, as Priya.",
    "Copy the fourth paragraph of the report above word for word.",
    "Turn the report above into a timeline with one line per time and event.",
    "Rewrite the report above as an email to the team that announces the three actions.",
    "Copy the report above, replacing every person's name by their role.",
    "Explain the cause of the incident in the report above in two sentences.",
    "Rewrite the last paragraph of the report above as a numbered list.",
]
WARM_UP = "Say hello."  # not a task: a suffix history must not hold a measured reply's start


@dataclass
class Run:
    tokens: int = 0
    seconds: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    def add(self, other: Run) -> None:
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.outputs.update(other.outputs)


def prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    """The first ``count`` tasks on the report (the list again past its 16)."""
    return [chat(loaded, f"{TEXT}\n{TASKS[i % len(TASKS)]}") for i in range(count)]


def chat(loaded: LoadedModel, message: str) -> list[int]:
    tok = loaded.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    return tok(text, add_special_tokens=False)["input_ids"]


def run(
    engine: LLMEngine,
    batch: list[list[int]],
    new_tokens: int,
    tag: str,
    c: int | None = None,
    first: int = 0,
) -> Run:
    """Every prompt of ``batch``, ``c`` in flight at a time (default: all at once); their
    outputs keyed by index in the level's batch (``first`` is this batch's first)."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    outputs: dict[str, list[int]] = {}
    queue = list(enumerate(batch, first))[::-1]

    def admit() -> None:
        i, prompt = queue.pop()
        engine.add_request(EngineRequest(f"{tag}-{i}", prompt, params))

    start = time.perf_counter()
    for _ in range(min(c or len(batch), len(batch))):
        admit()
    while engine.has_unfinished():
        for out in engine.step():
            index = out.request_id.rsplit("-", 1)[1]
            for choice in out.outputs:
                outputs.setdefault(index, []).extend(choice.token_ids)
            if out.finished and queue:
                admit()
    seconds = time.perf_counter() - start
    return Run(sum(len(t) for t in outputs.values()), seconds, outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=8, help="requests per level (≥ c)")
    parser.add_argument("--speculative-config", default=DEFAULT_SPEC)
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    spec = SpeculativeConfig.parse(args.speculative_config)
    loaded = load_model(None, quantization=args.quantization)
    settings = {"quantization": args.quantization, "max_num_seqs": max(levels)}
    print(
        f"model {loaded.model_id}, quantization {loaded.quantization}, "
        f"threads {torch.get_num_threads()}, prompt {len(prompts(loaded, 1)[0])} tokens, "
        f"speculative: {spec.describe()}"
    )
    print(f"\nup to {args.new_tokens} new tokens per request, greedy")
    print("  c | plain tok/s | spec tok/s | ratio | acceptance | mean accepted length | same")
    for c in levels:
        # fresh engines a level: a suffix history starts empty, as a prefix cache does
        plain = LLMEngine(EngineConfig(**settings), loaded=loaded)
        drafting = LLMEngine(EngineConfig(**settings, speculative=spec), loaded=loaded)
        for engine in (plain, drafting):
            run(engine, [chat(loaded, WARM_UP)], 8, "warm")
        batch = prompts(loaded, max(c, args.requests))
        before = drafting.stats().spec_decode
        assert before is not None
        base, fast = Run(), Run()
        for number, at in enumerate(range(0, len(batch), c)):
            wave = batch[at : at + c]
            halves = [(plain, base, "plain"), (drafting, fast, "spec")]
            for engine, total, tag in halves[:: 1 if number % 2 == 0 else -1]:
                total.add(run(engine, wave, args.new_tokens, f"{tag}{c}", c, at))
        after = drafting.stats().spec_decode
        assert after is not None
        drafts = after.num_drafts - before.num_drafts
        drafted = after.num_draft_tokens - before.num_draft_tokens
        accepted = after.num_accepted_tokens - before.num_accepted_tokens
        rate = accepted / drafted if drafted else 0.0
        length = 1 + accepted / drafts if drafts else 1.0
        same = base.outputs == fast.outputs
        print(
            f"{c:>3} | {base.tok_s:>11.1f} | {fast.tok_s:>10.1f} | {fast.tok_s / base.tok_s:>4.2f}x"
            f" | {rate:>10.1%} | {length:>20.2f} | {'yes' if same else 'NO'}"
        )


if __name__ == "__main__":
    main()
