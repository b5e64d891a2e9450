"""Teacher-forcing batches: tokenised (prompt, target) pairs, right-padded (SPEC §2).

Each sample is tokenised as ONE text, prompt + target, as the model reads running text;
the scored tokens are those covering any character of the target, found by character
offsets (a token straddling the seam is scored). Tokenising the two parts separately
would create splits the model never sees -- "\n" + "   " + " if" for "\n   " + " if"
at the start of an indented code target -- and distort l_m and C.

Only target tokens are scored: the logits at position ``t`` predict token ``t + 1``,
so the positions that predict target tokens are ``start - 1 .. length - 2`` where
``start`` is the first scored index.

Padding goes on the right and no attention mask is passed: under a causal mask a real
token never attends to a later position, so right padding cannot change any real
position's value (tested against unpadded single-sequence forwards). This keeps every
attention kernel on its fast causal path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cdscope.core.probes import ProbeItem
from cdscope.errors import CdscopeError, option
from cdscope.settings.names import TEMPLATES


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


def rows_per_forward(requested: int | None, device: torch.device | str) -> int | None:
    """Probe rows per forward pass: ``requested`` when given, else one row on CPU (no
    padding: measured ~30% faster than one padded batch on the embedded model, and the
    least memory for a double backward) and the whole batch (None) on an accelerator."""
    if requested is not None:
        return requested
    return 1 if torch.device(device).type == "cpu" else None


def row_chunks(
    B: int,
    batch_size: int | None,
    lengths: torch.Tensor | None = None,  # noqa: N803
) -> list[torch.Tensor]:
    """Row-index micro-batches of at most ``batch_size`` (None: one batch of all ``B``);
    rows of similar length go together (when ``lengths`` is given) so little compute is
    spent on padding."""
    order = (
        torch.argsort(lengths, descending=True, stable=True)
        if lengths is not None
        else torch.arange(B)
    )
    size = batch_size or B
    return [order[i : i + size] for i in range(0, B, size)]


def family_mean(per_row: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """Rows ``[B, ...]`` -> family means ``[M, ...]`` (on the CPU)."""
    sums = torch.zeros((batch.M, *per_row.shape[1:]), dtype=per_row.dtype)
    sums.index_add_(0, batch.row_family, per_row.cpu())
    return sums / batch.family_sizes().to(per_row.dtype).view(-1, *([1] * (per_row.dim() - 1)))


def mean_at_predicting_positions(
    values: torch.Tensor, batch: ProbeBatch, rows: torch.Tensor
) -> torch.Tensor:
    """``values`` ``[b, K, T]`` of ``rows`` -> ``[b, K]``: each row's mean over the
    positions that predict its target tokens (F of SPEC §2 when ``values`` are norms)."""
    local, pos, _ = batch.predicting_positions(rows)
    picked = values[local.to(values.device), :, pos.to(values.device)]  # [N, K]
    sums = torch.zeros(len(rows), values.shape[1], dtype=picked.dtype, device=picked.device)
    sums.index_add_(0, local.to(picked.device), picked)
    counts = torch.bincount(local, minlength=len(rows)).to(sums)
    return sums / counts[:, None]


def prompt_text(tokenizer: object, prompt: str, template: str) -> tuple[str, bool]:
    """``(text, add_special_tokens)``: the text the model reads before a target.

    ``plain``: the prompt itself, with the tokenizer's own special tokens (BOS) added.
    ``chat``: the chat template rendered as text with the generation prompt; the
    template writes its special tokens itself, so none are added (this is what
    ``apply_chat_template(tokenize=True)`` does).
    """
    if template not in TEMPLATES:
        raise CdscopeError(
            f"{option('template')} must be one of {', '.join(TEMPLATES)}; got {template!r}"
        )
    if template == "plain":
        return prompt, True
    if getattr(tokenizer, "chat_template", None) is None:
        raise CdscopeError(
            f"{option('template', 'chat')}: this model's tokenizer has no chat template; use "
            f"{option('template', 'plain')}"
        )
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return str(text), False


def prompt_ids(tokenizer: object, prompt: str, template: str = "plain") -> list[int]:
    """Token ids of the prompt alone (what generation continues from)."""
    text, special = prompt_text(tokenizer, prompt, template)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])  # type: ignore[operator]


def encode_scored(
    tokenizer: object, prompt: str, target: str, template: str = "plain", item_id: str = "?"
) -> tuple[list[int], int]:
    """``(ids, start)``: prompt + target tokenised as one text, and the first scored index.

    The scored tokens are ``ids[start:]``: every token that covers at least one
    character of the target (SPEC §2), so a token straddling the seam is scored. Read
    from the tokenizer's character offsets. Special tokens the tokenizer adds itself
    span no characters: a BOS is never scored, and an EOS some tokenizers append after
    the text is cut, so the scored tokens are the target's and nothing else.
    """
    prefix, special = prompt_text(tokenizer, prompt, template)
    if not target:
        raise CdscopeError(f"probe item {item_id!r}: the target is empty")
    seam = len(prefix)
    try:
        enc = tokenizer(  # type: ignore[operator]
            prefix + target,
            add_special_tokens=special,
            return_offsets_mapping=True,
        )
    except NotImplementedError as exc:  # Python ("slow") tokenizers have no offsets
        raise CdscopeError(
            "this tokenizer gives no character offsets (a slow tokenizer); load the model "
            "with a fast (tokenizers-backed) tokenizer to score targets as running text"
        ) from exc
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    # Offsets are monotone; tokens the tokenizer adds itself (BOS, EOS) span (0, 0).
    scored = [i for i, (_, end) in enumerate(offsets) if end > seam]
    if not scored:
        raise CdscopeError(f"probe item {item_id!r}: the target tokenises to nothing")
    start, stop = scored[0], scored[-1] + 1
    if start == 0:
        raise CdscopeError(
            f"probe item {item_id!r}: no prompt token precedes the target, so nothing predicts "
            "its first token; give the item a non-empty prompt"
        )
    return list(ids[:stop]), start


def encode_probe(
    items: Sequence[ProbeItem], tokenizer: object, template: str = "plain", pad_id: int = 0
) -> ProbeBatch:
    """Encode ``items`` (``encode_scored`` each) into one right-padded batch."""
    families: list[str] = []
    for item in items:
        if item.family not in families:
            families.append(item.family)
    rows, starts = [], []
    for item in items:
        ids, start = encode_scored(tokenizer, item.prompt, item.target, template, item.id)
        rows.append(ids)
        starts.append(start)
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
