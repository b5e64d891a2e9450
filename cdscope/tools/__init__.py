"""Developer tools over the whole stack, never imported by the library (the top tier of
docs/ARCHITECTURE.md): ``tiny`` (tiny random models of any causal-LM type, for the
tests, the benchmarks and the coverage run), ``coverage`` and ``coverage_page`` (every
causal-LM type of transformers measured -> docs/architectures.md)."""
