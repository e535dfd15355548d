"""Hostile and malformed run folders (tests/hostile/corpus.py), each read by every reading
operation in a subprocess with a memory cap and a timeout (tests/hostile/harness.py): a hang,
a crash or a blow-up fails the batch it is in, naming the case, instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from tests.hostile.corpus import CASES

HARNESS = pathlib.Path(__file__).with_name("harness.py")
ROOT = HARNESS.parents[2]
# A few cases per process: one interpreter start for several, and a hang still names its case.
BATCHES = {
    "special files": ["meta_fifo", "steps_fifo", "meta_dev_zero", "steps_dev_zero",
                      "steps_socket", "streams_are_folders", "meta_is_a_folder", "chunk_fifo"],
    "escapes": ["run_folder_symlink_in_runs", "files_escape", "sidecar_escape",
                "symlinked_streams", "symlinked_rank"],
    "sizes": ["chunk_lies_about_rows", "chunk_header_claims_a_trillion",
              "chunk_values_disagree", "chunk_of_objects", "long_lines", "huge_meta"],
    "json": ["broken_lines", "deep_nesting", "bad_meta", "non_finite_values",
             "huge_numbers_in_meta", "param_types_in_meta"],
    "names and permissions": ["hostile_texts", "permissions"],
    "concurrent writers": ["concurrent_tearing", "concurrent_truncate_replace_delete"],
    "2,000 runs": ["many_runs"],
}  # fmt: skip
# Generous for a loaded 2-core machine; a hang is caught all the same.
TIMEOUT_S = 240


def test_every_case_is_in_a_batch() -> None:
    listed = [c for cases in BATCHES.values() for c in cases]
    assert sorted(listed) == sorted(CASES) and len(set(listed)) == len(listed)


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_hostile_runs_read_safely(batch: str, tmp_path: pathlib.Path) -> None:
    cases = BATCHES[batch]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, str(HARNESS), str(tmp_path), *cases],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            cwd=tmp_path,
        )
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, rc = "timed out", None
    reports = {r["case"]: r["problems"] for r in map(json.loads, out.splitlines())}
    missing = [c for c in cases if c not in reports]
    assert not missing, (
        f"case {missing[0]} did not finish (hang, crash or memory cap; exit {rc}): {err[-2000:]}"
    )
    assert rc == 0, err[-2000:]
    problems = {case: p for case, p in reports.items() if p}
    assert not problems, json.dumps(problems, indent=1)
