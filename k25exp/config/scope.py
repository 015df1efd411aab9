"""Which parts of the config an experiment has, and which overrides therefore belong to it.

The root config holds what every job has (model, hardware, tracking, paths, seed); a group
that only some experiments use is composed by those experiments' files alone — the `server`
group by the ones that drive a server (macro, profile, spec_decode, slo_search). So an
override of `server.*` means something to those and nothing to a collective or GEMM job, and
`experiment.input_tokens` to the serving experiments alone: multirun.sh passes each phase only
the overrides whose key its config has (`phase_paths`, by the whole dotted key), and
the command line refuses `server.port=1` on an experiment without a server with the reason
(`missing_part_error`) instead of OmegaConf's "Unexpected type for root: NoneType".

What an experiment has comes from composing it with Hydra (the real defaults lists), never
from a list kept here.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Optional

from omegaconf import DictConfig


def override_key(arg: str) -> Optional[str]:
    """The top-level config key a command-line override sets (`server.port=1`, `server=endpoint`,
    `~server.env.X` → `server`); None for what is not a config override (Hydra's flags, and
    `hydra.*` / `hydra/...`, Hydra's own settings, which every job has)."""
    if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
        return None
    key = arg.lstrip("+~").split("=", 1)[0]
    head = re.split(r"[./@]", key, maxsplit=1)[0]
    return None if not head or head == "hydra" else head


def _composed(experiment: str):
    """The config `experiment=NAME` composes to (Hydra's compose, the real defaults lists)."""
    from hydra import compose, initialize_config_dir

    from k25exp.config import register_configs
    from k25exp.config.store import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("config", overrides=[f"experiment={experiment}"])


def config_paths(node, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a composed config, parents before their children (`server`,
    `server.port`, ...), a null one included (it can be set: server.profiler on macro) but
    for a config group the experiment does not compose (server on nccl_burst: null at the
    top), which is not there, nor anything under it."""
    for k in node.keys():
        child = node._get_node(k)
        if not prefix and isinstance(child, DictConfig) and child._is_none():
            continue
        yield f"{prefix}{k}"
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from config_paths(child, f"{prefix}{k}.")


def phase_paths(experiment: str) -> frozenset[str]:
    """The dotted keys `experiment=NAME` composes to (config_paths)."""
    return frozenset(config_paths(_composed(experiment)))


def phase_keys(experiment: str) -> frozenset[str]:
    """The top-level keys `experiment=NAME` composes to that hold something (a group an
    experiment does not use is null: server on nccl_burst)."""
    return frozenset(k for k in phase_paths(experiment) if "." not in k)


def _experiments(args: Iterable[str]) -> list[Optional[str]]:
    """The experiments a command line runs (several in a sweep `experiment=a,b`); [None] when
    it names none."""
    for a in args:
        if a.startswith("experiment="):
            value = a.split("=", 1)[1]
            value = value[len("choice("):-1] if value.startswith("choice(") else value
            return [v.strip() for v in value.split(",") if v.strip()]
    return [None]


def missing_part_error(args: list[str]) -> Optional[str]:
    """Why the command line sets a part of the config its experiment does not have (a server
    setting on an experiment that drives no server), or None. Composes only when such an
    override is on the command line, so a job without one pays nothing."""
    optional = {"server"}  # groups only some experiments compose (their files' defaults lists)
    asked = [(a, k) for a in args if (k := override_key(a)) in optional and not a.startswith("+")]
    if not asked:
        return None
    import hydra.errors

    for name in _experiments(args):
        try:
            have = phase_keys(name) if name else frozenset()
        except hydra.errors.HydraException:  # an unknown experiment: Hydra's own error says so
            return None
        lacking = [(a, k) for a, k in asked if k not in have]
        if lacking:
            arg, key = lacking[0]
            what = f"experiment={name}" if name else "the config without experiment=NAME"
            return (f"{arg}: {what} has no {key}: the {key} group is part only of the "
                    f"experiments that drive a server ({', '.join(with_part(key))}); drop the "
                    f"override (./multirun.sh passes {key}.* to its serving phases only)")
    return None


def with_part(key: str) -> list[str]:
    """The registered experiments whose config has `key` (for the error above)."""
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    return sorted(n for n in EXPERIMENT_SCHEMAS if key in phase_keys(n))
