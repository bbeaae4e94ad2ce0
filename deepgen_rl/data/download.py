"""Fetch the recipe's public prompt files and the UniGenBench test CSVs, verified by git blob id.

    python -m deepgen_rl.data.download [--dest assets/rl_datasets/deepgen] [--base-url URL] [--only NAME ...]
    (or: bash scripts/download_data.sh)

Source: the public repository ``deepgenteam/deepgen_rl`` at a pinned commit; file ``<path>`` of the table below is
fetched from ``{base_url}/assets/rl_datasets/deepgen/<path>`` and written to ``{dest}/<path>``, exactly where
``deepgen_train.yaml`` and ``eval/eval.yaml`` look for it. ``base_url`` defaults to raw.githubusercontent.com at the
pinned commit; override it with ``--base-url`` or ``$DEEPGEN_DATA_BASE_URL`` (a mirror, a local server).

Each file is checked by its git blob id, sha1(b"blob " + str(len(content)) + b"\\0" + content) — what
``git hash-object`` prints and what the repository's tree records. Per file:
  * present and verified -> skipped (the command is idempotent);
  * present but different -> error, left untouched (delete it to fetch the published version);
  * otherwise downloaded to ``<file>.part`` (an existing .part is resumed with an HTTP Range request), verified,
    then atomically renamed into place. A .part that fails verification is deleted. The destination is never a
    partial or unverified file; a transfer cut off mid-file keeps its (non-empty) .part for the next run to resume.
Every failure is one line on stderr naming the file, the URL and what to do; the exit status is 1. An unreachable
source (offline, DNS failure, connection refused or reset, timeout) stops the run at the first file with ONE line
for the whole run, not one per file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = "deepgenteam/deepgen_rl"
COMMIT = "c4d5dc27d699870ddac4bcb8ceda2e240773957b"
REPO_DIR = "assets/rl_datasets/deepgen"
DEFAULT_BASE_URL = f"https://raw.githubusercontent.com/{REPO}/{COMMIT}"
BASE_URL_ENV = "DEEPGEN_DATA_BASE_URL"
DEFAULT_DEST = Path(__file__).resolve().parents[2] / REPO_DIR
CHUNK = 1 << 16
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DataFile:
    """One published file: ``path`` under assets/rl_datasets/deepgen/, its git blob id, its size if known."""

    path: str
    blob: str
    size: int | None = None


# From the repository tree at COMMIT (../shared/data/SOURCES.md).
FILES: tuple[DataFile, ...] = (
    DataFile("unigenbench_train_data_ocr.txt", "15e59f52627990679b3b9ce47d7bda0b70b0eb28", 559701),
    DataFile("unigenbench_train_data_general.txt", "39932aea66db8a5cbb86c6d2ef1f4530e068ef2d", 1129463),
    DataFile("corebench.txt", "a5cf567c1ae550fbc845de690bc3068f4522434c", 828618),
    DataFile("qwenimage_textrender.txt", "4baf65edbcc4f6289749063a153167b48af7096b"),
    DataFile("text_render_less.txt", "61ae8c1e3a96b4b5f4493ebfe79e059c7654ae8b"),
    DataFile("blip3o_60k.txt", "90b0d32c2d5e073a1499a43cec43563deb1f1669"),
    DataFile("share_4o_img.txt", "a38a338261c5441ec9e297030c8132c57ea601b9"),
    DataFile("eval/geneval_prompt.txt", "c0b99cad45686af74221482037775072d987907c", 196970),
    DataFile("eval/prompts_dpgbench.jsonl", "f550655cee9d17fdc2bd3ee085e3053779c4571a", 473513),
    DataFile("eval/unigenbench/test_prompts_en.csv", "6a56b309a30d6dcae66c47827c9df2047d108367", 358381),
    DataFile("eval/unigenbench/test_prompts_en_long.csv", "370635b027f0621da4796fa31ec2c06957eea208", 762222),
    DataFile("eval/unigenbench/test_prompts_zh.csv", "ac0ce84d50fc643bd4711f40c79ec4548d0c4ac6", 306309),
    DataFile("eval/unigenbench/test_prompts_zh_long.csv", "c86d7791e7b9f7305dba83ec3bf2156ac3466b9d", 641000),
)


class DownloadError(RuntimeError):
    """A file could not be fetched or verified; the message is the one line shown to the user."""


class SourceUnreachable(DownloadError):
    """No answer from the source at all (offline, DNS, refused, reset, timeout): every other file would fail the same
    way, so the download stops at the first one and reports ONE line."""

    def __init__(self, url: str, reason: object):
        super().__init__(f"cannot download {url}: {reason}")
        self.url, self.reason = url, reason


def git_blob_id(path: str | os.PathLike) -> str:
    """sha1(b"blob <size>\\0" + content) of a file, streamed (what ``git hash-object`` prints)."""
    h = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch_to_part(url: str, part: Path, expected_size: int | None) -> None:
    """Append the rest of ``url`` to ``part`` (Range request when it already holds bytes)."""
    have = part.stat().st_size if part.exists() else 0
    if expected_size is not None and have > expected_size:
        part.unlink()
        have = 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            mode = "ab" if have and resp.status == 206 else "wb"  # 200: the server ignored Range, start over
            with open(part, mode) as out:
                for chunk in iter(lambda: resp.read(CHUNK), b""):
                    out.write(chunk)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to send: the .part is complete, verification decides
            return
        raise DownloadError(f"cannot download {url}: HTTP {e.code} {e.reason} "
                            f"(check --base-url / ${BASE_URL_ENV})") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        if part.exists() and part.stat().st_size == 0:  # nothing arrived: no empty .part left behind
            part.unlink()
        raise SourceUnreachable(url, getattr(e, "reason", e)) from None


def fetch_file(item: DataFile, dest_root: Path, base_url: str) -> str:
    """Ensure ``dest_root/item.path`` holds the published file; returns "present" or "downloaded"."""
    target = dest_root / item.path
    if target.exists():
        if git_blob_id(target) == item.blob:
            return "present"
        raise DownloadError(f"{target} exists but is not the published file (git blob {item.blob}); "
                            f"delete it to download the published version")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    url = f"{base_url.rstrip('/')}/{REPO_DIR}/{item.path}"
    _fetch_to_part(url, part, item.size)
    got = git_blob_id(part)
    if got != item.blob:
        size = part.stat().st_size
        part.unlink()
        raise DownloadError(f"{url} does not verify: git blob {got} ({size} bytes), expected {item.blob}"
                            f"{'' if item.size is None else f' ({item.size} bytes)'}; nothing was written")
    os.replace(part, target)
    return "downloaded"


def download(dest_root: str | os.PathLike = DEFAULT_DEST, base_url: str | None = None,
             only: list[str] | None = None, files: tuple[DataFile, ...] = FILES, log=print) -> list[str]:
    """Fetch ``files`` (or those whose path or file name is in ``only``); returns the error lines (empty = all ok)."""
    base_url = base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    chosen = list(files)
    if only:
        unknown = [n for n in only if not any(n in (f.path, Path(f.path).name) for f in files)]
        if unknown:
            return [f"--only: unknown file(s) {unknown}; known: {[f.path for f in files]}"]
        chosen = [f for f in files if f.path in only or Path(f.path).name in only]
    errors = []
    for i, item in enumerate(chosen):
        try:
            log(f"{fetch_file(item, Path(dest_root), base_url):>10}  {item.path}")
        except SourceUnreachable as e:  # one line for the whole run: the other files would fail the same way
            left = len(chosen) - i
            part = Path(dest_root) / (item.path + ".part")
            kept = f"; {part.name} kept, a rerun resumes it" if part.exists() else ""
            errors.append(f"cannot reach the data source {base_url} ({e.reason}, fetching {item.path}); {left} of "
                          f"{len(chosen)} file(s) not fetched, none left partial in place{kept} (offline? rerun when "
                          f"online, or point --base-url / ${BASE_URL_ENV} at a reachable mirror)")
            break
        except DownloadError as e:
            errors.append(str(e))
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=str(DEFAULT_DEST),
                        help="folder holding deepgen_train.yaml (files land at <dest>/<path>)")
    parser.add_argument("--base-url", default=None,
                        help=f"URL prefix before {REPO_DIR}/<path> (default ${BASE_URL_ENV} or {DEFAULT_BASE_URL})")
    parser.add_argument("--only", nargs="+", default=None, help="fetch only these files (path or file name)")
    args = parser.parse_args(argv)
    errors = download(args.dest, args.base_url, args.only)
    for line in errors:
        print(f"download_data: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
