"""Which of a campaign's runs may meet in one sum.

Figures from runs of another model, hardware, TP degree, dtype, communicator, vLLM version,
vLLM CPU kernel build, attention backend, device or code answer another question; summing them with the
rest makes a number nobody measured. So the report keeps only the runs that agree with the
campaign on every field below and refuses the others by name, with the field that differs.
The campaign's value of a field is the one most of its runs carry (ties: the newest run's),
so one stray run cannot take the campaign over. A field a run does not carry (an older run,
a phase it does not apply to) is not checked for that run.

Code is compared by what can change a figure (k25exp.code_hash): the run's code_sha256 tag,
or, for a run logged before runs carried it, the same hash of its git commit's tree (when
the commit is in this repository and the run's tree was clean), so two commits that differ
only in the report, the docs or the tests measure the same; a run with neither is compared
by its commit. code_source() says which each run's value came from.

A change can alter the code hash without touching what a figure measured (a figure added
beside the timed path, say). experiment.same_code names such code states by the first
characters of their hash: runs that carry one are kept with the campaign's code, and the
report's header names them and their runs, so pooling across them is the user's stated
choice, never the report's guess.

TP is the degree each phase ran at, not hardware.tp alone: server.tp for the served phases
(a server may run at another TP than the hardware config's), the GEMM job's own
experiment.tp (the shard it timed), hardware.tp for the collectives (TP = their ranks).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from k25exp import code_hash

from k25exp.report.sources import Campaign
from k25exp.serving.vllm_version import NOT_INSTALLED
from k25exp.tracking.read import RunView

COLLECTIVE_PHASES = ("nccl_burst", "allreduce_sweep")  # all_to_all times c10d by design
SERVED_PHASES = ("macro", "profile", "spec_decode")
# vllm.cpu_isa values that name no kernel build (none loaded, a process gone, a GPU build)
NO_BUILD = ("none", "unknown", "n/a")


REPO = Path(__file__).resolve().parents[2]  # the checkout the report runs in, if it is one


@functools.lru_cache(maxsize=None)
def _commit_code(commit: str) -> Optional[str]:
    return code_hash.commit_hash(REPO, commit)


def code_of(r: RunView) -> Optional[str]:
    """The run's code (module docstring): its code_sha256, else its clean commit's tree hash,
    else "commit <sha>" (+ its diff hash when the tree was dirty); None without either."""
    if r.tags.get("code_sha256"):
        return r.tags["code_sha256"]
    commit = r.tags.get("git_commit")
    if not commit:
        return None
    if r.tags.get("git_dirty", "False") == "False" and (h := _commit_code(commit)):
        return h
    dirty = r.tags.get("git_diff_sha256")
    return f"commit {commit}" + (f" + diff {dirty[:12]}" if dirty and dirty != "clean" else "")


def code_source(r: RunView) -> str:
    """Where code_of's value came from, for the report."""
    if r.tags.get("code_sha256"):
        return "code_sha256 tag"
    v = code_of(r)
    if v is None:
        return "nothing (no code_sha256, no git_commit)"
    return "commit's tree" if not v.startswith("commit ") else "commit alone"


@dataclass(frozen=True)
class Field:
    name: str
    get: Callable[[RunView], Optional[str]]
    phases: tuple[str, ...] = ()  # () = every phase that has it


def _param(key: str) -> Callable[[RunView], Optional[str]]:
    return lambda r: r.params.get(key)


def tp_as_run(r: RunView) -> Optional[str]:
    """The TP degree the run measured at (module docstring)."""
    if r.phase in SERVED_PHASES:
        return r.params.get("server.tp")
    if r.phase == "gemm":
        return r.params.get("experiment.tp")
    return r.params.get("hardware.tp")


def vllm_version(r: RunView) -> Optional[str]:
    """What the server said it runs (GET /version), else the vLLM installed with the job
    (tag vllm.version, or vllm on older runs); a job without vLLM ran none of its code."""
    v = r.tags.get("server.version") or r.tags.get("vllm.version") or r.tags.get("vllm")
    return None if v == NOT_INSTALLED else v


def cpu_build(r: RunView) -> Optional[str]:
    """The vLLM CPU kernel build(s) the run's processes loaded; None when it names none."""
    v = r.tags.get("vllm.cpu_isa")
    return None if not v or v.startswith(NO_BUILD) else v


def attention_backend(r: RunView) -> Optional[str]:
    """The attention backend the run's server said it picked ("Using X backend." in its log);
    None when it could not tell (an endpoint, a log without the line). On a CPU it follows the
    ISA: an MLA model runs AMX_MLA where the CPU has AMX tiles, else CPU_MLA."""
    v = r.tags.get("vllm.attention_backend")
    return None if not v or v.startswith("unknown") else v


