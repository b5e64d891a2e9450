"""Task input and output: task files in cdscope's format and the benchmarks people bring,
and the contamination audit of an evaluation set against training and probe data.

* ``format``        -- load / check / write task files, the shipped sets' paths, probe
  items as tasks (the ``Task`` record itself is ``cdscope.tasks.record``)
* ``readers``       -- JSONL / Parquet / ``datasets`` folders in GSM8K, MATH, HumanEval,
  MBPP columns, column mappings
* ``contamination`` -- evaluation items also found in training tasks or probe pools

This face is the package's one door for the rest of cdscope; names load on first use.
"""

from __future__ import annotations

from cdscope.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        (
            "FAMILIES",
            "SPLITS",
            "check_task",
            "default_task_paths",
            "dumps_tasks",
            "load_task_sources",
            "load_tasks",
            "probe_verifier_kind",
            "task_from_probe_item",
            "write_tasks",
        ),
        "cdscope.tasks.io.format",
    ),
    **dict.fromkeys(("split_source", "with_mapping"), "cdscope.tasks.io.readers"),
    **dict.fromkeys(
        (
            "audit",
            "benchmark_of",
            "benchmark_sources",
            "items_from_pool",
            "items_from_tasks",
            "reference_sets",
        ),
        "cdscope.tasks.io.contamination",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
