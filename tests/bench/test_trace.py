"""Trace files as workloads: formats, column mappings, selection, synthesized prompts and the
cache share their hashes predict (``cleanslate.bench._trace``), without a server."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from cleanslate.bench import BenchConfig, ClosedLoop, ReplayLoad, TraceWorkload, generate
from cleanslate.bench._trace import (
    COLUMNS,
    Prompt,
    expected_cached,
    read_trace,
    select,
    trace_info,
)
from cleanslate.errors import InputError

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
MOONCAKE = TraceWorkload(path=str(TRACES / "mooncake-500.jsonl"), format="mooncake")
AZURE = TraceWorkload(path=str(TRACES / "azure-500.csv"), format="azure")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_committed_traces_read_with_their_columns_recorded() -> None:
    moon = trace_info(MOONCAKE)
    assert (moon.rows_read, moon.rows_used, moon.hashed_rows) == (500, 500, 500)
    assert moon.columns == COLUMNS["mooncake"]
    assert moon.columns["output_length"].startswith("output tokens asked for")
    assert 4.5 < (moon.rate or 0) < 6.0  # generated at 5 req/s
    assert moon.expected_cached_share is not None and 0.5 < moon.expected_cached_share < 0.8
    az = trace_info(AZURE)
    assert az.columns == COLUMNS["azure"] and set(az.columns) == {
        "TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    # Five rows ask for 0 output tokens: sent asking for 1, and counted, never dropped.
    assert (az.rows_used, az.zero_output_rows, az.expected_cached_share) == (500, 5, None)
    rows = read_trace(AZURE).rows
    assert min(r.output_len for r in rows) == 1 and rows[0].t_s == 0.0
    assert all(a.t_s <= b.t_s for a, b in itertools.pairwise(rows))
    # The result JSON carries the mapping: the same column is never read two ways.
    dumped = json.loads(moon.model_dump_json())
    assert dumped["columns"]["hash_ids"].startswith("prefix blocks")


def test_azure_times_with_seven_digits_are_offsets_from_the_first_row(tmp_path: Path) -> None:
    spec = TraceWorkload(path=write(tmp_path, "a.csv", (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.1805901,396,109\n")), format="azure")
    rows = read_trace(spec).rows
    assert [round(r.t_s, 6) for r in rows] == [0.0, 3.5]
    assert [(r.input_len, r.output_len) for r in rows] == [(374, 44), (396, 109)]


def test_window_sample_and_speedup() -> None:
    rows = read_trace(MOONCAKE).rows
    window = select(MOONCAKE.model_copy(update={"start": 20.0, "duration": 40.0}),
                    read_trace(MOONCAKE))
    assert window[0].t_s >= 0 and window[-1].t_s < 40.0
    assert len(window) == sum(1 for r in rows if 20.0 <= r.t_s < 60.0)
    fast = select(MOONCAKE.model_copy(update={"speedup": 4.0}), read_trace(MOONCAKE))
    assert fast[-1].t_s == pytest.approx(rows[-1].t_s / 4)
    # A rate-preserving sample: a quarter of the rows over a quarter of the time.
    quarter = select(MOONCAKE.model_copy(update={"sample": 0.25}), read_trace(MOONCAKE))
    assert 90 < len(quarter) < 160
    full_rate = (len(rows) - 1) / rows[-1].t_s
    sampled_rate = (len(quarter) - 1) / (quarter[-1].t_s - quarter[0].t_s)
    assert sampled_rate == pytest.approx(full_rate, rel=0.25)
    again = select(MOONCAKE.model_copy(update={"sample": 0.25}), read_trace(MOONCAKE))
    assert again == quarter  # the same rows in every level and run


def test_prompts_share_the_tokens_of_shared_hashes() -> None:
    prompts = generate(MOONCAKE, 500, seed=3)
    assert len(prompts) == 500 and all(p.at_s is not None for p in prompts)
    rows = read_trace(MOONCAKE).rows
    assert [p.input_tokens for p in prompts] == [r.input_len for r in rows]
    assert [p.output_len for p in prompts] == [r.output_len for r in rows]
    by_first: dict[int, list[Prompt]] = {}
    for p in prompts:
        by_first.setdefault(p.blocks[0][0], []).append(p)
    shared = next(group for group in by_first.values() if len(group) > 2)
    first_block = {" ".join(p.text.split()[:512]) for p in shared if p.blocks[0][1] == 512}
    assert len(first_block) == 1  # the same hash, the same 512 tokens
    other = generate(MOONCAKE, 500, seed=4)
    assert other[0].text != prompts[0].text  # another measurement, other tokens
    assert [p.blocks for p in other] == [p.blocks for p in prompts]  # the same reuse


def test_expected_cached_follows_the_leading_blocks() -> None:
    def p(blocks: list[tuple[int, int]], extra: int = 0) -> Prompt:
        return Prompt("x", sum(n for _h, n in blocks) + extra, "approx", 1,
                      blocks=tuple(blocks))

    assert expected_cached([p([(1, 512), (2, 512)]), p([(1, 512), (3, 512)])]) == 512
    # a block seen only after a miss does not count (a cache matches a prefix)
    assert expected_cached([p([(1, 512)]), p([(2, 512), (1, 512)])]) == 0
    # a shorter copy of a seen block is cached; a longer one is not
    assert expected_cached([p([(1, 512)], 10), p([(1, 100)], 10)]) == 100
    assert expected_cached([p([(1, 100)]), p([(1, 512)])]) == 0
    # one token is always computed
    assert expected_cached([p([(1, 512)]), p([(1, 512)])]) == 511


@pytest.mark.parametrize(("fmt", "text", "where", "words"), [
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 2}\nnot json\n',
     ":2", "not JSON"),
    ("mooncake", '{"input_length": 5, "output_length": 2}\n', ":1", "no timestamp"),
    ("mooncake", '{"timestamp": 0, "input_length": -3, "output_length": 2}\n', ":1",
     "at least 1"),
    ("jsonl", '{"timestamp": 0, "input_length": 5}\n', ":1", "no output_length"),
    ("jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "a"}\n',
     ":1", "hash_ids"),
    ("jsonl", '{"timestamp": "yesterday", "input_length": 5, "output_length": 1}\n', ":1",
     "not a time"),
    ("azure", "TIME,ContextTokens\n", ":1", "no column TIMESTAMP, GeneratedTokens"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,3\n", ":2",
     "not a number"),
])
def test_bad_rows_name_the_file_and_line(tmp_path: Path, fmt: str, text: str, where: str,
                                         words: str) -> None:
    spec = TraceWorkload(path=write(tmp_path, f"t.{fmt}", text), format=fmt)  # type: ignore[arg-type]
    with pytest.raises(InputError) as err:
        read_trace(spec)
    assert err.value.where is not None and err.value.where.endswith(where)
    assert words in err.value.message


def test_a_trace_of_texts_and_iso_times(tmp_path: Path) -> None:
    lines = [{"timestamp": "2026-12-01T10:00:00Z", "text": "hello there", "output_length": 3},
             {"timestamp": "2026-12-01T10:00:01.5Z", "input_length": 40, "output_length": 2}]
    spec = TraceWorkload(path=write(tmp_path, "t.jsonl",
                                    "".join(json.dumps(x) + "\n" for x in lines)))
    prompts = generate(spec, 2, seed=0)
    assert prompts[0].text == "hello there" and [p.at_s for p in prompts] == [0.0, 1.5]
    assert prompts[1].input_tokens == 40


def test_a_replay_needs_a_trace_and_a_closed_loop_may_cycle_it() -> None:
    with pytest.raises(ValueError, match="replay level sends a trace"):
        BenchConfig(url="http://127.0.0.1:1", model="m", loads=(ReplayLoad(),))
    config = BenchConfig(url="http://127.0.0.1:1", model="m", workload=AZURE,
                         loads=(ClosedLoop(concurrency=128),))
    prompts = generate(config.workload, config.prompts_for(config.loads[0]), seed=1)
    assert len(prompts) == 640  # more than the trace holds: a second pass, unscheduled
    assert prompts[0].at_s == 0.0 and prompts[600].at_s is None


def test_a_repeated_replay_sums_its_predictions() -> None:
    import asyncio

    from cleanslate.bench import run_repeats
    from tests.bench.conftest import fake_server

    spec = MOONCAKE.model_copy(update={"duration": 4.0, "speedup": 20.0})
    rows = len(select(spec, read_trace(spec)))

    async def go() -> object:
        async with fake_server() as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=spec, loads=(ReplayLoad(),),
                                 repeats=2)
            return await run_repeats(config, ReplayLoad())

    level = asyncio.run(go())
    repeats = level.repeats  # type: ignore[attr-defined]
    assert [r.num_prompts for r in repeats] == [rows, rows]
    each = [r.expected_cached_prompt_tokens for r in repeats]
    assert each[0] == each[1] and each[0] > 0  # the same reuse, new tokens each repeat
    assert level.expected_cached_prompt_tokens == sum(each)  # type: ignore[attr-defined]
    assert level.schedule_lag_ms is not None  # type: ignore[attr-defined]


def test_the_prompt_bound_is_the_traces_longest_prompt() -> None:
    longest = max(r.input_len for r in read_trace(MOONCAKE).rows)
    assert MOONCAKE.max_input_tokens() == longest
    # c=4096 on a trace of about 7,000-token prompts fits the per-level token cap
    BenchConfig(url="http://127.0.0.1:1", model="m", workload=MOONCAKE,
                loads=(ClosedLoop(concurrency=4096),))
    missing = TraceWorkload(path="/nonexistent/trace.jsonl")
    assert missing.max_input_tokens() == missing.max_input_len


def test_replay_levels_at_rising_time_scales() -> None:
    import asyncio

    from cleanslate.bench import run_level
    from tests.bench.conftest import fake_server

    spec = MOONCAKE.model_copy(update={"duration": 4.0, "speedup": 4.0})  # 1 s at 1x
    rows = len(select(spec, read_trace(spec)))
    loads = (ReplayLoad(), ReplayLoad(speedup=4))
    assert [load.label for load in loads] == ["replay", "replay=4x"]
    assert ReplayLoad(speedup=2.5, max_concurrency=8).label == "replay=2.5x,cap=8"

    async def go() -> list[object]:
        async with fake_server() as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=spec, loads=loads)
            return [await run_level(config, load) for load in loads]

    at_1x, at_4x = asyncio.run(go())
    for level in (at_1x, at_4x):
        assert level.completed == rows and level.failed == 0  # type: ignore[attr-defined]
    # the same requests, sent four times as fast: the level lasts a quarter as long
    ratio = at_4x.achieved_request_rate / at_1x.achieved_request_rate  # type: ignore[attr-defined]
    assert ratio == pytest.approx(4.0, rel=0.25), ratio
    assert at_1x.duration == pytest.approx(1.0, abs=0.25)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("extra", "words"), [
    (("--replay", "1,x"), "--replay: 'x' is not a time scale"),
    (("--replay", "0"), "--replay"),
    (("--replay", "1,2", "--concurrency", "4"), "--concurrency: --replay's levels"),
    (("--replay", "1", "--workload", "random"), "--replay: --replay replays a trace's"),
])
def test_bad_replay_options_exit_2(extra: tuple[str, ...], words: str,
                                   capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cli.inproc import run_main

    workload = () if "--workload" in extra else (
        "--workload", f"trace:path={MOONCAKE.path},format=mooncake")
    res = run_main(capsys, monkeypatch, "bench", "--url", "http://127.0.0.1:9", "--model", "m",
                   *workload, *extra, "--no-live")
    assert res.code == 2, (res.out, res.err)
    assert words in res.err, res.err
    assert "Traceback" not in res.err
