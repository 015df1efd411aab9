"""The reference pages, generated from the code at every `mkdocs build` / `mkdocs serve`.

An MkDocs hook (mkdocs.yml: `hooks:`). Nothing here is written by hand twice:
- every key of an experiment, with its type, its default (as `experiment=NAME` composes it:
  interpolations shown as written, `${model.dtype}`) and its description, is read from the
  schema class the ConfigStore registers (k25exp.config.experiments: EXPERIMENT_SCHEMAS). A
  key's description is the comment on it in the source: a trailing `# ...` on its line, or the
  comment block right above it; a block above a run of fields also describes each later field
  of the run that it names (`lowest` and `highest` under "within [lowest, highest]");
  a field overridden without a comment keeps its parent's;
- each experiment's usage comes from its conf/experiment/NAME.yaml header, its place in the
  campaign and its MLflow headline columns from the schema's class variables;
- its metrics, with their definitions, from docs/metrics.yaml (what the runners log; the test
  tests/test_docs.py checks that every metric a real campaign logs has an entry there, and
  every key a description);
- model, hardware, server and tracking keys the same way, from k25exp.config.schema.

`python docs/hooks/reference.py [NAME]` prints a page (or the undocumented keys with
`--undocumented`) without MkDocs.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import sys
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parents[2]
METRICS_FILE = ROOT / "docs" / "metrics.yaml"
# The generated pages' place in the site (docs/ relative); mkdocs.yml's nav names the
# section, this hook fills it.
EXPERIMENTS_DIR = "experiments"
CONFIG_PAGE = "reference/configuration.md"
METRICS_PAGE = "reference/metrics.md"


# ---------------------------------------------------------------- keys and their comments

@dataclass
class Key:
    key: str  # dotted, under its group: "tokens", "slo.ttft_ms"
    type: str
    default: str  # the schema's default, as Python writes it ("MISSING": set by YAML)
    doc: str  # the comment on it; "" = none
    owner: str  # the class whose source declares it


@functools.lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """{field: comment} for the fields `cls` itself annotates, from its source."""
    try:
        lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    src = "".join(lines)
    # comments by line (1-based, relative to the class source)
    by_line: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    import textwrap

    tree = ast.parse(textwrap.dedent(src))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    prev_block: Optional[str] = None  # the block comment above the run of fields we are in
    prev_end = -1
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            prev_block, prev_end = None, -1
            continue
        name = node.target.id
        if "ClassVar" in ast.unparse(node.annotation):
            prev_block, prev_end = None, node.end_lineno
            continue
        trailing = by_line.get(node.end_lineno) if node.end_lineno in code_lines else None
        above, ln = [], node.lineno - 1
        while ln in by_line and ln not in code_lines:
            above.insert(0, by_line[ln])
            ln -= 1
        # a section marker ("-- kind vllm only --") heads what follows; not a description
        above = [a for a in above if not re.fullmatch(r"--.*--", a)]
        block = " ".join(above) or None
        adjacent = ln == prev_end  # no blank line between this field's comments and the last field
        doc = " ".join(x for x in (block, trailing) if x)
        if not doc and adjacent and prev_block and re.search(rf"\b{re.escape(name)}\b", prev_block):
            doc = prev_block
        out[name] = doc
        if block:
            prev_block = block
        elif not adjacent:
            prev_block = None
        prev_end = node.end_lineno
    return out


def comment(cls: type, name: str) -> tuple[str, str]:
    """(description, declaring class) of field `name`: the nearest class in the MRO that
    annotates it with a comment; else ("", the nearest that annotates it)."""
    owner = None
    for c in cls.__mro__:
        if name in c.__dict__.get("__annotations__", {}):
            owner = owner or c
            doc = _comments(c).get(name, "")
            if doc:
                return doc, c.__name__
    return "", owner.__name__ if owner else cls.__name__


def _type_name(cls: type, f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return t.replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    from omegaconf import MISSING

    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def _nested(cls: type, f: dataclasses.Field) -> Optional[type]:
    """The dataclass a field holds (fault: FaultConfig), else None."""
    hints = typing.get_type_hints(cls)  # each field's annotation in its own class's module
    t = hints.get(f.name)
    return t if dataclasses.is_dataclass(t) else None


def keys(cls: type, prefix: str = "") -> list[Key]:
    """Every config key of schema class `cls` (nested dataclasses as dotted keys), in
    declaration order; class variables are not keys. The root's groups are their own pages."""
    from k25exp.config.schema import K25Config

    out = []
    for f in dataclasses.fields(cls):
        if cls is K25Config and f.name in GROUPS:
            continue
        sub = _nested(cls, f)
        doc, owner = comment(cls, f.name)
        if sub is not None:
            out += keys(sub, f"{prefix}{f.name}.")
            continue
        d = _default(f)
        out.append(Key(prefix + f.name, _type_name(cls, f), "MISSING" if d == "???" else repr(d), doc, owner))
    return out


