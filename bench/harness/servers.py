"""The servers the benches compare: build (llama-server), start, wait healthy, pause, resume, stop.

Every server runs as a subprocess in its own process group with its output in a log file;
`stop()` is safe to call at any point (also when `start()` failed half-way) and leaves no
process behind. llamaray's Ray cluster lives in its own temp dir (RAY_TMPDIR) so that the
bench never connects to, or kills, another Ray cluster on the machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx
import yaml

from app.ops.ray_env import http_endpoint, port_state
from tools.llama_build import build_env, build_key

from . import procfs
from .bundled import MODEL_ID, bundled_model_path
from .procs import session_procs, title_of
from .run import ROOT, VENV_BIN, free_port, log, run_cli

LLAMA_SERVER_DIR = ROOT / "build" / "llama-server"

N_THREADS = 2               # same for the three servers
N_PARALLEL = 16             # slots / sequences decoded together
CTX_PER_SEQ = 2048          # context of one request, same as llamaray's n_ctx in configs/bench.yaml


def llama_cpp_python_version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def _run_logged(cmd: list[str], logf: IO[str], *, cwd: Path | None = None, nice: bool = False,
                env: dict[str, str] | None = None) -> None:
    logf.write(f"\n$ {' '.join(map(str, cmd))}\n")
    logf.flush()
    rc = subprocess.call([str(c) for c in cmd], cwd=cwd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                         preexec_fn=(lambda: os.nice(10)) if nice else None)
    if rc != 0:
        raise RuntimeError(f"command failed ({rc}): {' '.join(map(str, cmd))}; see {logf.name}")


# --------------------------------------------------------------------------------------------
# llama-server: built once from the llama.cpp vendored in the llama-cpp-python sdist
# --------------------------------------------------------------------------------------------

def ensure_llama_server(log_dir: Path, jobs: int = 2) -> Path:
    """build/llama-server/bin/llama-server for the installed llama-cpp-python version.

    Built with the flags tools/llama_build.py gives llama-cpp-python (native, AMX compiled out), so
    the comparison stays like for like. Downloads the sdist (pip download) and builds only the
    `llama-server` target the first time; later runs find the binary and its stamp (version and
    build key: flags, compiler, CPU) and skip both.
    """
    version = llama_cpp_python_version()
    flags = build_env(cuda=False, cuda_arch=None)
    want = f"{version} {build_key(flags, version)}"
    binary = LLAMA_SERVER_DIR / "bin" / "llama-server"
    stamp = LLAMA_SERVER_DIR / "VERSION"
    if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == want:
        return binary

    log_dir.mkdir(parents=True, exist_ok=True)
    build_log = log_dir / "llama-server-build.log"
    log(f"building llama-server from llama-cpp-python=={version} sdist (once; log: {build_log})")
    t0 = time.monotonic()
    sdist_dir = LLAMA_SERVER_DIR / "sdist"
    src_dir = LLAMA_SERVER_DIR / "src"
    cmake_dir = LLAMA_SERVER_DIR / "cmake-build"
    with open(build_log, "a") as logf:
        tarball = sdist_dir / f"llama_cpp_python-{version}.tar.gz"
        if not tarball.is_file():
            sdist_dir.mkdir(parents=True, exist_ok=True)
            _run_logged([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}",
                         "--no-binary", ":all:", "--no-deps", "-d", sdist_dir], logf)
        found = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
        if not tarball.is_file():
            if not found:
                raise RuntimeError(f"pip download left no sdist in {sdist_dir}")
            tarball = found[-1]

        llama_src = src_dir / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        if not (llama_src / "CMakeLists.txt").is_file():
            prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            with tarfile.open(tarball) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(src_dir, members=members, **kwargs)

        cmake_lists = (llama_src / "CMakeLists.txt").read_text()
        options = {
            "CMAKE_BUILD_TYPE": "Release",
            **dict(arg[2:].split("=", 1) for arg in flags["CMAKE_ARGS"].split()),  # GGML_NATIVE=ON
            "BUILD_SHARED_LIBS": "OFF",      # one self-contained binary
            "LLAMA_BUILD_COMMON": "ON",
            "LLAMA_BUILD_TOOLS": "ON",       # the server lives under tools/
            "LLAMA_BUILD_SERVER": "ON",
            "LLAMA_BUILD_TESTS": "OFF",
            "LLAMA_BUILD_EXAMPLES": "OFF",
            "LLAMA_BUILD_APP": "OFF",
            "LLAMA_BUILD_UI": "OFF",         # no npm
            "LLAMA_USE_PREBUILT_UI": "OFF",  # no download of the web UI
            "LLAMA_OPENSSL": "OFF",
            "LLAMA_CURL": "OFF",
        }
        # Pass only the options this llama.cpp tree still declares (LLAMA_CURL was removed, ...).
        declared = set(re.findall(r"option\(\s*(\w+)", cmake_lists))
        defines = [f"-D{k}={v}" for k, v in options.items() if k.startswith(("CMAKE_", "GGML_", "BUILD_"))
                   or k in declared]
        shutil.rmtree(cmake_dir, ignore_errors=True)  # CFLAGS are read only by a fresh configure
        env = {**os.environ, **{k: v for k, v in flags.items() if k != "CMAKE_ARGS"}}
        _run_logged(["cmake", "-S", llama_src, "-B", cmake_dir, *defines], logf, env=env)
        _run_logged(["cmake", "--build", cmake_dir, "--target", "llama-server", f"-j{jobs}"], logf, nice=True,
                    env=env)
        built = cmake_dir / "bin" / "llama-server"
        if not built.is_file():
            raise RuntimeError(f"build finished but {built} is missing; see {build_log}")
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, binary)
        stamp.write_text(want + "\n")
    log(f"llama-server built in {time.monotonic() - t0:.0f} s: {binary}")
    return binary


# --------------------------------------------------------------------------------------------
# Managed servers
# --------------------------------------------------------------------------------------------

class Server:
    """A server process in its own process group. Subclasses set `name`, `model` and `command()`."""

    name = "?"
    model = MODEL_ID
    health_path = "/health"
    start_timeout_s = 180.0

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = log_dir / f"{self.name}.log"
        self.cmdline: list[str] = []
        self._logf: IO[str] | None = None

    @property
    def session_id(self) -> int | None:
        """The session (start_new_session=True: the leader's pid) all its processes share."""
        return self.proc.pid if self.proc is not None else None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prepare(self) -> None:
        """Build / render what the command needs (before the clock of start-up starts)."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        self.cmdline = [str(c) for c in self.command()]
        self._logf = open(self.log_path, "w")
        self._logf.write(f"$ {' '.join(self.cmdline)}\n")
        self._logf.flush()
        log(f"starting {self.name}: {' '.join(self.cmdline)}")
        self.proc = subprocess.Popen(self.cmdline, cwd=ROOT, env=self.env(), stdout=self._logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=_interruptible)
        self.wait_healthy()

    def wait_healthy(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + self.health_path, timeout=5).status_code == 200:
                    log(f"{self.name} healthy on {self.base_url} after {time.monotonic() - t0:.1f} s")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not healthy after {self.start_timeout_s:.0f} s; "
                           f"log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def pause(self) -> None:
        """SIGSTOP every process of its session (Ray's included): a paused server takes no CPU from the
        one being measured, and carries on where it was after `resume()`."""
        self._signal_session(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_session(signal.SIGCONT)

    def _signal_session(self, sig: int) -> None:
        if self.session_id is None:
            return
        for pid, _ in session_procs(self.session_id):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)   # pgid == pid: start_new_session=True
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()   # a stopped process would not act on SIGTERM
            self._stop_group(first=signal.SIGTERM, grace_s=20)
        if self._logf is not None:
            self._logf.close()
            self._logf = None

    def _stop_group(self, first: int, grace_s: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self._signal_group(first)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not exit after {grace_s:.0f} s, killing its process group")
        # The group may outlive its leader (children): make sure nothing of it is left.
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class LlamaServer(Server):
    """llama.cpp's C++ server, continuous batching over N_PARALLEL slots of CTX_PER_SEQ tokens."""

    name = "llama-server"

    def prepare(self) -> None:
        self.binary = ensure_llama_server(self.log_dir)
        self.model_path = bundled_model_path()

    def command(self) -> list[str]:
        return [self.binary, "-m", self.model_path, "-t", N_THREADS, "-tb", N_THREADS,
                "-np", N_PARALLEL, "-c", N_PARALLEL * CTX_PER_SEQ, "--cont-batching",
                "--alias", MODEL_ID, "--no-webui", "--host", "127.0.0.1", "--port", self.port]


class LlamaCppPythonServer(Server):
    """llama-cpp-python's own OpenAI server (one sequence at a time)."""

    name = "llama-cpp-python"
    health_path = "/v1/models"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", bundled_model_path(),
                "--model_alias", MODEL_ID, "--n_threads", N_THREADS, "--n_threads_batch", N_THREADS,
                "--n_ctx", CTX_PER_SEQ, "--host", "127.0.0.1", "--port", self.port]


class LlamarayServer(Server):
    """This project: `llamaray serve-local` (`serve run`, as `make run` starts it) on serve_config.yaml +
    configs/local-cpu.yaml + configs/bench.yaml.

    The Ray cluster `serve run` starts gets its own RAY_TMPDIR, so it neither joins another
    cluster on this machine nor is confused with one when it is torn down: after `serve run`
    got SIGINT (it shuts Serve down and its driver stops the Ray processes it started), every
    process left whose command line names that temp dir is killed by pid. (`ray stop --force`
    is not used: it would kill every Ray cluster of the user, also other people's test runs.)
    """

    name = "llamaray"
    start_timeout_s = 300.0
    overlays = ("configs/local-cpu.yaml", "configs/bench.yaml")
    config_file = "serve_bench.yaml"   # the rendered config, under build/
    http_port: int | None = None       # instead of the config's, for servers that run side by side

    def prepare(self) -> None:
        self.config_path = ROOT / "build" / self.config_file
        run_cli([VENV_BIN / "llamaray", "render-config", "serve_config.yaml",
                  *[a for o in self.overlays for a in ("--overlay", o)], "-o", self.config_path])
        config = yaml.safe_load(self.config_path.read_text())
        if self.http_port is not None:
            config.setdefault("http_options", {})["port"] = self.http_port
            self.config_path.write_text(self.config_path.read_text().split("\n", 1)[0] + "\n"
                                        + yaml.safe_dump(config, sort_keys=False))
        run_cli([VENV_BIN / "llamaray", "check-config", self.config_path])
        self.port = http_endpoint(config)[1]
        self.model = config["applications"][0]["args"]["models"][0]["id"]
        state = port_state("127.0.0.1", self.port)  # fail early and clearly if the port is taken
        if state != "free":
            raise RuntimeError(f"port {self.port} ({self.config_file}) is {state}")
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="lrb-", dir="/tmp"))  # short: unix socket paths

    def command(self) -> list[str]:
        return [VENV_BIN / "llamaray", "serve-local", self.config_path]  # as `make run` starts it

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        env["RAY_TMPDIR"] = str(self.ray_tmp)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def stop(self) -> None:
        try:
            if self.proc is not None:
                self.resume()
                # SIGINT to `serve run` only (KeyboardInterrupt -> serve.shutdown(), driver exit
                # stops its Ray processes); the rest of the group is killed afterwards.
                if self.proc.poll() is None:
                    try:
                        os.kill(self.proc.pid, signal.SIGINT)
                        self.proc.wait(timeout=60)
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        log("serve run did not exit after SIGINT within 60 s")
                self._stop_group(first=signal.SIGTERM, grace_s=15)
        finally:
            if getattr(self, "ray_tmp", None) is not None:
                left = _kill_processes_mentioning(str(self.ray_tmp))
                if left:
                    log(f"killed {left} Ray processes left by serve run")
                shutil.rmtree(self.ray_tmp, ignore_errors=True)
            super().stop()


