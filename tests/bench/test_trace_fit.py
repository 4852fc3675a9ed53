"""A trace fitted to the server's context before it is sent (``cleanslate.bench._context`` and
the fit of ``cleanslate.bench._trace``): rows over the context dropped or clipped and counted,
the context found in its order (the option, the caller, the server, the tokenizer), and no
prompt sent longer than ``max_input_len`` or the context less its output, as measured after
synthesis. Against the fake server with a 2,048-token context (HTTP 400 above it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench import BenchConfig, BenchResult, Harness, ReplayLoad, TraceWorkload
from cleanslate.bench._context import KnownContext, find_context, fit_trace
from cleanslate.bench._tokens import HFTokenizer
from cleanslate.bench._trace import TraceFit, fit_rows, read_trace, select, synthesize
from cleanslate.bench._workloads import generate
from cleanslate.errors import InputError
from cleanslate.testing.fake_openai import FakeOptions, FakeServer, start_fake_server

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
ENGINE_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "engine-config"
#: The committed Mooncake trace's first 10 s at 40x: 56 rows, 39 of them above 2,048 tokens
#: (prompt plus output), sent in about a quarter of a second.
MOONCAKE = TraceWorkload(path=str(TRACES / "mooncake-500.jsonl"), format="mooncake",
                         duration=10.0, speedup=40.0)
CONTEXT = 2048


class TinyBPE:
    """The tiny model's byte-level BPE (``cleanslate.testing.tiny_model``) through the
    ``tokenizers`` package alone, as :class:`HFTokenizer` reads one without transformers (0.1 s
    to train where transformers takes seconds to import), with its ``model_max_length``."""

    def __init__(self, model_max_length: int = CONTEXT) -> None:
        pytest.importorskip("tokenizers")
        from cleanslate.testing.tiny_model import SPECIAL_TOKENS, tiny_bpe

        self.bpe = tiny_bpe()
        special = {self.bpe.token_to_id(t) for t in SPECIAL_TOKENS}
        self.vocab_ids = [i for i in range(self.bpe.get_vocab_size()) if i not in special]
        self.model_max_length = model_max_length

    def encode(self, text: str) -> list[int]:
        return list(self.bpe.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.bpe.decode(ids))

    def count(self, text: str) -> int:
        return len(self.encode(text))


@pytest.fixture(scope="module")
def tokenizer() -> TinyBPE:
    return TinyBPE()


def over(rows: list[Any], context: int) -> int:
    return sum(r.input_len + r.output_len > context for r in rows)


def test_rows_over_the_context_are_dropped_clipped_or_sent_and_counted() -> None:
    rows = select(MOONCAKE, read_trace(MOONCAKE))
    assert (len(rows), over(rows, CONTEXT)) == (56, 39)
    fitted = {mode: fit_rows(MOONCAKE.model_copy(update={"fit": mode, "context": CONTEXT}),
                             rows, None) for mode in ("drop", "clip", "off")}
    drop, clip, off = fitted["drop"], fitted["clip"], fitted["off"]
    assert (len(drop.rows), drop.dropped, drop.clipped, drop.over) == (17, 39, 0, 39)
    assert over(drop.rows, CONTEXT) == 0
    # clipped: every row kept at its time, its output kept, its prompt cut to what is left
    assert (len(clip.rows), clip.dropped, clip.clipped) == (56, 0, 39)
    assert over(clip.rows, CONTEXT) == 0
    assert [r.t_s for r in clip.rows] == [r.t_s for r in rows]
    assert [r.output_len for r in clip.rows] == [r.output_len for r in rows]
    assert (len(off.rows), off.dropped, off.over, over(off.rows, CONTEXT)) == (56, 0, 39, 39)
    # unknown context: nothing fitted
    assert fit_rows(MOONCAKE, rows, None).rows == rows
    # an output alone above the context: cut to the context less one prompt token
    long_out = rows[0].__class__(0.0, 100, 5000)
    spec = MOONCAKE.model_copy(update={"fit": "clip", "context": CONTEXT})
    (row,) = fit_rows(spec, [long_out], None).rows
    assert (row.input_len, row.output_len) == (1, CONTEXT - 1)


def test_the_fit_is_said_in_the_users_words() -> None:
    said = TraceFit(mode="drop", context=CONTEXT, source="GET /v1/models max_model_len",
                    rows=47, dropped=31, over=31).line()
    assert said == ("dropped 31 of 47 rows: prompt + output above the server's 2,048-token "
                    "context (read from GET /v1/models max_model_len)")
    clipped = TraceFit(mode="clip", context=CONTEXT, source="context= of the trace workload",
                       rows=47, clipped=31, over=31).line()
    assert clipped.startswith("clipped 31 of 47 rows to the server's 2,048-token context")
    sent = TraceFit(mode="off", context=CONTEXT, source="x", rows=47, over=31).line()
    assert sent.startswith("fit=off: 31 of 47 rows above")
    unknown = TraceFit(mode="drop", context=None, source="nothing said", rows=47).line()
    assert "unknown" in unknown and "context=N" in unknown


def test_no_prompt_exceeds_max_input_len_as_the_tokenizer_counts_it(
        tokenizer: TinyBPE) -> None:
    # Random token ids decoded and encoded again are more tokens than the row asked for:
    # without the cut, a row of 1,891 tokens was sent as about 2,300 (issue 38: 2,310).
    spec = MOONCAKE.model_copy(update={"max_input_len": 1900})
    rows = select(spec, read_trace(spec))
    prompts = generate(spec, 10**6, seed=1, tokenizer=tokenizer)
    assert len(prompts) == len(rows) == 18
    counts = [tokenizer.count(p.text) for p in prompts]
    assert max(counts) <= 1900 and max(p.input_tokens for p in prompts) <= 1900
    assert [p.input_tokens for p in prompts] == counts
    # the same rows synthesized without the bound: some are sent longer than it
    loose = spec.model_copy(update={"max_input_len": 131_072})
    unbounded = [synthesize(r, i, 0, loose, 1, tokenizer) for i, r in enumerate(rows)]
    assert max(r.input_len for r in rows) <= 1900 < max(p.input_tokens for p in unbounded)
    # fitted to a context: prompt plus output within it, as measured
    fitted = MOONCAKE.model_copy(update={"context": CONTEXT, "fit": "clip", "duration": 3.0})
    prompts = generate(fitted, 10**6, seed=2, tokenizer=tokenizer)
    assert len(prompts) == 15
    for p in prompts:
        assert tokenizer.count(p.text) + p.output_len <= CONTEXT


@pytest.fixture
def fake_2048() -> Iterator[tuple[asyncio.AbstractEventLoop, FakeServer]]:
    """The fake server answering HTTP 400 above 2,048 tokens, in a loop of the test's own."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(start_fake_server(FakeOptions(max_model_len=CONTEXT)))
    try:
        yield loop, server
    finally:
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def bench(loop: asyncio.AbstractEventLoop, server: FakeServer, spec: TraceWorkload,
          **harness: Any) -> tuple[BenchResult, list[tuple[str, int]]]:
    """One replay of ``spec``; what was said, with the requests the server had had then."""
    said: list[tuple[str, int]] = []
    config = BenchConfig(url=server.url, model="fake", workload=spec, loads=(ReplayLoad(),),
                         observe={"enabled": harness.pop("observe", True), "gpu_source": "off"})
    from cleanslate.bench import run_benchmark

    result = loop.run_until_complete(run_benchmark(config, Harness(
        on_note=lambda text: said.append((text, server.stats.requests)), **harness)))
    return result, said