FIELDS = (
    Field("model.name", _param("model.name")),
    Field("model.hidden_size", _param("model.hidden_size")),
    Field("model.num_hidden_layers", _param("model.num_hidden_layers")),
    Field("model.dtype", _param("model.dtype")),
    # one TP rank's layers as the model (model.tp_rank_of) vs the whole model: another question
    Field("model.tp_rank_of", _param("model.tp_rank_of")),
    Field("hardware.name", _param("hardware.name")),
    Field("tp (as run)", tp_as_run),
    Field("experiment.communicator", _param("experiment.communicator"), COLLECTIVE_PHASES),
    Field("experiment.graph (GEMM timing mode)", _param("experiment.graph"), ("gemm",)),
    Field("vllm version (server.version, else tag vllm.version)", vllm_version),
    Field("vllm.cpu_isa (kernel build)", cpu_build),
    Field("vllm.attention_backend", attention_backend, SERVED_PHASES),
    Field("device (device_found)", lambda r: r.tags.get("device_found")),
    Field("code_sha256", lambda r: code_of(r)),
)


@dataclass(frozen=True)
class Refusal:
    run: RunView
    field: str
    value: Optional[str]
    expected: Optional[str]

    def __str__(self) -> str:
        return (f"run {self.run.short} ({self.run.phase}) refused: {self.field}={self.value}, "
                f"the campaign's is {self.expected}")


def campaign_values(c: Campaign) -> dict[str, str]:
    """The value most of the campaign's finished runs carry, per field."""
    out = {}
    runs = sorted((r for r in c.runs if r.status == "FINISHED"), key=lambda r: -r.start_time)
    for f in FIELDS:
        vals = [v for r in runs if (not f.phases or r.phase in f.phases) and (v := f.get(r))]
        if vals:
            counts = Counter(vals)
            top = max(counts.values())
            out[f.name] = next(v for v in vals if counts[v] == top)  # ties: the newest run's
    return out


TRACED_PHASES = ("profile", "spec_profile")


def host_steps_on_a_device(r: RunView) -> Optional[tuple[str, str, str]]:
    """A traced run on a GPU whose steps were timed by their host ranges (no device-side step
    annotation, none rebuilt: runs analysed before k25exp.traces.device_copies rebuilt them
    kind by kind). The host range ends when the step is queued: its shares and step time
    are not the device's, so no section may use them."""
    sources = set(filter(None, r.tags.get("trace.step_source", "").split(",")))
    on_device = r.params.get("hardware.device", "cpu") != "cpu"  # device_found names a CPU too
    if r.phase in TRACED_PHASES and "user_annotation" in sources and on_device:
        return ("trace.step_source", "user_annotation", "gpu_user_annotation (device-side steps) on a GPU")
    return None


def declared_same(code: Optional[str], same_code: Sequence[str]) -> Optional[str]:
    """The experiment.same_code entry (a hash prefix) that `code` starts with, if any."""
    return next((p for p in same_code if code and code.startswith(p)), None)


def check(c: Campaign, same_code: Sequence[str] = ()) -> tuple[Campaign, list[Refusal]]:
    """The campaign without the runs that disagree with it, and why each was refused; a run
    whose code is one that `same_code` declares is kept (module docstring)."""
    expected = campaign_values(c)
    refused: list[Refusal] = []
    kept = []

    def differs(f: Field, v: str) -> bool:
        return v != expected[f.name] and not (f.name == "code_sha256" and declared_same(v, same_code))

    for r in c.runs:
        bad = next(((f.name, v, expected[f.name]) for f in FIELDS if (not f.phases or r.phase in f.phases)
                    and f.name in expected and (v := f.get(r)) is not None and differs(f, v)),
                   None) or host_steps_on_a_device(r)
        if bad and r.status == "FINISHED":
            refused.append(Refusal(r, *bad))
        else:
            kept.append(r)
    return Campaign(c.id, c.uri, kept), refused


def random_weights(c: Campaign) -> bool:
    """The served checkpoint is k25exp's generated random-weight model (its figures time the
    architecture, not a trained model's routing or acceptance)."""
    served = [r for r in c.runs if r.phase in ("macro", "profile", "spec_decode")]
    return any(r.params.get("model.name") == "tiny_kimi" or
               "/models/tiny_kimi-" in r.tags.get("server.model_path", "") for r in served)


def ran_with(c: Campaign, same_code: Sequence[str] = ()) -> str:
    """One line for the report's header: what the campaign's runs agree they ran (the code by
    its hash's first 12 characters, and where the runs' hashes came from), and the runs kept
    under another code that experiment.same_code declares the same (each hash, its runs)."""
    vals = campaign_values(c)
    campaign_code = vals.get("code_sha256")
    if "code_sha256" in vals and not vals["code_sha256"].startswith("commit "):
        vals["code_sha256"] = vals["code_sha256"][:12]
    sources = Counter(code_source(r) for r in c.runs if r.status == "FINISHED")
    if sources:
        vals["code_sha256"] = (vals.get("code_sha256", "?") + " (runs' code by: " + ", ".join(
            f"{src} {n}" for src, n in sources.most_common()) + ")")
    declared: dict[str, list[str]] = {}
    for r in sorted(c.runs, key=lambda r: r.start_time):
        if (code := code_of(r)) and code != campaign_code and declared_same(code, same_code):
            declared.setdefault(code[:12], []).append(r.short)
    if declared:
        vals["pooled with it by experiment.same_code"] = ", ".join(
            f"{code} (runs {' '.join(runs)})" for code, runs in declared.items())
    return "; ".join(f"{k} {v}" for k, v in vals.items())
