"""bench/ocr_throughput.py --smoke runs end to end and prints the comparison table."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ocr_throughput_bench_smoke():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "ocr_throughput.py"), "--smoke"], cwd=ROOT,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "in-process (rapidocr + scoring)" in out and "images/s" in out
    http_rows = [line for line in out.splitlines() if line.startswith("HTTP (batch")]
    assert [row.split()[3] for row in http_rows] == ["1", "8"]  # concurrency column
    assert "HTTP / in-process throughput ratios: c=1:" in out
    assert "rerun: python bench/ocr_throughput.py --smoke" in out
    assert "WARNING" not in out
