"""The cuda backend end to end against the test shim (native/cudashim): the backend's own code calls
cuCheckpointProcess* through ctypes, the shim forwards each call to the npusim runtime's control
listener inside the target, and the target is a Python npusim workload with no npusnap agent.
Real daemon, real CRIU, real processes."""

from __future__ import annotations

import json
import signal
import subprocess

import yaml

from npusnap_cli.platform import cuda
from tests.helpers import StepGate, Workload, npusnap, pid_alive, requires_criu

from .support import SHIM, shim_env, sim_uuid, strip_ready, workload_argv

STEPS, AT, SLEEP_MS = 80, 4, 60  # ~5 s left after step AT: the CLI must find it running
GPUS = [sim_uuid(0), sim_uuid(1)]  # no NVML here: every GPU the driver shows is recorded

def _driver() -> cuda.Driver:
    d = cuda.Driver.load(str(SHIM))
    d.init()
    return d


def _reference(env: dict[str, str]) -> list[str]:
    r = subprocess.run(workload_argv(STEPS, 0), env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-500:]
    return strip_ready(r.stdout.splitlines())


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("npusnap: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def _no_checkpoint(ck) -> None:
    assert not ck.exists()
    assert not [p for p in ck.parent.iterdir() if p.name.startswith(f".{ck.name}.")]


def test_check_reports_the_shim_driver(npusim_daemon) -> None:
    def cuda_line(env: dict[str, str]) -> dict:
        r = npusnap("check", "--json", env=env)
        doc = json.loads(r.stdout)
        return next(c for c in doc["checks"] if c["name"] == "device: cuda")

    line = cuda_line(shim_env(npusim_daemon.env))
    assert line["status"] == "ok", line
    assert "12080" in line["detail"] and "test shim" in line["detail"]
    old = cuda_line(shim_env(npusim_daemon.env, NPUSNAP_CUDASHIM_VERSION="12040"))
    assert old["status"] == "warn" and "12040" in old["detail"] and "r555" in old["fix"]
    none = cuda_line(shim_env(npusim_daemon.env, NPUSNAP_LIBCUDA="/nonexistent/libcuda.so.1"))
    assert none["status"] == "info" and "no NVIDIA driver" in none["detail"]


@requires_criu
def test_checkpoint_kill_restart_daemon_restore_is_identical(npusim_daemon, tmp_path) -> None:
    env = shim_env(npusim_daemon.env)
    ref = _reference(env)
    gate = StepGate(tmp_path / "gate", STEPS - 2)
    w = Workload(workload_argv(STEPS, SLEEP_MS), tmp_path / "w.out", env={**env, **gate.env})
    try:
        w.wait_for_line(f"step {AT} ", timeout=30)
        assert "npusnap_agent" not in open(f"/proc/{w.pid}/maps").read()
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--device", "cuda", "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        dev = doc["device"]
        assert dev["backend"] == "cuda" and dev["method"] == "cuda-driver"
        assert dev["gpus"] == GPUS and dev["devices"] == [0, 1]
        assert str(SHIM) in dev["runtime"] and "12080" in dev["runtime"]
        assert [p["name"] for p in doc["phases"]] == ["lock", "backup", "dump", "seal"]
        assert w.proc.wait(timeout=10) == -signal.SIGKILL
        at_checkpoint = strip_ready(w.lines())
        assert AT < len(at_checkpoint) < STEPS and at_checkpoint == ref[: len(at_checkpoint)]
        assert yaml.safe_load((ck / "manifest.yaml").read_text())["device"]["gpus"] == GPUS

        npusim_daemon.restart()  # a fresh, empty device
        gate.open()

        # --device-map is checked against the checkpoint before anything starts.
        for bad, words in (([f"{GPUS[0]}={GPUS[0]}"], ["does not cover", GPUS[1]]),
                           ([f"{GPUS[0]}={GPUS[0]}", f"{GPUS[1]}=GPU-{'ab' * 16}"], ["does not have"]),
                           ([f"{GPUS[0]}={GPUS[1]}", f"{GPUS[1]}={GPUS[1]}"], ["same GPU"]),
                           (["GPU-nothex=GPU-0"], ["not a GPU UUID"]),
                           ([f"GPU-{'cd' * 16}=GPU-{'ab' * 16}", f"{GPUS[0]}={GPUS[0]}", f"{GPUS[1]}={GPUS[1]}"],
                            ["not in the checkpoint"])):
            args = [a for m in bad for a in ("--device-map", m)]
            rs = npusnap("restore", ck, *args, env=env)
            assert rs.returncode == 2, (bad, rs.stderr)
            line = _one_error(rs.stderr)
            assert all(word in line for word in words), line
            assert not pid_alive(w.pid)

        # An identity map (every checkpointed GPU onto itself) goes through cuCheckpointProcessRestore's gpuPairs.
        rs = npusnap("restore", ck, "--json", "--device-map", f"{GPUS[0]}={GPUS[0]}",
                     "--device-map", f"{GPUS[1].upper()}={GPUS[1]}", env=env, timeout=60)
        assert rs.returncode == 0, rs.stderr
        rdoc = json.loads(rs.stdout)
        assert rdoc["pid"] == w.pid and rdoc["exit_code"] == 0
        assert [p["name"] for p in rdoc["phases"]] == ["verify", "criu-restore", "device-restore", "unlock"]
        assert strip_ready(w.lines()) == ref
    finally:
        w.stop()


@requires_criu
def test_auto_finds_cuda_and_leave_running_carries_on(npusim_daemon, tmp_path) -> None:
    env = shim_env(npusim_daemon.env)
    ref = _reference(env)
    w = Workload(workload_argv(STEPS, SLEEP_MS), tmp_path / "w.out", env=env)
    try:
        w.wait_for_line(f"step {AT} ", timeout=30)
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--leave-running", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["device"]["backend"] == "cuda"
        assert _driver().state(w.pid) == cuda.RUNNING
        assert w.proc.wait(timeout=30) == 0
        assert strip_ready(w.lines()) == ref
        # Without the shim, auto does not take an npusim process for a CUDA one.
        env_plain = shim_env(npusim_daemon.env, NPUSNAP_LIBCUDA=None)
        r = npusnap("checkpoint", 1, "-D", tmp_path / "x", env=env_plain)
        assert r.returncode == 13  # pid 1 refused, as ever: the shim changes nothing without NPUSNAP_LIBCUDA
    finally:
        w.stop()


@requires_criu
def test_lock_timeout_exits_10_and_leaves_the_workload_running(npusim_daemon, tmp_path) -> None:
    env = shim_env(npusim_daemon.env)
    # Each step queues a 1536^3 matmul (~1.5 s on the software NPU) and waits for it: a lock that
    # arrives mid-step cannot drain the device work in 0.1 s.
    w = Workload(workload_argv(3, 0, heavy=1536), tmp_path / "w.out", env=env)
    try:
        w.wait_for_line("step 0 ", timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--device", "cuda", "--lock-timeout", "0.1", env=env)
        assert r.returncode == 10, r.stderr
        line = _one_error(r.stderr)
        assert "CUDA_ERROR_TIMEOUT" in line and "--lock-timeout" in line
        _no_checkpoint(ck)
        assert _driver().state(w.pid) == cuda.RUNNING
        assert w.proc.wait(timeout=40) == 0
        assert w.lines()[-1].startswith("done")
    finally:
        w.stop()


def test_failed_state_is_reported_with_what_to_do(npusim_daemon, tmp_path) -> None:
    env = shim_env(npusim_daemon.env)
    w = Workload(workload_argv(400, 50), tmp_path / "w.out", env={**env, "NPUSIM_CTL_FAULT": "lock"})
    try:
        w.wait_for_line("step 1 ", timeout=30)
        ck = tmp_path / "ck"
        r = npusnap("checkpoint", w.pid, "-D", ck, "--device", "cuda", env=env)
        assert r.returncode == 9, r.stderr
        line = _one_error(r.stderr)
        assert "FAILED" in line and "restore it from its last checkpoint" in line
        _no_checkpoint(ck)
        assert _driver().state(w.pid) == cuda.FAILED
        # Asked again, it is refused before anything starts.
        r = npusnap("checkpoint", w.pid, "-D", ck, "--device", "cuda", env=env)
        assert r.returncode == 9
        assert "reports process" in _one_error(r.stderr) and "FAILED" in r.stderr
        _no_checkpoint(ck)
    finally:
        w.stop()


def test_no_cuda_process(npusim_daemon, tmp_path) -> None:
    env = shim_env(npusim_daemon.env)
    w = Workload(["sleep", "30"], tmp_path / "w.out", env=env)
    try:
        r = npusnap("checkpoint", w.pid, "-D", tmp_path / "ck", "--device", "cuda", env=env)
        assert r.returncode == 11, r.stderr
        assert "holds a CUDA context" in _one_error(r.stderr)
        assert pid_alive(w.pid)
    finally:
        w.stop()
