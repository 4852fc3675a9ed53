"""The batch script of ``cleanslate slurm submit``: what it asks Slurm for, what each task runs,
bad options refused, no secret in it; and the script run for real by ``sbatch`` on a one-node
Slurm with four fake GPUs, with a stand-in for the worker that records what it was given."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from cleanslate.cluster.slurm import SlurmOptions, render_script, submit, write_script
from cleanslate.errors import InputError
from tests.slurm.cluster import SlurmCluster


def script(tmp_path: Path, **options: object) -> str:
    return render_script("glm5", SlurmOptions(**options),  # type: ignore[arg-type]
                         log_dir=tmp_path / "logs", port=30000,
                         command=["/opt/py/bin/python", "-m", "cleanslate"])


def test_the_script_asks_for_an_array_gpus_and_runs_one_worker_per_task(tmp_path: Path) -> None:
    text = script(tmp_path, workers=3, gpus_per_worker=2, partition="h200", time="4:00:00",
                  max_parallel=2, extra=("--account=serving", "--qos", "high"))
    directives = [line[len("#SBATCH "):] for line in text.splitlines()
                  if line.startswith("#SBATCH ")]
    assert directives == ["--job-name=cleanslate-glm5", "--array=0-2%2",
                          f"--output={tmp_path}/logs/worker-%A_%a.log", "--export=ALL",
                          "--gres=gpu:2", "--partition=h200", "--time=4:00:00",
                          "--account=serving", "--qos", "high"]
    assert ("exec /opt/py/bin/python -m cleanslate worker --study glm5 --host local "
            '--gpu-backend auto --gpus "$gpus" --port "$port"') in text
    assert "port=$(( 30000 + SLURM_ARRAY_TASK_ID ))" in text
    assert "gpus=${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}}" in text


def test_without_gpus_the_worker_gets_no_gpu_option(tmp_path: Path) -> None:
    text = script(tmp_path, workers=1)
    assert "--gres" not in text and '--gpus "$gpus"' not in text


def test_the_store_url_never_enters_the_script(tmp_path: Path) -> None:
    text = script(tmp_path, workers=2)
    assert "CLEANSLATE_STORE:?" in text and "postgresql" not in text
    path = write_script(text, tmp_path / "slurm", "workers.sbatch")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize(("options", "needle"), [
    ({"workers": 0}, "greater than or equal to 1"),
    ({"workers": 2, "partition": "a b"}, "not a Slurm partition"),
    ({"workers": 2, "time": "tomorrow"}, "not a Slurm time"),
    ({"workers": 2, "extra": ("--array=0-99",)}, "set by the script itself"),
    ({"workers": 2, "extra": ("-o", "x")}, "set by the script itself"),
    ({"workers": 2, "extra": ("--comment=a\n#SBATCH --gres=gpu:8",)}, "line break"),
])
def test_bad_options_are_refused(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        SlurmOptions(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [
    "x\necho injected", "x\r#SBATCH --gres=gpu:8", "../../outside", "a b", "a'b", "-x", "",
    "n" * 101])
def test_a_name_that_is_not_a_study_name_makes_no_script(tmp_path: Path, name: str) -> None:
    # A newline in --job-name ended the directive: the next line was a command of every task.
    with pytest.raises(InputError, match="study's name"):
        render_script(name, SlurmOptions(workers=1), log_dir=tmp_path, port=30000)


@pytest.mark.parametrize("folder", ["logs\necho injected", "my logs", 'a"b', "a\\b"])
def test_an_output_folder_sbatch_would_misread_is_refused(tmp_path: Path, folder: str) -> None:
    with pytest.raises(InputError, match="cannot be written as an #SBATCH line") as info:
        render_script("s", SlurmOptions(workers=1), log_dir=tmp_path / folder, port=30000)
    assert info.value.where == "the artifacts folder"


def test_every_line_of_the_script_is_one_we_wrote(tmp_path: Path) -> None:
    text = render_script("glm5-nvfp4_v1.2", SlurmOptions(workers=2, gpus_per_worker=1),
                         log_dir=tmp_path / "100%", port=30000,
                         command=["/opt/my py/bin/python", "-m", "cleanslate"])
    assert f"#SBATCH --output={tmp_path}/100%%/worker-%A_%a.log" in text.splitlines()
    assert "#SBATCH --job-name=cleanslate-glm5-nvfp4_v1.2" in text.splitlines()
    assert ("exec '/opt/my py/bin/python' -m cleanslate worker --study glm5-nvfp4_v1.2 "
            "--host local --gpu-backend auto") in text
    assert text.count("\n") == len(script(tmp_path, workers=2, gpus_per_worker=1).splitlines())


def test_an_sbatch_argument_with_a_blank_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="#SBATCH line"):
        script(tmp_path, workers=1, extra=("--comment=a b",))


def test_ports_past_65535_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="go past 65535"):
        render_script("s", SlurmOptions(workers=10), log_dir=tmp_path, port=65530)


def test_submit_without_sbatch_is_an_input_error(tmp_path: Path) -> None:
    path = write_script(script(tmp_path, workers=1), tmp_path, "w.sbatch")
    with pytest.raises(InputError, match="sbatch is not on PATH"):
        submit(path, env={"PATH": str(tmp_path)})


STAND_IN = """\
import json, os, sys
argv = sys.argv[1:]
with open(os.path.join({out!r}, "task-" + os.environ["SLURM_ARRAY_TASK_ID"] + ".json"), "w") as f:
    json.dump({{"argv": argv, "store": os.environ.get("CLEANSLATE_STORE"),
               "job_gpus": os.environ.get("SLURM_JOB_GPUS")}}, f)
"""


@pytest.mark.slow
def test_sbatch_runs_one_worker_per_task_on_its_own_gpus_and_port(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN.format(out=str(out)))
    text = render_script("demo", SlurmOptions(workers=3, gpus_per_worker=1), log_dir=tmp_path,
                         port=31000, command=[sys.executable, str(stand_in)])
    path = write_script(text, tmp_path / "slurm", "workers.sbatch")
    env = {**slurm.env, "CLEANSLATE_STORE": "sqlite:///tmp/demo.db"}
    t0 = time.monotonic()
    job = submit(path, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("task-*.json"))) < 3:
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    tasks = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("task-*.json"))}
    assert len(tasks) == 3, (job, list(tmp_path.glob("worker-*.log")), slurm.log("slurmd")[-2000:])
    ports = sorted(int(t["argv"][t["argv"].index("--port") + 1]) for t in tasks.values())
    assert ports == [31000, 31001, 31002]
    for task in tasks.values():
        argv = task["argv"]
        assert argv[:3] == ["worker", "--study", "demo"]
        gpus = argv[argv.index("--gpus") + 1]
        assert gpus == task["job_gpus"] and gpus.isdigit()  # one fake GPU per task
        assert task["store"] == "sqlite:///tmp/demo.db"  # handed over in the environment
    assert slurm.wait_idle(30)
    print(f"sbatch of 3 tasks to their 3 records: {elapsed:.1f} s")
