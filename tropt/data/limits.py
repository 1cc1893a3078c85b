"""How much of a split a scan reads and keeps. Read as ``limits.NAME`` when used, so a test may lower one."""

from __future__ import annotations

CHUNK_ROWS = 250_000  # rows per chunk when streaming files
SAMPLE_ROWS = 20_000  # rows kept per split for the single-feature models
NUMERIC_MAX_CELLS = 200_000_000  # numeric matrix kept for near-duplicate search up to this many cells per split
# A scan that reads everything once (a diagnose session, a file) keeps the numeric matrix, unasked, only up to this
# many rows per split: data.near_duplicates' exact-search limit. Above it that check reads the split again for its
# matrix (searched with an approximate index), and other checks need not hold the matrix (float32, rows x numeric
# columns: 750 MB at 4M x 47), which was most of a large table's peak memory.
EAGER_NUMERIC_ROWS = 200_000
TEXT_PREVIEW = 80  # characters of each row's normalised text kept for near-duplicate evidence
TEXT_MAX_ROWS = 200_000  # text columns are vectorised (uint8 trigram counts) for splits up to this many rows
