"""A large upload through the Uploads API leaves the API process's memory flat (issue 28): a
real ``dprc serve`` subprocess takes a data set of ``DPRC_TEST_UPLOAD_MB`` MB (default 200) in
64 MiB parts from the official client's ``upload_file_chunked`` and completes it (parts
streamed to disk, assembled, validated and hashed line by line); the peak RSS of the server
(``VmHWM``, reset before the upload) grows by less than 64 MiB over its RSS before it.

Run it with a 2 GB data set: ``DPRC_TEST_UPLOAD_MB=2048 pytest tests/api/test_upload_memory.py``
(docs/api.md, "Uploads", gives the figures)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.serve_process import dprc_serve, proc_memory, server_pid

DPRC = [sys.executable, "-m", "dprc.cli"]
MiB = 1024**2
LIMIT = 64 * MiB
LINE = b'{"text": "example %09d of a large data set, written line by line for the test"}\n'


def _write_data_set(path: Path, size: int) -> int:
    """About ``size`` bytes of distinct text lines (~100 bytes each); their number."""
    n = written = 0
    with open(path, "wb") as fh:
        while written < size:
            line = LINE % n
            fh.write(line)
            written += len(line)
            n += 1
    return n


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_large_upload_keeps_the_api_rss_flat(tmp_path):
    size = int(os.environ.get("DPRC_TEST_UPLOAD_MB", "200")) * MiB
    data = tmp_path / "large.jsonl"
    n = _write_data_set(data, size)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRC_")}
    env.update(
        DPRC_DATA_DIR=str(tmp_path / "data"),
        DPRC_DEFAULT_EPSILON_BUDGET="8",
        DPRC_EMBEDDED_WORKER="false",
        DPRC_LOG_LEVEL="warning",
        HF_HUB_OFFLINE="1",
    )
    key = subprocess.run(
        [*DPRC, "keys", "create", "--tenant", "mem", "--role", "admin"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with dprc_serve(DPRC, env, tmp_path / "server.log") as url:
        pid = server_pid(int(url.rsplit(":", 1)[1]))
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=3600)
        small = tmp_path / "small.jsonl"
        _write_data_set(small, 64 * 1024)
        client.uploads.upload_file_chunked(  # warm up: the code paths are loaded
            file=small, mime_type="text/jsonl", purpose="fine-tune", part_size=16 * 1024
        )
        before = proc_memory(pid)["VmRSS"] * MiB
        try:  # the peak starts again from the current RSS
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:  # then the peak since start-up counts (an over-estimate)
            pass
        started = time.monotonic()
        done = client.uploads.upload_file_chunked(
            file=data, mime_type="text/jsonl", purpose="fine-tune", part_size=64 * MiB
        )
        seconds = time.monotonic() - started
        after = {k: v * MiB for k, v in proc_memory(pid).items()}
    assert done.status == "completed" and done.file is not None
    assert done.file.bytes == data.stat().st_size
    assert done.file.model_extra["n_examples"] == n
    growth = after["VmHWM"] - before
    print(
        f"\nupload of {data.stat().st_size / MiB:.0f} MiB ({n} lines) in {seconds:.1f} s; "
        f"API RSS before {before / MiB:.1f} MiB, peak during {after['VmHWM'] / MiB:.1f} MiB "
        f"(+{growth / MiB:.1f} MiB), after {after['VmRSS'] / MiB:.1f} MiB"
    )
    assert growth < LIMIT, growth
