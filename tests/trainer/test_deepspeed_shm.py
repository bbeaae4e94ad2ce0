"""`skip_cpu_shm_comm_op`: DeepSpeed on the CPU runs without compiling its shared-memory comm op, and the installed
DeepSpeed's backend uses that op nowhere but in its constructor (so skipping it loses nothing)."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import textwrap

from deepgen_rl.services.ocr.launch import free_port
from tests.trainer.helpers import ROOT, subprocess_env


def test_the_backend_only_builds_and_initialises_the_shm_op():
    """Every use of ``build_shm_op`` and of ``.shm_comm_op`` in ``deepspeed.comm.torch`` is inside
    ``TorchBackend.__init__`` (0.19.6: build it, then ``initialize(world_size, rank)``). A DeepSpeed whose
    collectives read the op fails here, before anyone trains without it."""
    import importlib

    backend = importlib.import_module("deepspeed.comm.torch")  # not `import ... as`: deepspeed.comm.torch is torch
    tree = ast.parse(inspect.getsource(backend))
    uses: list[str] = []

    def visit(node, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                here = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Attribute) and child.attr == "shm_comm_op":
                uses.append(f"{where}:.shm_comm_op")
            if isinstance(child, ast.Name) and child.id == "build_shm_op":
                uses.append(f"{where}:build_shm_op")
            visit(child, here)

    visit(tree, "")
    assert uses, "deepspeed.comm.torch no longer has the shm op: skip_cpu_shm_comm_op patches nothing"
    assert set(uses) == {"TorchBackend.__init__:.shm_comm_op", "TorchBackend.__init__:build_shm_op"}, uses


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    from deepgen_rl.trainer.deepspeed_utils import skip_cpu_shm_comm_op
    skipped = skip_cpu_shm_comm_op()
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.1),
        config={"train_batch_size": 1, "zero_optimization": {"stage": 2}}, dist_init_required=False)
    before = model.weight.detach().clone()
    loss = engine(torch.ones(1, 8)).square().sum()
    engine.backward(loss)
    engine.step()
    from deepspeed.comm import comm
    print("REPORT " + json.dumps({
        "skipped": skipped, "shm_op": comm.cdb.shm_comm_op is not None,
        "moved": float((engine.module.weight.detach() - before).abs().max()),
        "extensions": sorted(os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]))}))
""")


def test_a_cpu_deepspeed_engine_trains_without_building_the_shm_op(tmp_path):
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    env = subprocess_env()
    env.update(TORCH_EXTENSIONS_DIR=str(ext), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, "-c", WORKER], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(lines[-1].split(" ", 1)[1])
    # the op was neither compiled (nothing in a fresh extensions folder) nor created; the engine still trains
    assert report == {"skipped": True, "shm_op": False, "moved": report["moved"], "extensions": []}, report
    assert report["moved"] > 1e-3
