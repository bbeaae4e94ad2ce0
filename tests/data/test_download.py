"""scripts/download_data.sh: verified by git blob id, idempotent, resumable, one clear line on failure.

A local HTTP server on 127.0.0.1 stands in for raw.githubusercontent.com (it honours Range requests as GitHub does).
The real-file test serves the copies in ../shared/data and is skipped where that folder is absent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deepgen_rl.data.download import FILES, REPO_DIR, DataFile, download, git_blob_id
from deepgen_rl.data.prompts import load_train_config
from deepgen_rl.evaluation.config import load_eval_config
from deepgen_rl.services.ocr.launch import free_port
from tests.shared_data import SHARED_DATA, needs_shared_data

ROOT = Path(__file__).resolve().parents[2]
LARGE = {"qwenimage_textrender.txt", "text_render_less.txt", "blip3o_60k.txt", "share_4o_img.txt"}


class Server:
    """Serves ``root`` over HTTP on 127.0.0.1; ``sent[path]`` counts body bytes, ``ranges`` the Range requests."""

    def __init__(self, root: Path):
        self.root, self.sent, self.ranges = root, Counter(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                path = server.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                start = 0
                if "Range" in self.headers:
                    start = int(self.headers["Range"].split("=", 1)[1].split("-", 1)[0])
                    server.ranges.append((self.path, start))
                    if start >= len(data):
                        self.send_error(416)
                        return
                body = data[start:]
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # counted before writing: the client may finish reading (and the test assert) before this thread
                # runs another line after the write
                server.sent[self.path] += len(body)
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "served"
    server = Server(root)
    yield root / REPO_DIR, server
    server.close()


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _synthetic(served_dir: Path, names_and_data: dict[str, bytes]) -> tuple[DataFile, ...]:
    files = []
    for name, data in names_and_data.items():
        (served_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (served_dir / name).write_bytes(data)
        files.append(DataFile(name, _blob(data), len(data)))
    return tuple(files)


def _run_script(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "scripts/download_data.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_git_blob_id_matches_git_hash_object(tmp_path):
    f = tmp_path / "x.txt"
    f.write_bytes("a prompt with “quotes”\nand no trailing newline".encode())
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    expected = subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True, check=True).stdout
    assert git_blob_id(f) == expected.strip() == _blob(f.read_bytes())


def test_the_table_is_the_published_one():
    assert len(FILES) == 13 and len({f.path for f in FILES}) == 13
    assert {Path(f.path).name for f in FILES if f.size is None} == LARGE
    assert sum(f.path.startswith("eval/unigenbench/test_prompts_") for f in FILES) == 4


@needs_shared_data
def test_real_files_download_verify_and_the_yamls_load(tmp_path, served):
    served_dir, server = served
    present = [f for f in FILES if Path(f.path).name not in LARGE]
    for f in present:  # copies in ../shared/data drop the eval/ prefix
        src = SHARED_DATA / f.path.removeprefix("eval/")
        (served_dir / f.path).parent.mkdir(parents=True, exist_ok=True)
        (served_dir / f.path).symlink_to(src)
    dest = tmp_path / "deepgen"
    (dest / "eval").mkdir(parents=True)
    shutil.copy(ROOT / REPO_DIR / "deepgen_train.yaml", dest)
    shutil.copy(ROOT / REPO_DIR / "eval/eval.yaml", dest / "eval")

    r = _run_script("--dest", str(dest), "--base-url", server.url, "--only", *[f.path for f in present])
    assert r.returncode == 0, r.stderr
    for f in present:
        assert (dest / f.path).read_bytes() == (served_dir / f.path).read_bytes()
        assert not (dest / (f.path + ".part")).exists()
    specs = load_eval_config(dest / "eval/eval.yaml")
    assert [len(s.prompts) for s in specs] == [600]

    # idempotent: a second run sends no request and changes nothing
    sent = sum(server.sent.values())
    r = _run_script("--dest", str(dest), "--base-url", server.url, "--only", *[f.path for f in present])
    assert r.returncode == 0 and r.stdout.count("present") == len(present) and sum(server.sent.values()) == sent

    # the four large files are not in ../shared: serve stand-ins under a table patched with their blob ids, so the
    # same download makes train.sh's default data config load
    stand_ins = {f.path: f"{f.path} prompt {i}\n".encode() * 3 for i, f in enumerate(FILES)
                 if Path(f.path).name in LARGE}
    files = tuple(replace(f, blob=_blob(stand_ins[f.path]), size=len(stand_ins[f.path])) if f.path in stand_ins
                  else f for f in FILES)
    _synthetic(served_dir, stand_ins)
    assert download(dest, server.url, files=files, log=lambda *_: None) == []
    cfg = load_train_config(dest / "deepgen_train.yaml")
    assert len(cfg.datasets) == 7
    core = next(d for d in cfg.datasets if d.name == "corebench")
    assert len(core.prompts) == 1080


def test_resume_appends_only_the_missing_bytes(tmp_path, served):
    served_dir, server = served
    data = b"".join(b"prompt number %d about a red apple\n" % i for i in range(3000))
    files = _synthetic(served_dir, {"eval/unigenbench/test_prompts_en.csv": data})
    target = tmp_path / "dest/eval/unigenbench/test_prompts_en.csv"
    target.parent.mkdir(parents=True)
    Path(str(target) + ".part").write_bytes(data[:40_000])  # an interrupted earlier run
    assert download(tmp_path / "dest", server.url, files=files, log=lambda *_: None) == []
    assert target.read_bytes() == data and not Path(str(target) + ".part").exists()
    assert server.ranges == [(f"/{REPO_DIR}/eval/unigenbench/test_prompts_en.csv", 40_000)]
    assert sum(server.sent.values()) == len(data) - 40_000


def test_a_file_that_does_not_verify_leaves_nothing(tmp_path, served):
    served_dir, server = served
    files = _synthetic(served_dir, {"corebench.txt": b"the published prompts\n"})
    (served_dir / "corebench.txt").write_bytes(b"the published prompts, tampered\n")
    errors = download(tmp_path / "dest", server.url, files=files, log=lambda *_: None)
    assert len(errors) == 1 and "does not verify" in errors[0] and files[0].blob in errors[0]
    assert list((tmp_path / "dest").iterdir()) == []  # neither the file nor a .part

    # the CLI: one line on stderr, exit 1 (an existing, different file is refused and left as it is)
    mine = tmp_path / "dest2/eval/geneval_prompt.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own prompts\n")
    r = _run_script("--dest", str(tmp_path / "dest2"), "--base-url", server.url, "--only", "geneval_prompt.txt")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "exists but is not the published file" in r.stderr and mine.read_text() == "my own prompts\n"


def _files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def test_offline_is_one_clear_line_and_no_file(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = _run_script("--dest", str(tmp_path / "dest"), "--base-url", url)  # all 13 files, no --only
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one line for the run, not one per file
    assert lines[0].startswith(f"download_data: cannot reach the data source {url} (")
    assert f"fetching {FILES[0].path}); 13 of 13 file(s) not fetched" in lines[0] and "--base-url" in lines[0]
    assert _files_under(tmp_path / "dest") == []  # neither a file nor a .part
    r = _run_script("--dest", str(tmp_path / "dest"), "--base-url", url, "--only", "corebench.txt")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "1 of 1 file(s)" in r.stderr
    r = _run_script("--dest", str(tmp_path / "dest"), "--only", "nope.txt")
    assert r.returncode == 1 and "unknown file" in r.stderr


def test_a_source_that_drops_connections_is_tried_once(tmp_path, served):
    """A host that accepts and at once closes every connection (a proxy refusing, a dead mirror): the download stops
    at the first file instead of trying the other 12, and writes nothing; files already fetched stay."""
    import socket

    served_dir, server = served
    files = _synthetic(served_dir, {"corebench.txt": b"first\n", "eval/geneval_prompt.txt": b"second\n",
                                    "eval/prompts_dpgbench.jsonl": b"third\n"})
    dest = tmp_path / "dest"
    assert download(dest, server.url, files=files[:1], log=lambda *_: None) == []  # the first one is already here
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.1)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        errors = download(dest, url, files=files, log=lambda *_: None)
    finally:
        stop.set()
        thread.join(5)
        sock.close()
    assert len(errors) == 1 and errors[0].startswith(f"cannot reach the data source {url}")
    assert "fetching eval/geneval_prompt.txt); 2 of 3 file(s) not fetched" in errors[0]
    assert len(accepted) == 1  # the third file was not tried
    assert _files_under(dest) == [dest / "corebench.txt"]
