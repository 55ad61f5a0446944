"""Generation throughput of the hf and vllm engines on the tiny policy (CPU), same
requests (one 144x144 image each, a LoRA adapter active), greedy and sampled.

    python -m bench.bench_engines

vLLM runs in its own venv (scripts/setup_vllm_venv.sh), so the bench runs under that
venv's interpreter, both engines in one process (started from the main venv, it runs
itself there).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.factories import image_request, save_peft_lora

from bench.common import RESULTS, plot_results, write_results
from rlfleet.engines import GenerationRequest, SamplingConfig
from rlfleet.engines.hf import HFEngine
from rlfleet.engines.vllm import VLLMEngine, default_venv_python
from rlfleet.policy import ensure_tiny_model

NEW_TOKENS = 32
BATCHES = (1, 8)


def requests(hf: HFEngine, n: int) -> list[GenerationRequest]:
    return [image_request(hf.codec, 144, f"maze {i}: your move?", seed=i) for i in range(n)]


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def tokens_per_s(engine, reqs, params, repeats: int = 2) -> float:  # noqa: ANN001
    engine.generate(reqs, params, adapter="policy")  # warm-up
    best = float("inf")
    tokens = 0
    for _ in range(repeats):
        start = time.perf_counter()
        gens = engine.generate(reqs, params, adapter="policy")
        best = min(best, time.perf_counter() - start)
        tokens = sum(len(g.token_ids) for g in gens)
    return tokens / best


def main() -> None:
    if importlib.util.find_spec("vllm") is None:  # the main venv: run under vLLM's
        repo = str(Path(__file__).resolve().parents[1])
        subprocess.run([str(default_venv_python()), "-m", "bench.bench_engines"], cwd=repo,
                       env={**os.environ, "PYTHONPATH": repo}, check=True)
        plot_results(RESULTS / "engines_vllm.json")  # matplotlib lives in this venv only
        return
    with tempfile.TemporaryDirectory() as tmp:
        tiny = ensure_tiny_model(Path(tmp) / "models")
        adapter = Path(tmp) / "adapter"
        save_peft_lora(tiny, adapter, seed=0)
        hf = HFEngine(tiny)
        (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        vl = VLLMEngine(tiny, dtype="float32", max_lora_rank=8,
                        kv_cache_memory_bytes=256 << 20)
        start_s = time.perf_counter() - started
        rows = []
        try:
            for engine in (hf, vl):
                engine.load_adapter("policy", str(adapter))
            for batch in BATCHES:
                reqs = requests(hf, batch)
                for temperature in (0.0, 1.0):
                    params = SamplingConfig(
                        temperature=temperature, max_new_tokens=NEW_TOKENS, seed=0
                    )
                    for name, engine in (("hf", hf), ("vllm", vl)):
                        rows.append(
                            {
                                "case": f"{name} b{batch} T{temperature:g}",
                                "engine": name,
                                "batch": batch,
                                "temperature": temperature,
                                "tokens_per_s": tokens_per_s(engine, reqs, params),
                            }
                        )
        finally:
            vl.close()
            hf.close()
    write_results(
        "engines_vllm",
        rows,
        value_key="tokens_per_s",
        unit="generated tokens/s",
        meta={
            "new_tokens": NEW_TOKENS,
            "vllm_start_s": round(start_s, 1),
            "vllm": vllm_version(),
        },
        title="hf vs vllm engine, tiny policy, CPU",
        plot=False,
    )


if __name__ == "__main__":
    sys.exit(main())
