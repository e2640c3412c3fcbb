r"""Both lm-eval routes on every shipped task, no limit: a run through the hwh model (JAX) and its
export (``launch.export_hf``) through lm-eval's own hf model; per task the largest difference of a
request's log-likelihood and whether every metric agrees (to 1e-6 relative).

  python bench/export_two_routes.py RUN EXPORT_DIR TASK_FOLDER
"""

import json
import sys
import time

import numpy as np
import torch
from lm_eval.models.huggingface import HFLM

from hwh_jax.eval import commonsense, harness
from hwh_jax.training.restore import load_run

run_dir, export_dir, folder = sys.argv[1:4]
run = load_run(run_dir)
tasks = [f"hwh_{t}" for t in commonsense.TASKS] + ["harness_wikitext2"]
harness.task_folder(tasks, folder=folder)
ours = harness.HwhLM(model=run.model, tokenizer=run.tokenizer, batch_size=32)
hf = HFLM(
    pretrained=export_dir, trust_remote_code=True, dtype=torch.float32, batch_size=32, device="cpu"
)
out = {}
for name, lm in (("hwh", ours), ("hf", hf)):
    t = time.time()
    r = harness.evaluate(lm, tasks, include_path=folder, log_samples=True)
    out[name] = r
    print(name, "done in", round(time.time() - t), "s", flush=True)
worst = 0.0
for task in tasks:
    a = sorted(out["hwh"]["samples"][task], key=lambda s: s["doc_id"])
    b = sorted(out["hf"]["samples"][task], key=lambda s: s["doc_id"])
    ll = lambda r: r[0][0] if isinstance(r[0], (list, tuple)) else r[0]
    la = np.array([ll(r) for s in a for r in s["resps"]], float)
    lb = np.array([ll(r) for s in b for r in s["resps"]], float)
    d = np.abs(la - lb)
    rel = d / np.maximum(np.abs(la), 1)
    ma, mb = out["hwh"]["results"][task], out["hf"]["results"][task]
    metrics = {k: (ma[k], mb[k]) for k in ma if isinstance(ma[k], float) and "stderr" not in k}
    same = all(abs(x - y) <= 1e-6 * max(1, abs(x)) for x, y in metrics.values())
    print(
        json.dumps(
            {
                "task": task,
                "n_requests": len(la),
                "max_abs_ll_diff": float(d.max()),
                "max_rel_ll_diff": float(rel.max()),
                "n_over_1e-3": int((d > 1e-3).sum()),
                "metrics_equal": same,
                "metrics": metrics,
            }
        ),
        flush=True,
    )