def test_a_trace_against_a_2048_token_server_sends_nothing_it_refuses(
        fake_2048: tuple[asyncio.AbstractEventLoop, FakeServer]) -> None:
    loop, server = fake_2048
    result, said = bench(loop, server, MOONCAKE)
    (level,) = result.levels
    assert (level.sent, level.completed, level.failed) == (17, 17, 0)
    assert server.stats.too_long == 0
    assert said == [("dropped 39 of 56 rows: prompt + output above the server's 2,048-token "
                     "context (read from GET /v1/models max_model_len)", 0)]  # before sending
    trace = result.trace
    assert trace is not None and trace.fit is not None and trace.rows_used == 17
    fit = json.loads(result.model_dump_json())["trace"]["fit"]
    assert fit == {"mode": "drop", "context": 2048, "source": "GET /v1/models max_model_len",
                   "rows": 56, "dropped": 39, "clipped": 0, "over": 39}


def test_fit_off_sends_every_row_and_the_server_refuses_those_above_its_context(
        fake_2048: tuple[asyncio.AbstractEventLoop, FakeServer]) -> None:
    loop, server = fake_2048
    result, said = bench(loop, server, MOONCAKE.model_copy(update={"fit": "off"}),
                         observe=False)
    (level,) = result.levels
    assert (level.sent, level.completed, level.failed, server.stats.too_long) == (56, 17, 39, 39)
    assert said[0][0].startswith("fit=off: 39 of 56 rows above the server's 2,048-token")


def test_clipped_rows_are_sent_and_all_served(
        fake_2048: tuple[asyncio.AbstractEventLoop, FakeServer]) -> None:
    loop, server = fake_2048
    # /v1/models read by itself (no configuration read with --no-observe)
    result, said = bench(loop, server, MOONCAKE.model_copy(update={"fit": "clip"}),
                         observe=False)
    (level,) = result.levels
    assert (level.sent, level.completed, level.failed, server.stats.too_long) == (56, 56, 0, 0)
    assert said[0][0].startswith("clipped 39 of 56 rows to the server's 2,048-token context "
                                 "(read from GET /v1/models max_model_len)")


