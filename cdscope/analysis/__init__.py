"""Numbers from numbers: spectral measures, noise-corrected Grams, statistics, uncertainty
and pass@k (SPEC §3, §4, §7). Pure numpy / pandas; no model, no torch."""
