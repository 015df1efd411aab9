"""The launch of a vLLM server from config: its argument list, environment and identity.

Nothing here starts the server (k25exp.serving.process does); the vLLM version of another
interpreter (server.python) is read once in a short child process. Secrets (the API key, and any
server.env value whose name looks secret or is listed in tracking.redact) go to the child by
environment only: never in argv, never hashed into the launch key, masked in every description.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from k25exp import vllm_kernels
from k25exp.config.schema import ModelConfig, ServerConfig
from k25exp.config.server_checks import quantized_needs_dummy
from k25exp.model import routing as routing_mod
from k25exp.redact import is_secret, redact_env, scrub
from k25exp.config.dev_endpoints import dev_mode_allowed
from k25exp.serving import vllm_version, worker_extension
from k25exp.serving.errors import ServerError, ServerStartError


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]  # added to os.environ for the child
    host: str
    port: int  # 0 = pick a free one at start
    served_model_name: str
    model_path: str
    log_dir: Path
    ready_timeout_s: float
    stop_timeout_s: float
    api_key_env: Optional[str] = None
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # never hashed, never logged
    # the vLLM release the server's interpreter has (k25exp.serving.vllm_version); not in the
    # key: argv and env already say everything the launch does with it
    vllm_version: str = ""

    def key(self) -> str:
        """Identity of the launch: two specs with the same key are the same server. Secret
        values are not in it (their names are): changing a token does not restart a server."""
        blob = json.dumps({"argv": self.argv, "env": self.env, "api_key_env": self.api_key_env,
                           "secret_names": sorted(self.secret_env)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def changes_from(self, old: "LaunchSpec") -> list[str]:
        """What differs from `old`'s launch, flag by flag ("--max-model-len 2048 → 4096") and
        by environment name (values of secrets never shown): why a multirun restarts its
        server between two jobs."""
        def flags(argv: list[str]) -> dict[str, str]:
            out, i = {}, 0
            while i < len(argv):
                a = argv[i]
                if a.startswith("--"):
                    has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                    out[a] = argv[i + 1] if has_value else "on"
                    i += 2 if has_value else 1
                else:
                    out.setdefault("argv", "")
                    out["argv"] += (" " if out["argv"] else "") + a
                    i += 1
            return out

        a, b = flags(old.argv), flags(self.argv)
        diff = [f"{k} {a.get(k, '(unset)')} → {b.get(k, '(unset)')}"
                for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        diff += [f"env {k} {old.env.get(k, '(unset)')} → {self.env.get(k, '(unset)')}"
                 for k in sorted(set(old.env) | set(self.env)) if old.env.get(k) != self.env.get(k)]
        if sorted(old.secret_env) != sorted(self.secret_env):
            diff.append("secret env names " + ",".join(sorted(old.secret_env)) + " → "
                        + ",".join(sorted(self.secret_env)))
        return diff

    def child_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, **self.secret_env}

    def describe(self, argv: Optional[list[str]] = None) -> str:
        """argv and the added environment, secrets masked: the server log's header."""
        env = redact_env({**self.env, **self.secret_env}, self.secret_env)
        text = ("# k25exp: " + " ".join(argv or self.argv) + "\n# env: " +
                " ".join(f"{k}={v}" for k, v in sorted(env.items())) + "\n")
        if self.vllm_version:
            text += f"# vllm: {self.vllm_version} ({vllm_version.checked(self.vllm_version)})\n"
        return scrub(text, {v for v in self.secret_env.values() if v})


