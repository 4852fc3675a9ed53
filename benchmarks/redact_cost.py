"""What redaction costs a snapshot (issue 12): every process's command line is redacted.

Builds a fixed 1,000-process table from typical command lines (engine servers with an
``--api-key``, renamed workers, containers, shells, ``curl`` with a bearer header, Jupyter with a
token) and times, median and best of ``--runs``:

- ``redact_argv`` over the 1,000 command lines;
- building the snapshot's 1,000 ``ProcessInfo`` entries (which redact their ``cmdline``), and
  the same entries without a command line (the cost of everything else).

Then the worst case: 256 KiB of each adversarial text through ``redact_text`` (every pattern
starts only at a word's beginning, so this is linear).

    python benchmarks/redact_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from cleanslate.probe.snapshot import ProcessInfo
from cleanslate.redact import redact_argv, redact_text

TEMPLATES: list[list[str]] = [
    ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
     "meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size", "8",
     "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.92", "--api-key",
     "sk-live-0123456789abcdef", "--port", "8000", "--max-model-len", "32768",
     "--enable-prefix-caching", "--disable-log-requests"],
    ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-72B-Instruct", "--tp",
     "4", "--mem-fraction-static", "0.88", "--port", "30000", "--host", "0.0.0.0",
     "--chunked-prefill-size", "4096", "--enable-torch-compile"],
    ["VLLM::Worker_TP3"], ["sglang::scheduler_TP1"], ["/sbin/init"],
    ["/lib/systemd/systemd-journald"], ["sshd: alice@pts/3"], ["-bash"],
    ["tmux", "new", "-s", "bench"], ["/usr/bin/containerd"],
    ["/usr/bin/dockerd", "-H", "fd://", "--containerd=/run/containerd/containerd.sock"],
    ["/opt/conda/bin/python", "/opt/conda/bin/jupyter-lab", "--ip=0.0.0.0",
     "--NotebookApp.token=abcdef0123", "--no-browser"],
    ["curl", "-sS", "-H", "Authorization: Bearer eyJhbGciOi.payload.sig",
     "http://127.0.0.1:8000/v1/models"],
    ["python", "train.py", "--config", "configs/llama.yaml", "--output_dir", "/data/ckpt",
     "--wandb_project", "x"],
    ["/usr/lib/postgresql/15/bin/postgres", "-D", "/var/lib/postgresql/15/main", "-c",
     "config_file=/etc/postgresql/15/main/postgresql.conf"],
    ["nvidia-persistenced", "--user", "nvidia-persistenced"], ["kworker/u64:2"],
    ["/usr/bin/python3", "-u", "-c",
     "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
     "--multiprocessing-fork"],
    ["trtllm-serve", "/models/llama-3.1-8b", "--backend", "pytorch", "--port", "8001",
     "--max_batch_size", "256", "--kv_cache_free_gpu_memory_fraction", "0.9"],
    ["llama-server", "-m", "/models/q4.gguf", "--port", "8080", "--api-key", "local-key-123",
     "-ngl", "99", "-c", "8192"],
]

ADVERSARIAL = {
    "one long word": "a" * (1 << 18),
    "dotted word": "a." * (1 << 17),
    "unclosed lists": "key=[" * (1 << 16),
    "many secret words": "key " * (1 << 16),
    "many assignments": "token=a " * (1 << 15),
    # issue 23's spellings: program flags, signed query strings, names holding "pat"
    "mysql -p": "mysql -px " * ((1 << 18) // 10),
    "query parameters": "?sig=a&" * ((1 << 18) // 7),
    "path assignments": "path=" * ((1 << 18) // 5),
}


def _time(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median, best) wall time of ``fn`` in milliseconds."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(1)
    table = [rng.choice(TEMPLATES) for _ in range(1000)]
    chars = sum(len(" ".join(argv)) for argv in table)
    print(f"1,000 command lines, {chars:,} characters; median / best of {args.runs} runs")

    def entries(with_cmdline: bool) -> None:
        for argv in table:
            ProcessInfo(pid=2, ppid=1, pgid=2, sid=2, state="S", comm="x", create_time=1.0,
                        cmdline=argv if with_cmdline else ())

    for label, fn in (("redact_argv x 1,000", lambda: [redact_argv(a) for a in table]),
                      ("ProcessInfo x 1,000 (redacted cmdline)", lambda: entries(True)),
                      ("ProcessInfo x 1,000 (no cmdline)", lambda: entries(False))):
        median, best = _time(fn, args.runs)
        print(f"  {label:40s} {median:7.1f} ms / {best:7.1f} ms")
    print("256 KiB of adversarial text through redact_text:")
    for label, text in ADVERSARIAL.items():
        median, best = _time(lambda t=text: redact_text(t), 3)
        print(f"  {label:40s} {median:7.1f} ms / {best:7.1f} ms")


if __name__ == "__main__":
    main()