def undocumented(cls: type, prefix: str = "") -> list[str]:
    """Keys of `cls` without a description (the docs test fails on any)."""
    return [f"{prefix}{k.key} ({k.owner})" for k in keys(cls) if not k.doc]


GROUPS = ("model", "hardware", "tracking", "paths", "server", "experiment")


# ---------------------------------------------------------------- composed defaults

@functools.lru_cache(maxsize=None)
def composed(*overrides: str) -> dict:
    """The config `python -m k25exp <overrides>` composes, interpolations unresolved."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from k25exp.config.store import conf_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return dataclasses.MISSING
        d = d[part]
    return d


def _show(v: Any) -> str:
    if v is dataclasses.MISSING or v == "???":
        return "*required*"
    if v is None:
        return "`null`"
    if isinstance(v, str) and v.startswith("${"):
        return f"`{v}`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    text = repr(v) if not isinstance(v, (list, dict)) else _yaml_flow(v)
    return f"`{text}`"


def _yaml_flow(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_flow(x) for x in v) + "]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code_names(text: str) -> str:
    """A comment as Markdown: `<`, `>` escaped (they are not HTML), * kept."""
    return _cell(text.replace("<", "&lt;").replace(">", "&gt;"))


def keys_table(rows: Iterable[tuple[str, str, str, str]]) -> str:
    out = ["| key | type | default | description |", "|---|---|---|---|"]
    out += [f"| `{k}` | `{_cell(t)}` | {_cell(d)} | {_code_names(doc) or '**undocumented**'} |"
            for k, t, d, doc in rows]
    return "\n".join(out)


# ---------------------------------------------------------------- metrics (docs/metrics.yaml)

@functools.lru_cache(maxsize=None)
def metric_docs() -> dict[str, list[dict]]:
    """{experiment or "_every_run"/"_parent": [{metric, step, means}]}."""
    import yaml

    return yaml.safe_load(METRICS_FILE.read_text())


def pattern(metric: str) -> re.Pattern:
    """A documented metric name as a regex: `<x>` any name part, `{a,b}` one of them."""
    out, i = "", 0
    for m in re.finditer(r"<[^>]+>|\{[^}]+\}", metric):
        out += re.escape(metric[i:m.start()])
        tok = m.group(0)
        out += (r"[A-Za-z0-9_.\-]+?" if tok.startswith("<")
                else "(?:" + "|".join(re.escape(x.strip()) for x in tok[1:-1].split(",")) + ")")
        i = m.end()
    return re.compile(out + re.escape(metric[i:]) + "$")


def documented_metric(experiment: str, key: str) -> Optional[dict]:
    """The docs/metrics.yaml entry that covers metric `key` of `experiment` (its own
    section, then the sections it includes, then what every run logs), or None."""
    docs = metric_docs()
    for section in _sections(experiment):
        for entry in docs.get(section) or []:
            if pattern(str(entry["metric"])).match(key):
                return entry
    if experiment == "report":
        from k25exp.report import metrics as M

        f = next((f for f in report_figures() if f.key == key), None)
        if f is not None:
            return {"metric": f.key, "step": "—", "means": f.label}
        if key.startswith((M.SPEC_MEASURED, M.SPEC_PROJECTED)):
            return {"metric": key, "step": "—", "means": "speculative decoding, per setting"}
    return None


def _sections(experiment: str) -> list[str]:
    docs = metric_docs()
    out, todo = [], [experiment]
    while todo:
        s = todo.pop(0)
        if s in out:
            continue
        out.append(s)
        todo += (docs.get("_includes") or {}).get(s, [])
    return out + ["_every_run"]


def metrics_table(section: str) -> str:
    rows = metric_docs().get(section) or []
    out = ["| metric | step | definition |", "|---|---|---|"]
    out += [f"| `{_cell(str(r['metric']))}` | {_cell(str(r.get('step') or ''))} | {_code_names(str(r['means']).strip())} |"
            for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------- pages

def _yaml_header(path: Path) -> str:
    """The comment block at the top of a conf/experiment file, as text (usage lines as code)."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    # prose lines joined into paragraphs, indented lines (usage) as code blocks, in file order
    blocks: list[tuple[bool, list[str]]] = []
    for ln in lines:
        is_code = ln.startswith("  ")
        if not blocks or blocks[-1][0] != is_code:
            blocks.append((is_code, []))
        blocks[-1][1].append(ln[2:] if is_code else ln.strip())
    out = []
    for is_code, text in blocks:
        if is_code:
            out.append("```bash\n" + "\n".join(text) + "\n```")
        elif " ".join(text).strip():
            out.append(" ".join(t for t in text if t))
    return "\n\n".join(out)