class LlamarayGraphServer(LlamarayServer):
    """`make run`'s command on the cluster's shape: the same overlays plus configs/local-graph.yaml, so the
    Ingress, the ChatProcessor and the model are deployments of their own (two Ray hops per streamed
    item) on the same machine, threads and slots. On a port of its own, so it can run beside `llamaray`."""

    name = "llamaray-graph"
    overlays = ("configs/local-cpu.yaml", "configs/local-graph.yaml", "configs/bench.yaml")
    config_file = "serve_bench_graph_shape.yaml"
    http_port = 8475


class ServeDriverServer(LlamarayServer):
    """llamaray on a Ray head of its own with logical GPUs (bench/harness/serve_driver.py: `--num-gpus`,
    `--num-cpus`), Ray Serve's settings from `ray_env()`; started once the driver says every replica is
    up (READY), then /health answers."""

    num_gpus = 2
    num_cpus = 4
    gcs_address: str | None = None   # the cluster's, once started (for a driver of the bench's own)

    def command(self) -> list[str]:
        return [VENV_BIN / "python", "-m", "bench.harness.serve_driver", self.config_path, "--num-gpus", self.num_gpus,
                "--num-cpus", self.num_cpus]

    def ray_env(self) -> dict[str, str]:
        return {}

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(self.ray_env())
        # Ray's workers import app/ and deployments/ from this checkout (an editable install may point
        # at another one).
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            if "NOT READY" in text or "DEPLOY FAILED" in text:
                raise RuntimeError(f"{self.name} did not start; log {self.log_path}:\n{self.log_tail()}")
            if "\nREADY " in text or text.startswith("READY "):
                self.gcs_address = next((line.split()[1] for line in text.splitlines() if line.startswith("GCS ")),
                                        None)
                break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"{self.name} not ready after {self.start_timeout_s:.0f} s")
        super().wait_healthy()


def _interruptible() -> None:
    """In the server's child process: SIGINT at its default. A bench started in the background of a
    non-interactive shell inherits SIGINT ignored, and so would every server: `stop()`'s SIGINT, which
    has the servers shut down in order, would then be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)



def _pids_mentioning(needle: str) -> list[int]:
    me = os.getpid()
    return [pid for pid in procfs.pids() if pid != me
            and needle in title_of(procfs.read_cmdline(pid) or b"")]


def _kill_processes_mentioning(needle: str, grace_s: float = 10) -> int:
    """SIGTERM, then SIGKILL, the processes whose command line contains `needle`."""
    pids = _pids_mentioning(needle)
    found = len(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _is_zombie(p)]
            time.sleep(0.2)
        if not pids:
            break
    return found


def _is_zombie(pid: int) -> bool:
    rest = procfs.read_stat(pid)
    return rest is None or rest[0] == "Z"


SERVERS = {
    "llamaray": LlamarayServer,
    "llamaray-graph": LlamarayGraphServer,
    "llama-server": LlamaServer,
    "llama-cpp-python": LlamaCppPythonServer,
}
