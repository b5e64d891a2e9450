"""The Task record: one verifiable task and the keys its JSONL object may carry.

The bottom of ``cdscope.tasks``: the verifiers, the code harness and the sandbox use
the record; ``format`` reads and writes it (docs/tasks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

REQUIRED_KEYS = ("id", "family", "prompt", "verifier")
OPTIONAL_KEYS = ("answer", "tests", "entry_point", "source", "meta")
CODE_KEYS = ("tests", "entry_point")
PROGRAM_KIND = "code:program"  # the completion alone is the program (prose prompts, MBPP)


@dataclass(frozen=True)
class Task:
    """One verifiable task: a prompt and what a correct completion must satisfy."""

    id: str
    family: str
    prompt: str
    verifier: str
    answer: str | None = None
    tests: str | None = None
    entry_point: str | None = None
    source: str | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def to_record(self) -> dict:
        """The JSON object of this task (``None`` fields and an empty meta left out)."""
        record: dict = {k: getattr(self, k) for k in (*REQUIRED_KEYS, *OPTIONAL_KEYS[:-1])}
        record = {k: v for k, v in record.items() if v is not None}
        if self.meta:
            record["meta"] = self.meta
        return record


def is_code_kind(kind: str) -> bool:
    """Code kinds (``code`` or ``code:<variant>``) execute tests in the sandbox."""
    return kind == "code" or kind.startswith("code:")


def required_fields(kind: str) -> tuple[str, ...]:
    """The keys a task of verifier ``kind`` must carry besides the always-required ones."""
    return CODE_KEYS if is_code_kind(kind) else ("answer",)