def experiment_files(name: str) -> list[Path]:
    """conf/experiment/*.yaml files that compose into experiment `name` (gemm_full is a gemm)."""
    from k25exp.config.store import conf_dir

    out = []
    for p in sorted((conf_dir() / "experiment").glob("*.yaml")):
        if f"/schema/experiment@experiment: {name}\n" in p.read_text() + "\n":
            out.append(p)
    return out


def experiment_page(name: str) -> str:
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    cls = EXPERIMENT_SCHEMAS[name]
    files = experiment_files(name)
    main = next((p for p in files if p.stem == name), files[0] if files else None)
    values = composed(f"experiment={main.stem}", *cls.example_overrides) if main else {}
    doc = inspect.cleandoc(cls.__doc__ or "")
    out = [f"# `experiment={name}`", "", doc, ""]
    if main is not None:
        out += [_yaml_header(main), ""]
    facts = [f"- schema: `{cls.__module__}.{cls.__name__}`; runner: `{_show_plain(_default_of(cls, '_target_'))}`"]
    if cls.campaign_order is not None:
        facts.append(f"- a phase of `./multirun.sh`'s campaign (run {_ordinal(cls.campaign_order)})"
                     + (f", swept over `{cls.campaign_sweep}`" if cls.campaign_sweep else ""))
    else:
        facts.append("- not a phase of `./multirun.sh`")
    state = ui_view_state(name)
    if state:
        cols = [c.split(".", 1)[1].strip("`") for c in state["selectedColumns"][1:]
                if not c.startswith("attributes.")]
        facts.append("- its row in `k25exp ui`'s runs view ([the MLflow UI](../compare.md#the-mlflow-ui-k25exp-ui)): "
                     + ", ".join(f"`{c}`" for c in cols))
    facts.append("- a killed job's figures: " + (f"recomputed by `{cls.recover}`" if cls.recover
                                                  else _code_names(cls.no_recovery)))
    facts.append("- `k25exp compare` tests: " + (f"the samples in {', '.join(f'`{a}`' for a in cls.sample_artifacts)}"
                                                 if cls.samples else _code_names(cls.no_samples)))
    if cls.example_overrides:
        facts.append("- needs: " + " ".join(f"`{o}`" for o in cls.example_overrides))
    others = [p for p in files if p is not main]
    if others:
        facts.append("- also: " + ", ".join(f"`experiment={p.stem}` ({_yaml_header(p).split(chr(10))[0] or 'a variant'})"
                                            for p in others))
    first = next(k.key for k in keys(cls) if k.key not in ("name", "_target_", "warmup", "limit_points"))
    out += facts + ["", "## Keys", "",
                    f"Under `experiment.` (e.g. `experiment.{first}=...`). Default: what "
                    f"`experiment={main.stem if main else name}` composes on the embedded default "
                    "(`${...}`: an interpolation, resolved when the job runs).", ""]
    rows = []
    for k in keys(cls):
        if k.key in ("name", "_target_"):
            continue
        rows.append((k.key, k.type, _show(_get(values.get("experiment", {}), k.key)), k.doc))
    out += [keys_table(rows), "", "## Metrics", "",
            "What a run logs to MLflow (step: the quantity a metric is logged against; `<x>`: "
            "one metric per value; `{a,b}`: each of them). Every run also logs the metrics in "
            f"[every run](../{METRICS_PAGE}#every-run).", ""]
    if metric_docs().get(name):
        out += [metrics_table(name)]
    for inc in (metric_docs().get("_includes") or {}).get(name, []):
        out += ["", INCLUDED.get(inc, f"And what [`{inc}`]({inc}.md#metrics) logs:"), "", metrics_table(inc)]
    if name == "report":
        out += ["", "The report's figures as `k25exp/report/metrics.py` declares them (key, the label "
                "the report prints, unit):", "", report_figures_table()]
    return "\n".join(out) + "\n"


