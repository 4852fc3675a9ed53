"""Conversations against the in-process fake server: the completions prompt holds the whole
history, an open loop starts conversations at its rate, a failed turn ends its conversation,
and conversations are refused where a level cannot hold them."""

from __future__ import annotations

import asyncio

import pytest

from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    ConversationWorkload,
    OpenLoop,
    generate,
    parse_workload,
    run_level,
)
from cleanslate.bench._conversation import conversations, history_text
from tests.bench.conftest import fake_server


def test_prompts_are_conversations_of_turns() -> None:
    spec = ConversationWorkload(turns=3, input_len=10, output_len=4)
    prompts = generate(spec, 7, seed=0)
    assert len(prompts) == 9  # whole conversations
    assert [(p.conversation, p.turn) for p in prompts[:4]] == [(0, 1), (0, 2), (0, 3), (1, 1)]
    assert conversations(prompts) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    text = history_text([("user", "hi"), ("assistant", "hello"), ("user", "more")])
    assert text == "User: hi\n\nAssistant: hello\n\nUser: more\n\nAssistant:"


def test_the_completions_prompt_grows_with_the_history() -> None:
    spec = ConversationWorkload(turns=3, input_len=20, output_len=5)

    async def go() -> object:
        async with fake_server() as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=spec, num_prompts=12,
                                 loads=(ClosedLoop(concurrency=2),))
            return await run_level(config, ClosedLoop(concurrency=2))

    level = asyncio.run(go())
    turns = level.turns  # type: ignore[attr-defined]
    inputs = [t.mean_input_tokens for t in turns]
    # the fake server counts words: 20 new ones, the 5-token answer and two labels per turn
    assert inputs[0] == pytest.approx(20 + 2, abs=1)
    assert inputs[1] - inputs[0] == pytest.approx(20 + 5 + 2, abs=2)
    assert inputs[2] - inputs[1] == pytest.approx(20 + 5 + 2, abs=2)
    assert [t.requests for t in turns] == [4, 4, 4]


def test_an_open_loop_starts_conversations_at_its_rate() -> None:
    spec = ConversationWorkload(turns=2, input_len=8, output_len=3, think_time_s=0.05)

    async def go() -> object:
        async with fake_server() as (url, _stats):
            load = OpenLoop(rate=20.0, arrival="constant")
            config = BenchConfig(url=url, model="m", endpoint="chat", workload=spec,
                                 num_prompts=10, loads=(load,))
            return await run_level(config, load)

    level = asyncio.run(go())
    assert level.completed == 10  # type: ignore[attr-defined]
    lag = level.schedule_lag_ms  # type: ignore[attr-defined]
    assert lag is not None and lag.count == 5  # the first turn of each conversation
    assert level.duration >= 0.2 + 0.05  # type: ignore[attr-defined]


def test_a_failed_turn_ends_its_conversation() -> None:
    spec = ConversationWorkload(turns=4, input_len=8, output_len=3)

    async def go() -> object:
        async with fake_server("http-500=3") as (url, _stats):
            config = BenchConfig(url=url, model="m", endpoint="chat", workload=spec,
                                 num_prompts=8, loads=(ClosedLoop(concurrency=1),))
            return await run_level(config, ClosedLoop(concurrency=1))

    level = asyncio.run(go())
    turns = {t.turn: t for t in level.turns}  # type: ignore[attr-defined]
    # requests 3 and 6 fail: turn 3 of each conversation; turn 4 is never sent
    assert sorted(turns) == [1, 2, 3]
    assert turns[1].requests == turns[2].requests == 2 and turns[3].failed == 2
    assert level.failed == 2 and level.completed == 4  # type: ignore[attr-defined]


def test_users_are_the_concurrency() -> None:
    spec = parse_workload("conversation:turns=2,users=3")
    with pytest.raises(ValueError, match="users=3 is the concurrency"):
        BenchConfig(url="http://127.0.0.1:1", model="m", workload=spec,
                    loads=(ClosedLoop(concurrency=4),))
    BenchConfig(url="http://127.0.0.1:1", model="m", workload=spec,
                loads=(ClosedLoop(concurrency=3),))


def test_a_conversation_is_not_ramped() -> None:
    from cleanslate.bench import parse_ramp

    with pytest.raises(ValueError, match="not on a ramp"):
        BenchConfig(url="http://127.0.0.1:1", model="m", workload=ConversationWorkload(),
                    loads=(parse_ramp("linear:start=1,end=4,duration=2"),))


def test_every_conversation_of_a_measurement_starts_with_one_system_message() -> None:
    spec = parse_workload("conversation:turns=2,input_len=10,output_len=4,system_len=50")
    assert isinstance(spec, ConversationWorkload) and spec.system_len == 50
    prompts = generate(spec, 6, seed=0)
    systems = {p.system for p in prompts}
    assert len(systems) == 1 and None not in systems
    (system,) = systems
    assert system is not None and len(system.split()) == 50
    other = {p.system for p in generate(spec, 6, seed=1)}
    assert other != systems  # another measurement, another system message: a cold cache
    assert all(p.system is None for p in generate(
        ConversationWorkload(turns=2, input_len=10, output_len=4), 4, seed=0))
    assert history_text([("system", "be brief"), ("user", "hi")]) == \
        "System: be brief\n\nUser: hi\n\nAssistant:"


def test_the_system_message_leads_every_turns_prompt() -> None:
    spec = ConversationWorkload(turns=2, input_len=20, output_len=5, system_len=30)

    async def go() -> object:
        async with fake_server() as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=spec, num_prompts=8,
                                 loads=(ClosedLoop(concurrency=2),))
            return await run_level(config, ClosedLoop(concurrency=2))

    level = asyncio.run(go())
    turns = level.turns  # type: ignore[attr-defined]
    # the fake server counts words: the 30-word system message and its label come first
    assert turns[0].mean_input_tokens == pytest.approx(30 + 1 + 20 + 2, abs=1)
    assert turns[1].mean_input_tokens - turns[0].mean_input_tokens == pytest.approx(
        20 + 5 + 2, abs=2)
