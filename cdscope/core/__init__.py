"""The measuring core: probe pools and batches, the gates on residual writes, C and F,
the regulariser gradient, edge attribution and sampling (SPEC §1, §2, §5, §6)."""