def split_cpus(tp: int, cpus: Optional[list[int]] = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND giving each of `tp` ranks an equal block of CPUs: '0|1'."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if tp <= 0 or len(cpus) < tp:
        raise ServerError(f"server.tp={tp} needs at least {tp} CPUs for the CPU build, "
                          f"this process may use {len(cpus)}")
    per = len(cpus) // tp
    blocks = [cpus[i * per:(i + 1) * per] for i in range(tp)]
    return "|".join(",".join(map(str, b)) for b in blocks)


def threads_bind(bind: Optional[str], tp: int) -> Optional[str]:
    """VLLM_CPU_OMP_THREADS_BIND for server.cpu_threads_bind: "split" made into `tp` blocks,
    explicit lists as given, None when unbound."""
    return split_cpus(tp) if bind == "split" else (bind or None)


def resolve_model_path(server: ServerConfig, model: ModelConfig, seed: int) -> tuple[Path, bool]:
    """The checkpoint folder to serve: server.model_path, or the model group's generated folder
    (random bf16 weights; for a quantized model its config alone, served with dummy weights).

    Returns (path, generated_now). A configured path that doesn't exist, or a generated
    quantized folder without server.load_format=dummy, is an error here, before anything starts.
    """
    if server.model_path:
        p = Path(server.model_path)
        if not p.exists():
            raise ServerStartError(
                f"server.model_path={server.model_path} does not exist; point it at a checkpoint "
                "folder, or set server.model_path=null to generate the model group's tiny "
                "random-weight checkpoint")
        return p, False
    from k25exp.serving import tiny_model

    if not tiny_model.has_weights(model) and server.load_format != "dummy":
        raise ServerStartError(quantized_needs_dummy(model, server))
    return tiny_model.ensure(model, seed, Path(server.model_cache))


def _argv(s: ServerConfig, model_path: Path) -> list[str]:
    argv = [s.python or sys.executable, *s.entrypoint, "--model", str(model_path),
            "--served-model-name", s.served_model_name, "--host", s.host, "--port", str(s.port),
            "--tensor-parallel-size", str(s.tp), "--dtype", s.dtype,
            "--max-model-len", str(s.max_model_len), "--seed", str(s.seed)]
    optional = {"--max-num-seqs": s.max_num_seqs,
                "--max-num-batched-tokens": s.max_num_batched_tokens,
                "--gpu-memory-utilization": s.gpu_memory_utilization, "--tokenizer": s.tokenizer,
                "--load-format": s.load_format,
                "--kv-cache-memory-bytes": int(s.kv_cache_memory_gib * 2**30)
                if s.kv_cache_memory_gib else None}
    for flag, value in optional.items():
        if value is not None and value != "":
            argv += [flag, str(value)]
    if s.enforce_eager:
        argv.append("--enforce-eager")
    if s.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if s.enable_prefix_caching
                    else "--no-enable-prefix-caching")
    if s.trust_remote_code:
        argv.append("--trust-remote-code")
    if s.profiler:
        argv += ["--profiler-config", json.dumps(dict(s.profiler), sort_keys=True)]
    if extension_loaded(s):
        argv += ["--worker-extension-cls", worker_extension.EXTENSION]
    return argv + [str(a) for a in s.extra_args]


def extension_loaded(s: ServerConfig) -> bool:
    """Whether the launched workers carry k25exp's worker extension (the collective probe, the
    synthetic-acceptance setter: k25exp.serving.worker_extension): vLLM run by this
    interpreter (which can import k25exp) and no extension class of the user's."""
    return (s.kind == "vllm" and s.collective_probe
            and (s.python is None or s.python == sys.executable)
            and "--worker-extension-cls" not in s.extra_args)


def launch_spec(server: ServerConfig, model_path: Path, device: str = "cpu",
                redact: Iterable[str] = (), cpu_isa: Optional[str] = None,
                routing: str = "learned") -> LaunchSpec:
    """`redact`: env names to treat as secret besides TOKEN/KEY/SECRET/PASSWORD (tracking.redact).
    `cpu_isa`: hardware.vllm_cpu_isa, the highest ISA the CPU build's kernel choice may see
    (None: the cap this process runs under, if any: a capped process's servers are capped).
    `routing`: model.routing as the run applies it (k25exp.model.routing.effective): vLLM's
    routing simulator replaces the router's choice unless it is `learned`.
    Reads the vLLM version of server.python from package metadata (a short child process only
    when server.python is another interpreter) and logs the path k25exp takes for it."""
    s = server
    env = {"PYTHONUNBUFFERED": "1"}
    if dev_mode_allowed(s):  # /reset_prefix_cache, /start_profile ...: loopback or opted in
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if device == "cpu":
        cpu_isa = cpu_isa or os.environ.get(vllm_kernels.ENV) or None
        if s.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_space_gib)
        bind = threads_bind(s.cpu_threads_bind, s.tp)
        if bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        if cpu_isa:  # every server process caps torch's ISA probes at start (sitecustomize)
            env.update(vllm_kernels.child_env(cpu_isa))
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(vllm_kernels.site_dir()), os.environ.get("PYTHONPATH")) if p)
    env.update(routing_mod.server_env(routing))
    if extension_loaded(s):  # the workers import it from the k25exp this job runs
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH") or os.environ.get("PYTHONPATH"),
                        str(Path(worker_extension.__file__).parents[2])) if p)
    secret = {}
    for k, v in s.env.items():
        (secret if is_secret(k, redact) else env)[k] = str(v)
    if s.api_key_env:
        secret["VLLM_API_KEY"] = api_key(s)  # passed by environment: never in argv or ps
    version = vllm_version.installed(s.python)
    vllm_version.log_paths(version)
    return LaunchSpec(argv=_argv(s, model_path), env=env, host=s.host, port=s.port,
                      served_model_name=s.served_model_name, model_path=str(model_path),
                      log_dir=Path(s.log_dir), ready_timeout_s=s.ready_timeout_s,
                      stop_timeout_s=s.stop_timeout_s, api_key_env=s.api_key_env,
                      secret_env=secret, vllm_version=version)


def api_key(server: ServerConfig) -> Optional[str]:
    """The API key from the environment variable server.api_key_env names (None if unset)."""
    if not server.api_key_env:
        return None
    v = os.environ.get(server.api_key_env)
    if not v:
        raise ServerError(f"server.api_key_env={server.api_key_env}: that environment variable "
                          "is not set")
    return v


def auth_headers(key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