def test_the_context_is_found_in_its_order(
        fake_2048: tuple[asyncio.AbstractEventLoop, FakeServer],
        tokenizer: TinyBPE) -> None:
    loop, server = fake_2048
    bare = loop.run_until_complete(start_fake_server(FakeOptions()))

    def found(spec: TraceWorkload, url: str, **kw: Any) -> KnownContext | None:
        return loop.run_until_complete(find_context(
            spec, known=kw.get("known"), server_config=None, session=None, base_url=url,
            tokenizer=kw.get("tokenizer")))

    try:
        record = KnownContext(4096, "run 3f2a's record")
        assert found(MOONCAKE.model_copy(update={"context": 1024}), server.url,
                     known=record) == KnownContext(1024, "context= of the trace workload")
        assert found(MOONCAKE, server.url, known=record) == record
        assert found(MOONCAKE, server.url, tokenizer=tokenizer) == KnownContext(
            2048, "GET /v1/models max_model_len")
        # a server that does not say it: the tokenizer's model_max_length, else unknown
        assert found(MOONCAKE, bare.url, tokenizer=tokenizer) == KnownContext(
            2048, "the tokenizer's model_max_length")
        assert found(MOONCAKE, bare.url) is None
        spec, fit = loop.run_until_complete(fit_trace(
            MOONCAKE, known=None, server_config=None, session=None, base_url=bare.url,
            tokenizer=None))
        assert spec.context is None and fit.context is None and fit.dropped == 0
        assert "unknown" in fit.line() and "no --tokenizer" in fit.line()
        # a context no row fits: refused before any request
        with pytest.raises(InputError, match="every one of the 56 selected rows"):
            loop.run_until_complete(fit_trace(
                MOONCAKE, known=KnownContext(64, "x"), server_config=None, session=None,
                base_url=bare.url, tokenizer=None))
        assert bare.stats.requests == 0
    finally:
        bare.close()
        loop.run_until_complete(bare.wait_closed())


def test_llamacpp_says_its_slot_context_in_props() -> None:
    from aiohttp import web

    props = json.loads((ENGINE_CONFIG / "llamacpp-11434-props-np2-c4096.json").read_text())
    models = {"object": "list", "data": [{"id": "m", "meta": {"n_ctx_train": 131072}}]}

    async def go() -> KnownContext | None:
        app = web.Application()
        async def answer_props(_request: web.Request) -> web.Response:
            return web.json_response(props)

        async def answer_models(_request: web.Request) -> web.Response:
            return web.json_response(models)

        app.router.add_get("/props", answer_props)
        app.router.add_get("/v1/models", answer_models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            from cleanslate.bench._context import read_context

            return await read_context(None, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    n_ctx = props["default_generation_settings"]["n_ctx"]
    assert asyncio.run(go()) == KnownContext(n_ctx, "GET /props default_generation_settings.n_ctx")


def test_the_command_line_says_the_fit_and_records_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cleanslate.testing.fake_openai import fake_openai_thread
    from tests.cli.inproc import run_main

    out = tmp_path / "b.json"
    workload = f"trace:path={MOONCAKE.path},format=mooncake,duration=10,speedup=40"
    with fake_openai_thread(max_model_len=CONTEXT) as server:
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "fake",
                       "--workload", workload, "--no-live", "--no-observe", "--no-store",
                       "--json", str(out))
        assert server.stats.too_long == 0
    assert res.code == 0, res.err
    assert ("trace: dropped 39 of 56 rows: prompt + output above the server's 2,048-token "
            "context (read from GET /v1/models max_model_len)") in res.err
    assert json.loads(out.read_text())["trace"]["fit"]["dropped"] == 39
    bad = run_main(capsys, monkeypatch, "bench", "--url", "http://127.0.0.1:9", "--model", "m",
                   "--workload", workload + ",fit=chop", "--no-live", "--no-store")
    assert bad.code == 2 and "fit" in bad.err and "Traceback" not in bad.err


@pytest.mark.slow
def test_a_tokenizer_folder_says_its_model_max_length(tmp_path: Path) -> None:
    # about 4 s: transformers imported and the folder loaded as --tokenizer loads it
    pytest.importorskip("transformers")
    from cleanslate.bench._context import from_tokenizer
    from cleanslate.testing.tiny_model import build_tiny_tokenizer

    tok = HFTokenizer(str(build_tiny_tokenizer(tmp_path / "tiny", model_max_length=1536)))
    assert tok.model_max_length == 1536
    assert from_tokenizer(tok) == KnownContext(1536, "the tokenizer's model_max_length")
    unbounded = HFTokenizer(str(build_tiny_tokenizer(tmp_path / "unbounded",
                                                     model_max_length=10**30)))
    assert from_tokenizer(unbounded) is None  # transformers' "no bound", not a context


def test_a_rows_own_text_is_cut_to_the_bound_as_the_client_counts_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "text": "word " * 3000, "output_length": 48},  # 3,750 tokens
            {"timestamp": 10, "text": "short prompt", "output_length": 8}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = TraceWorkload(path=str(path), format="jsonl", context=1024, fit="clip")
    long, short = generate(spec, 2, seed=0)
    assert long.input_tokens + long.output_len <= 1024 and long.input_tokens == 976
    assert long.text == ("word " * 3000)[: 4 * 976]
    assert (short.text, short.output_len) == ("short prompt", 8)
    dropped = generate(spec.model_copy(update={"fit": "drop"}), 10, seed=0)
    assert [p.text for p in dropped] == ["short prompt"] * 10  # a closed loop cycles it
