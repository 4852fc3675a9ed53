"""The choice of a claim's configuration (:func:`choose_next`), without a database: from the
study's results, active leases and re-queue candidates as plain values."""

from __future__ import annotations

from typing import Any

from cleanslate.store import LeaseOutcome, LeaseRecord, LeaseState
from cleanslate.store._claims import Choice, Pool, Unreadable, choose_next


def configs(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(f"k{i}", {"x": i}) for i in range(n)]


def lease(row_id: int, key: str, *, outcome: LeaseOutcome | None = None,
          state: LeaseState = LeaseState.EXPIRED) -> LeaseRecord:
    return LeaseRecord(id=row_id, study="s", key=key, params={"x": row_id}, worker="w",
                       host="local", port=30000, slot="local/port=30000", state=state,
                       outcome=outcome)


def sampled(pool: Pool, limit: int = 5, passed: set[int] | None = None,
            first: list[tuple[str, dict[str, Any]]] | None = None) -> Choice:
    return choose_next(pool, plan=None, first=first or [], limit=limit, fresh="new:f",
                       passed=passed or set())


def test_a_plan_gives_its_first_configuration_not_taken() -> None:
    pool = Pool(finished=["k0"], active={"k1"}, counted={"k2"})
    choice = choose_next(pool, plan=configs(5), first=(), limit=5, fresh="new:f")
    assert choice.configuration == ("k3", {"x": 3}) and not choice.done


def test_a_plan_is_done_when_its_first_limit_configurations_have_results() -> None:
    pool = Pool(finished=["k0", "k1"], active=set())
    done = choose_next(pool, plan=configs(5), first=(), limit=2, fresh="new:f")
    assert done == Choice(configuration=None, done=True)
    busy = choose_next(Pool(finished=["k0"], active={"k1"}), plan=configs(5), first=(),
                       limit=2, fresh="new:f")
    assert busy == Choice(configuration=None, done=False)


def test_without_a_plan_the_oldest_requeued_lease_comes_first() -> None:
    released = [lease(1, "k1", outcome=LeaseOutcome.RESULT, state=LeaseState.RELEASED),
                lease(2, "new:x"), lease(3, "k0"), lease(4, "k4"), lease(5, "k5")]
    choice = sampled(Pool(finished=[], active={"k0"}, released=released))
    assert choice.configuration == ("k4", {"x": 4}) and choice.requeued == released[3]


def test_rows_without_a_lease_are_reported_up_to_the_choice_and_passed_rows_skipped() -> None:
    released = [Unreadable(1, "not JSON"), lease(2, "k2"), Unreadable(3, "garbled"),
                lease(4, "k4")]
    first = sampled(Pool(finished=[], active=set(), released=released))
    assert first.unreadable == (Unreadable(1, "not JSON"),) and first.requeued == released[1]
    again = sampled(Pool(finished=[], active=set(), released=released), passed={1, 2})
    assert again.unreadable == (Unreadable(3, "garbled"),) and again.requeued == released[3]


def test_then_a_first_configuration_never_leased_then_a_new_one() -> None:
    baseline = [("b", {"x": -1})]
    assert sampled(Pool(finished=[], active=set()), first=baseline).configuration == \
        ("b", {"x": -1})
    leased = Pool(finished=[], active=set(), ever={"b"})
    assert sampled(leased, first=baseline) == Choice(configuration=("new:f", {}))


def test_a_full_budget_claims_nothing_and_is_done_only_with_every_result() -> None:
    assert sampled(Pool(finished=["a", "b"], active={"c"}), limit=3) == Choice(done=False)
    assert sampled(Pool(finished=["a", "b", "a"], active=set()), limit=3) == Choice(done=True)
