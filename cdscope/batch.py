"""Teacher-forcing batches: tokenised (prompt, target) pairs, right-padded (SPEC §2).

Only target tokens are scored: with the sequence ``prompt ++ target``, the logits at
position ``t`` predict token ``t + 1``, so the positions that predict target tokens are
``start - 1 .. length - 2`` where ``start`` is the first target index.

Padding goes on the right and no attention mask is passed: under a causal mask a real
token never attends to a later position, so right padding cannot change any real
position's value (tested against unpadded single-sequence forwards). This keeps every
attention kernel on its fast causal path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cdscope.errors import CdscopeError
from cdscope.probes import ProbeItem

TEMPLATES = ("plain", "chat")


@dataclass
class ProbeBatch:
    """A padded batch plus the (row, position, label) triples that score the targets."""

    input_ids: torch.Tensor  # [B, T] long, right-padded
    lengths: torch.Tensor  # [B] real lengths
    target_start: torch.Tensor  # [B] index of the first target token
    families: list[str]  # the M families, in row-group order
    row_family: torch.Tensor  # [B] index into families
    item_ids: list[str]

    @property
    def B(self) -> int:  # noqa: N802
        return self.input_ids.shape[0]

    @property
    def M(self) -> int:  # noqa: N802
        return len(self.families)

    def family_sizes(self) -> torch.Tensor:
        return torch.bincount(self.row_family, minlength=self.M)

    def predicting_positions(
        self, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For batch rows ``rows``: (local row index, position, label) of every scored token."""
        local, pos = [], []
        for i, b in enumerate(rows.tolist()):
            span = torch.arange(int(self.target_start[b]) - 1, int(self.lengths[b]) - 1)
            local.append(torch.full_like(span, i))
            pos.append(span)
        local_t, pos_t = torch.cat(local), torch.cat(pos)
        labels = self.input_ids[rows][local_t, pos_t + 1]
        return local_t.to(self.input_ids.device), pos_t.to(self.input_ids.device), labels

    def to(self, device: torch.device) -> ProbeBatch:
        self.input_ids = self.input_ids.to(device)
        return self


def _prompt_ids(tokenizer: object, prompt: str, template: str) -> list[int]:
    if template == "plain":
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])  # type: ignore[operator]
    if getattr(tokenizer, "chat_template", None) is None:
        raise CdscopeError(
            "--template chat: this model's tokenizer has no chat template; use --template plain"
        )
    messages = [{"role": "user", "content": prompt}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def encode_probe(
    items: Sequence[ProbeItem], tokenizer: object, template: str = "plain", pad_id: int = 0
) -> ProbeBatch:
    """Tokenise prompt and target separately (so target tokens are exactly the target's)."""
    if template not in TEMPLATES:
        raise CdscopeError(f"--template must be one of {', '.join(TEMPLATES)}; got {template!r}")
    families: list[str] = []
    for item in items:
        if item.family not in families:
            families.append(item.family)
    rows, starts = [], []
    for item in items:
        prompt = _prompt_ids(tokenizer, item.prompt, template)
        target = list(tokenizer(item.target, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        if not prompt or not target:
            raise CdscopeError(f"probe item {item.id!r}: prompt or target tokenises to nothing")
        rows.append(prompt + target)
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = torch.tensor(row)
    return ProbeBatch(
        input_ids=input_ids,
        lengths=torch.tensor([len(r) for r in rows]),
        target_start=torch.tensor(starts),
        families=families,
        row_family=torch.tensor([families.index(item.family) for item in items]),
        item_ids=[item.id for item in items],
    )
