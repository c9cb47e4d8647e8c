import itertools

from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.config import Upstream
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Lease
from inhouse.gateway.settlement import charge

NAMES = itertools.count()


def _call(store: KeyStore, reached: bool, metered: bool = True) -> Call:
    key, _ = store.create(f"k{next(NAMES)}")
    needs = read_needs("chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    lease = Lease(Upstream("u", "http://u", None, "m"), None, True, 0.0) if reached else None
    route = None  # charge() never reads the route
    return Call(
        key, route, "chat/completions", needs, 40, 16, 56, False, 0.0, 0.0, {}, None,
        lease=lease, metered=metered,
    )  # type: ignore[arg-type]  # fmt: skip


def test_usage_is_charged_when_the_upstream_reports_it(store: KeyStore) -> None:
    outcome = Outcome(status=200, prompt_tokens=12, completion_tokens=3, content_chunks=5)
    assert charge(_call(store, reached=True), outcome) == (12, 3)


def test_without_usage_the_reserved_prompt_and_the_chunks_seen_are_charged(
    store: KeyStore,
) -> None:
    assert charge(_call(store, reached=True), Outcome(status=200, content_chunks=5)) == (40, 5)


def test_a_call_that_reached_no_upstream_charges_no_prompt(store: KeyStore) -> None:
    assert charge(_call(store, reached=False), Outcome(status=503)) == (0, 0)
    assert charge(_call(store, reached=True), Outcome(status=0)) == (0, 0)


def test_unmetered_calls_charge_nothing(store: KeyStore) -> None:
    outcome = Outcome(status=200, prompt_tokens=12, completion_tokens=3)
    assert charge(_call(store, reached=True, metered=False), outcome) == (0, 0)


def test_a_cut_off_answer_is_charged_its_counted_prompt_not_the_estimate(
    store: KeyStore,
) -> None:
    outcome = Outcome(status=200, content_chunks=2, prompt_counted=33)
    assert charge(_call(store, reached=True), outcome) == (33, 2)