INCLUDED = {"_breakdown": "The trace analyser's figures ([the trace analyser](../traces.md)):"}


def report_figures() -> list:
    """The report's declared figures (k25exp.report.metrics.FIGURES) that are logged."""
    from k25exp.report import metrics as M

    return [f for f in M.FIGURES if f.key]


def report_figures_table() -> str:
    out = ["| metric | label | unit |", "|---|---|---|"]
    out += [f"| `{f.key}` | {_code_names(f.label)} | {_cell(f.unit)} |" for f in report_figures()]
    return "\n".join(out)


def has_metric_docs(name: str) -> bool:
    """An experiment's metrics are documented: its own section, or sections it includes."""
    return bool(metric_docs().get(name) or (metric_docs().get("_includes") or {}).get(name))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def ui_view_state(name: str) -> Optional[dict]:
    from k25exp.tracking import ui_view

    return ui_view.state_for(f"k25exp/{name}")


def _default_of(cls: type, name: str) -> Any:
    return cls.__dataclass_fields__[name].default


def _show_plain(v: Any) -> str:
    return str(v)


def experiments_index() -> str:
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    rows = ["| experiment | campaign phase | what it measures |", "|---|---|---|"]
    for name in experiment_names():
        cls = EXPERIMENT_SCHEMAS[name]
        first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        rows.append(f"| [`{name}`]({name}.md) | {cls.campaign_order if cls.campaign_order is not None else '—'} "
                    f"| {_code_names(first)} |")
    return "\n".join(rows)


def experiment_names() -> list[str]:
    from k25exp.config.experiments import EXPERIMENT_SCHEMAS

    order = lambda n: (EXPERIMENT_SCHEMAS[n].campaign_order or 99, n)  # noqa: E731
    return sorted(EXPERIMENT_SCHEMAS, key=order)


