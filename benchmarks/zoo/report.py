"""The zoo's Markdown report: the PyTorch 2 paper's Table 1 for the zoo, and the capture gaps.

``python -m benchmarks.zoo.report FOLDER [--docs docs/zoo.md]`` merges every ``zoo*.json`` in
FOLDER (one per shard of a run) and writes ``zoo.md`` there, and the docs page if asked.
:func:`merge` puts the rows of a later run of some models in place of theirs, noting that run
(models, versions, command) in the meta, so the report says which rows came from it. The
report has the totals (models with one graph and no break, eval and train, Kiln against
torch.compile from the same run), the gaps ranked by how many models hit each (a break's kind
and its explanation with numbers and addresses normalised, and each reason capture gave up on a
whole frame), then one row per model and the models skipped with why.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path
from typing import Any

__all__ = ["load", "merge", "render", "write"]

_MODES = ("eval", "train")
_COMPILERS = ("kiln", "torch.compile")
_EXAMPLES = 4
_VERSIONS = ("kiln", "torch", "timm", "transformers", "python")

DOCS_INTRO = """\
# Model zoo: capture breadth

Kiln and `torch.compile` on one small model per [timm](https://github.com/huggingface/pytorch-image-models)
family and per [transformers](https://github.com/huggingface/transformers) architecture
(random weights, tiny configs, CPU, the `eager` backend of each: capture alone is measured),
in eval and train mode, in the same run. This is the PyTorch 2 paper's Table 1 for the zoo: a
model counts as *one graph* when its forward became a single graph with no graph break, no
frame left to run eagerly, and eager's outputs (and, in train mode, parameter gradients) over
several calls with fresh inputs. A frame `torch.compile` skips (after a graph break inside a
loop it runs the whole frame eagerly, compiling only the calls it makes) counts as a frame run
eagerly, as a frame Kiln gives up on does; its graph and break counters alone do not show it.

The inputs are small: a batch of 2; 16 tokens; 64-pixel images for timm where the model
allows it, else its own size; transformers' vision configs shrunk to 32-pixel images. Dropout
and train-time masking are off in the configs and the RNGs are reseeded before every step, so
eager and compiled runs compare within a relative error of 1e-3; each model runs three calls
with fresh inputs.

Reproduce it with `nox -s zoo` (or `python -m benchmarks.zoo --workers N`; `--only 'hf:*bert*'`
narrows it); the raw results are in `benchmarks/results/<kiln version>/zoo/`.
`--merge-into FOLDER` re-runs the `--only` models and puts their rows in place of theirs in an
earlier run's results; the report then names the models re-run, with their versions.

"""


def load(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The merged meta and rows of every ``zoo*.json`` in ``folder``."""
    meta: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    reruns: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("zoo*.json")):
        data = json.loads(path.read_text())
        meta = {**data["meta"], **meta} if meta else dict(data["meta"])
        for row in data["rows"]:
            if row["status"] != "not run" or row["id"] not in rows:
                rows[row["id"]] = row
        for rerun in data["meta"].get("reruns", []):  # one re-run may span several shards
            key = json.dumps({k: v for k, v in rerun.items() if k != "models"}, sort_keys=True)
            seen = reruns.setdefault(key, {**rerun, "models": []})
            seen["models"] = sorted({*seen["models"], *rerun["models"]})
    if reruns:
        meta["reruns"] = list(reruns.values())
    return meta, sorted(rows.values(), key=lambda r: r["id"])


def merge(folder: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Put ``rows``, a later run of some models (``meta``: its versions and command), in place
    of those models' rows in ``folder``'s ``zoo*.json``, and note that run in the meta of each
    file it changes; a model no file holds joins the last file. Models the run did not reach
    (its time budget) keep their rows."""
    fresh = {r["id"]: r for r in rows if r["status"] != "not run"}
    paths = sorted(folder.glob("zoo*.json"))
    if not paths:
        msg = f"{folder} holds no zoo*.json to merge into; run the zoo with --out there first"
        raise FileNotFoundError(msg)
    files = {path: json.loads(path.read_text()) for path in paths}
    held = {r["id"] for data in files.values() for r in data["rows"]}
    files[paths[-1]]["rows"] += [r for m, r in fresh.items() if m not in held]
    for path, data in files.items():
        models = [r["id"] for r in data["rows"] if r["id"] in fresh]
        if not models:
            continue
        data["rows"] = [fresh.get(r["id"], r) for r in data["rows"]]
        note = {**{k: v for k, v in meta.items() if k != "reruns"}, "models": models}
        data["meta"].setdefault("reruns", []).append(note)
        path.write_text(json.dumps(data, indent=1))


def _normalise(text: str) -> str:
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", text.split("\n", 1)[0])
    text = re.sub(r"\d+", "N", text)
    text = text.replace("|", "/").replace("`", "'").strip()
    return text[:160] + ("…" if len(text) > 160 else "")


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ").replace("`", "'")


def _short(where: str) -> str:
    """A library file's path from its package (``transformers/models/...``), not the venv."""
    return re.sub(r"^.*/(site|dist)-packages/", "", where)


def _outcome(row: dict[str, Any], compiler: str, mode: str) -> dict[str, Any] | None:
    for o in row["outcomes"]:
        if o["compiler"] == compiler and o["mode"] == mode:
            return o  # type: ignore[no-any-return]
    return None


def _counted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Models that were built and ran in eager (skipped ones are listed, not counted)."""
    return [r for r in rows if r["status"] not in ("skipped", "not run")]


def _show(o: dict[str, Any] | None) -> str:
    if o is None:
        return "-"
    gave_up = len(o.get("gave_up", []))
    text = f"{o.get('graphs', 0)} / {o.get('breaks', 0)}" + (f" +{gave_up}e" if gave_up else "")
    if o.get("error"):
        return text + " ✗ error"
    if o.get("compiled_path"):
        return text + " ✓ (compiled path)"
    return text + (" ✓" if o.get("matches") else f" ✗ {o.get('max_error', 0):.0e}")


def _totals(rows: list[dict[str, Any]]) -> list[str]:
    runs = _counted(rows)
    head = "| | " + " | ".join(f"{m}: {c}" for m in _MODES for c in _COMPILERS) + " |"
    lines = [head, "|---" * 5 + "|"]

    def line(label: str, fn: Any) -> str:
        cells = []
        for m in _MODES:
            for c in _COMPILERS:
                outs = [o for r in runs if (o := _outcome(r, c, m)) is not None]
                cells.append(str(fn(outs)))
        return f"| {label} | " + " | ".join(cells) + " |"

    lines.append(line("models run", len))
    lines.append(line("**one graph, no break**", lambda os: sum(o["one_graph"] for o in os)))
    lines.append(line("matches eager", lambda os: sum(bool(o.get("matches")) for o in os)))
    lines.append(
        line("errors, timeouts, crashes", lambda os: sum(bool(o.get("error")) for o in os))
    )
    lines.append(line("graphs (sum)", lambda os: sum(o.get("graphs", 0) for o in os)))
    lines.append(line("graph breaks (sum)", lambda os: sum(o.get("breaks", 0) for o in os)))
    lines.append(
        line("frames run eagerly (sum)", lambda os: sum(len(o.get("gave_up", [])) for o in os))
    )
    for source in ("timm", "hf"):
        part = [r for r in runs if r["id"].startswith(source + ":")]
        cells = []
        for m in _MODES:
            for c in _COMPILERS:
                outs = [o for r in part if (o := _outcome(r, c, m)) is not None]
                cells.append(f"{sum(o['one_graph'] for o in outs)} / {len(outs)}")
        lines.append(f"| one graph: {source} | " + " | ".join(cells) + " |")
    return lines


def _gaps(rows: list[dict[str, Any]], compiler: str) -> list[str]:
    models: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    hits: collections.Counter[tuple[str, str]] = collections.Counter()
    examples: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for r in _counted(rows):
        for o in r["outcomes"]:
            if o["compiler"] != compiler:
                continue
            found = [(s["kind"], s) for s in o.get("sites", [])]
            found += [(f"gave up: {g['kind']}", g) for g in o.get("gave_up", [])]
            # a failure the other compiler shares is the model's or the zoo's, not capture's
            other = _outcome(r, _COMPILERS[compiler == "kiln"], o["mode"])
            shared = " (both compilers)" if other is not None and not other.get("matches") else ""
            if o.get("error"):
                err = {"explanation": o["error"], "where": ""}
                found.append(("error" + shared, err))
            elif o.get("compiled_path"):
                why = "matches eager only as torch.compiler.is_compiling() True makes it compute"
                found.append(("library's compiled path", {"explanation": why, "where": ""}))
            elif not o.get("matches"):
                found.append(
                    ("differs from eager" + shared, {"explanation": o["mode"], "where": ""})
                )
            for kind, site in found:
                key = (kind, _normalise(site.get("explanation", "")))
                hits[key] += 1
                name = f"{r['id']} ({o['mode']})"
                if r["id"] not in models[key] and len(examples[key]) < _EXAMPLES:
                    where = _cell(_short(site.get("where", "")))
                    source = _cell(site.get("source", ""))[:80]
                    at = f" at `{where}`" if where else ""
                    examples[key].append(name + at + (f": `{source}`" if source else ""))
                models[key].add(r["id"])
    ranked = sorted(models, key=lambda k: (-len(models[k]), -hits[k], k))
    lines = ["| # | models | hits | kind | explanation | examples |", "|---|---|---|---|---|---|"]
    for i, key in enumerate(ranked, 1):
        kind, text = key
        lines.append(
            f"| {i} | {len(models[key])} | {hits[key]} | {_cell(kind)} | {text} | "
            + "<br>".join(examples[key])
            + " |"
        )
    return lines


def _behind(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | mode | Kiln | torch.compile |", "|---|---|---|---|"]
    for r in _counted(rows):
        for m in _MODES:
            k, t = _outcome(r, "kiln", m), _outcome(r, "torch.compile", m)
            if k is not None and t is not None and t["one_graph"] and not k["one_graph"]:
                lines.append(f"| {r['id']} | {m} | {_show(k)} | {_show(t)} |")
    return lines


def _reruns(meta: dict[str, Any]) -> list[str]:
    """A line per later run merged into this one: its models, and its versions where they
    differ from the first run's."""
    lines = []
    for note in meta.get("reruns", []):
        differ = [f"{k} {note[k]}" for k in _VERSIONS if k in note and note[k] != meta.get(k)]
        env = ", ".join(differ) if differ else "the same versions"
        lines.append(
            f"Re-run later and merged in: {', '.join(note['models'])} ({env}; "
            f"{note.get('cpus', '?')} CPUs; `{_cell(note.get('command', ''))}`); their rows "
            "below come from that run.\n"
        )
    return lines


def render(meta: dict[str, Any], rows: list[dict[str, Any]], intro: str = "") -> str:
    """The report's Markdown."""
    counted = _counted(rows)
    skipped = [r for r in rows if r["status"] == "skipped"]
    not_run = [r for r in rows if r["status"] == "not run"]
    out = [intro or "# Model zoo report\n"]
    versions = ", ".join(f"{k} {meta[k]}" for k in _VERSIONS if k in meta)
    out.append(
        f"Run: {versions}; {meta.get('cpus', '?')} CPUs. "
        f"{len(counted)} models counted "
        f"({sum(r['id'].startswith('timm:') for r in counted)} timm families, "
        f"{sum(r['id'].startswith('hf:') for r in counted)} transformers architectures); "
        f"{len(skipped)} skipped (they could not be built or their eager forward failed)"
        + (f"; {len(not_run)} not run in this run's time budget" if not_run else "")
        + ".\n"
    )
    out += _reruns(meta)
    out += ["## Totals\n", *_totals(rows), ""]
    out.append(
        "A cell below is *graphs / graph breaks*, `+Ne` when N frames ran eagerly because "
        "capture gave up on them whole, then ✓ when outputs (and gradients) match eager, else "
        "✗ with the worst relative error or the error.\n"
    )
    out += ["## Kiln's gaps, ranked by models hit\n"]
    out.append(
        "Every graph break (kind and explanation), every reason capture gave up on a whole "
        "frame (`gave up: ...`), and every error or mismatch, counted once per model; the "
        "examples give the user's source line.\n"
    )
    out += [*_gaps(rows, "kiln"), ""]
    out += ["## Where torch.compile has one graph and Kiln has not\n", *_behind(rows), ""]
    out += [
        "## torch.compile's graph breaks, ranked by models hit\n",
        *_gaps(rows, "torch.compile"),
        "",
    ]
    rerun = {m for note in meta.get("reruns", []) for m in note["models"]}
    out += ["## Per model\n"]
    head = "| model | variant | params | " + " | ".join(
        f"{m}: {c}" for m in _MODES for c in _COMPILERS
    )
    out += [head + " |", "|---" * 7 + "|"]
    for r in counted:
        cells = [_show(_outcome(r, c, m)) for m in _MODES for c in _COMPILERS]
        status = "" if r["status"] == "ok" else f" ({r['status']})"
        status += " (re-run)" if r["id"] in rerun else ""
        out.append(
            f"| {r['id']}{status} | {r.get('variant', '')} | {r.get('params', '')} | "
            + " | ".join(cells)
            + " |"
        )
    out += ["", "## Skipped\n", "| model | reason |", "|---|---|"]
    for r in skipped:
        out.append(f"| {r['id']} | {_cell(r.get('reason', ''))[:300]} |")
    if not_run:
        out += ["", "Not run (time budget): " + ", ".join(r["id"] for r in not_run)]
    return "\n".join(out) + "\n"


def write(folder: Path, docs: Path | None = None) -> None:
    """Write ``folder/zoo.md`` from the run's JSON, and the docs page at ``docs`` if given."""
    meta, rows = load(folder)
    (folder / "zoo.md").write_text(render(meta, rows))
    if docs is not None:
        docs.write_text(render(meta, rows, DOCS_INTRO))


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("folder", type=Path)
    p.add_argument("--docs", type=Path, default=None)
    a = p.parse_args(sys.argv[1:])
    write(a.folder, a.docs)
