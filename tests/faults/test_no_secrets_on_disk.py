"""meta.json's command line has the values of secret-looking options redacted."""

from __future__ import annotations

import json
import sys

import pytest
from tests.helpers import mlp

import nbmonitor
from nbmonitor.live.redact import REDACTED, redact_argv

SECRET = "s3cr3t-value-42"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--token=X"], ["--token=<redacted>"]),
        (["--TOKEN", "X"], ["--TOKEN", "<redacted>"]),
        (["--api-key", "X", "--lr", "3"], ["--api-key", "<redacted>", "--lr", "3"]),
        (["--hf_token=X", "--epochs=3"], ["--hf_token=<redacted>", "--epochs=3"]),
        (["--client-secret", "X"], ["--client-secret", "<redacted>"]),
        (["--DB-Password=X"], ["--DB-Password=<redacted>"]),
        (["wandb.api_key=X"], ["wandb.api_key=<redacted>"]),
        (["WANDB_API_KEY=X"], ["WANDB_API_KEY=<redacted>"]),
        (["--url", "https://me:X@host/x"], ["--url", "https://<redacted>@host/x"]),
        (["--token", "--verbose"], ["--token", "--verbose"]),  # a flag, not a value
        (["--pass", "X"], ["--pass", "<redacted>"]),
        (["--db-pwd=X"], ["--db-pwd=<redacted>"]),
        (["--auth", "X"], ["--auth", "<redacted>"]),
        (["--credentials-file=X"], ["--credentials-file=<redacted>"]),
        (["redis://:X@host:6379/0"], ["redis://<redacted>@host:6379/0"]),
        (["https://X@github.com/o/r.git"], ["https://<redacted>@github.com/o/r.git"]),
        (["--data=s3://X@bucket/k"], ["--data=s3://<redacted>@bucket/k"]),
        (["--header", "Authorization: Bearer X"], ["--header", "Authorization: <redacted>"]),
        (["-H", "authorization: token X"], ["-H", "authorization: <redacted>"]),
        (["--header=Cookie: session=X"], ["--header=Cookie: <redacted>"]),
        (["-H", "Proxy-Authorization: Basic X"], ["-H", "Proxy-Authorization: <redacted>"]),
        (["https://h/p?sig=X&se=2"], ["https://h/p?sig=<redacted>&se=2"]),
        (["https://h/p?a=1&access_token=X"], ["https://h/p?a=1&access_token=<redacted>"]),
        (["https://h/p?x-amz-signature=X"], ["https://h/p?x-amz-signature=<redacted>"]),
        (["--url", "https://h/p?password=X#f"], ["--url", "https://h/p?password=<redacted>#f"]),
        (["--lr", "-0.1", "--warmup=3"], ["--lr", "-0.1", "--warmup=3"]),
        (["train.py", "--lr", "0.1", "data.csv"], ["train.py", "--lr", "0.1", "data.csv"]),
    ],
)
def test_secret_looking_values_are_redacted(argv, expected):
    assert redact_argv([a.replace("X", SECRET) for a in argv]) == expected


def test_meta_json_holds_no_secret_from_the_command_line(tmp_path, monkeypatch):
    argv = ["train.py", f"--token={SECRET}", "--api-key", SECRET, "--Password", SECRET, "--lr=3"]
    monkeypatch.setattr(sys, "argv", argv)
    with nbmonitor.attach(mlp(), run_dir=tmp_path, display=False, interval=60) as mon:
        pass
    written = b"".join(p.read_bytes() for p in mon.run_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in written
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["argv"] == [
        "train.py",
        f"--token={REDACTED}",
        "--api-key",
        REDACTED,
        "--Password",
        REDACTED,
        "--lr=3",
    ]