CONFIG_GROUPS = (("model", "ModelConfig", "model=kimi_k25_int4", "conf/model/"),
                 ("hardware", "HardwareConfig", "hardware=cpu_local", "conf/hardware/"),
                 ("server", "ServerConfig", "server=vllm", "conf/server/"),
                 ("tracking", "TrackingConfig", "tracking=mlflow", "conf/tracking/"),
                 ("paths", "PathsConfig", "", "conf/config.yaml"))


def config_classes() -> list[tuple[str, type]]:
    from k25exp.config import schema

    return [(g, getattr(schema, c)) for g, c, _, _ in CONFIG_GROUPS] + [("", schema.K25Config)]


def config_page() -> str:
    from k25exp.config.store import conf_dir

    values = composed("experiment=macro")
    out = ["# Configuration reference", "",
           "Every key of the groups every job has, generated from the schema dataclasses in "
           "`k25exp/config/schema.py` (Hydra's ConfigStore checks keys and types against them at "
           "compose time). Defaults: what `python -m k25exp experiment=macro` composes on the "
           "embedded default (`${...}`: an interpolation). Experiment keys: [Experiments]"
           "(../experiments/index.md).", ""]
    for group, cls in config_classes():
        title = f"`{group}.`" if group else "the root"
        files = ""
        if group and (conf_dir() / group).is_dir():
            names = sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
            files = " Choices: " + ", ".join(f"`{group}={n}`" for n in names) + "."
        doc = inspect.cleandoc(cls.__doc__ or "").replace("\n", " ")
        out += [f"## {title}", "", (doc + files).strip(), ""]
        rows = []
        for k in keys(cls):
            full = f"{group}.{k.key}" if group else k.key
            rows.append((full, k.type, _show(_get(values, full)), k.doc))
        out += [keys_table(rows), ""]
    return "\n".join(out)


def metrics_page() -> str:
    out = ["# Metrics", "",
           "Every metric k25exp logs, by experiment, with its definition (from `docs/metrics.yaml`; "
           "`tests/test_docs.py` fails when a run of the campaign logs a metric without an entry).", "",
           "## Every run", "", metrics_table("_every_run"), "",
           "## A multirun's parent run", "", metrics_table("_parent"), ""]
    for name in experiment_names():
        out += [f"## {name}", "", f"See [`experiment={name}`](../{EXPERIMENTS_DIR}/{name}.md#metrics).", ""]
    return "\n".join(out)


def pages() -> dict[str, str]:
    """{docs-relative path: Markdown} of every generated page."""
    out = {f"{EXPERIMENTS_DIR}/{n}.md": experiment_page(n) for n in experiment_names()}
    out[CONFIG_PAGE] = config_page()
    out[METRICS_PAGE] = metrics_page()
    return out


# ---------------------------------------------------------------- the MkDocs hook

def _index_with_table(text: str) -> str:
    return text.replace("<!-- experiments table -->", experiments_index())


def on_config(config, **kwargs):
    """The Experiments section of the nav gets one page per registered experiment."""
    for item in config.nav or []:
        if isinstance(item, dict) and "Experiments" in item:
            item["Experiments"] = [f"{EXPERIMENTS_DIR}/index.md"] + [
                {n: f"{EXPERIMENTS_DIR}/{n}.md"} for n in experiment_names()]
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def on_page_markdown(markdown, page, **kwargs):
    if page.file.src_uri == f"{EXPERIMENTS_DIR}/index.md":
        return _index_with_table(markdown)
    return markdown


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    args = sys.argv[1:]
    if args[:1] == ["--undocumented"]:
        from k25exp.config.experiments import EXPERIMENT_SCHEMAS

        for n, c in EXPERIMENT_SCHEMAS.items():
            for k in undocumented(c):
                print(f"experiment={n}: {k}")
        for g, c in config_classes():
            for k in undocumented(c, f"{g}." if g else ""):
                print(k)
    elif args:
        print(pages()[args[0]] if "/" in args[0] else experiment_page(args[0]))
    else:
        print("\n".join(pages()))
