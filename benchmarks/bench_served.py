"""The served-model binding's own cost per round, against a direct HTTP call to the same server, and tokens per
second in-process vs served, on the default model (SmolLM2-135M-Instruct).

llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`) serves the embedded model on
127.0.0.1. One round is the same schema-constrained, greedy, streamed chat completion of `MAX_TOKENS` tokens:
- served: through the worker's path, `MeteredBinding(ServedBinding).chat` (SSE parsing, progress, token counts),
- direct: the same request body POSTed with a bare httpx client, its stream read to the end,
- in-process: `LlamaBinding.chat` on the same GGUF file, for tokens per second only.
Served and direct alternate round by round (the order flipping each round), so the shared machine's load hits
them alike; then served and in-process alternate the same way for tokens per second (apart, so the in-process
model's threads never run next to the overhead's rounds). The binding's overhead is the median over rounds of
served / direct - 1 (target < 5%); written to its section of benchmarks/RESULTS.md. Exits 1 on a miss.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from results import met, publish, verdict  # noqa: E402
from emelex_memory import DefaultModelUnavailableError  # noqa: E402
from emelex_workers.worker.metering import MeteredBinding  # noqa: E402
from emelex_workers.models import ModelManager, default_model_file  # noqa: E402
from emelex_workers.settings import WorkerSettings

ROUNDS = 16
SPEED_ROUNDS = 4
MAX_TOKENS = 32
CONTEXT = 2048
TARGET_PCT = 5.0
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Describe a walk through an old city, street by street."}]
SCHEMA = {"type": "object", "properties": {"walk": {"type": "string"}}, "required": ["walk"]}
SECTIONS = ("served",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "plugins/emelex_openai",
    "emelex_workers/worker",
)


def render(figures: dict) -> str:
    """The `served` section of the recorded `figures`."""
    return (
        f"## Served models (`bench_served.py`)\n\nMeasured {figures['measured']}:\n\n"
        f"- binding overhead per round: {figures['overhead_pct']:+.2f}% "
        f"({verdict(figures['overhead_pct'], '<', figures['target_pct'])}; medians {figures['served_ms']:.0f} ms "
        f"through the binding, {figures['direct_ms']:.0f} ms direct)\n"
        f"- tokens per second: {figures['served_tps']:.1f} served ({figures['served_tokens']} tokens), "
        f"{figures['local_tps']:.1f} in-process ({figures['local_tokens']} tokens) (no target)\n\n"
        "One round is the same schema-constrained, greedy, streamed chat completion on SmolLM2-135M-Instruct served "
        "by llama-cpp-python's own server on 127.0.0.1: through the worker's path (`MeteredBinding` over "
        "`ServedBinding`: SSE parsing, progress, token counts) against the same request POSTed with a bare httpx "
        f"client; {figures['rounds']} rounds of {figures['max_tokens']} tokens, the sides alternating, the overhead "
        f"the median of each round's ratio (then {figures['speed_rounds']} rounds of served against in-process for "
        "tokens per second, medians). The served token count is the binding's estimate (the server streams no "
        "usage): one streamed piece per token. In-process is `LlamaBinding` on the same file and thread count; the "
        "server's sampling defaults differ slightly (it is the same greedy decode). Run on a shared 2-core machine: "
        "the figures are noisy.\n"
    )


def main() -> int:
    for module in ("llama_cpp", "httpx", "fastapi"):
        if importlib.util.find_spec(module) is None:
            print(f"served binding overhead: skipped ({module} is not installed)")
            return 0
    try:
        gguf = default_model_file()
    except DefaultModelUnavailableError as exc:
        print(f"served binding overhead: skipped ({exc})")
        return 0
    import httpx

    from emelex_llamacpp.binding import LlamaBinding
    from emelex_openai.binding import CHAT_PATH, VARIANTS
    from tests.support.served import ALIAS, add_served, llama_server

    with tempfile.TemporaryDirectory() as tmp, llama_server(gguf, n_ctx=CONTEXT) as url:
        settings = WorkerSettings(home=Path(tmp) / "home", plugins_autoload=False, model_max_context_tokens=CONTEXT)
        from emelex_openai.binding import ServedBinding

        served = ServedBinding(add_served(settings, "served", url), settings)
        metered = MeteredBinding(served)
        body = {"model": ALIAS, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 42,
                "stream": True, "stream_options": {"include_usage": True}, **VARIANTS[served.constraint()](SCHEMA)}
        local = LlamaBinding(ModelManager(settings).install_default(link=True), max_context=CONTEXT, threads=2)
        direct_http = httpx.Client(base_url=url, timeout=120)
        samples: dict[str, list[float]] = {"served": [], "direct": [], "local": []}
        tokens: dict[str, int] = {}

        def run_served() -> None:
            metered.begin_job()
            metered.chat(MESSAGES, max_tokens=MAX_TOKENS, json_schema=SCHEMA)
            tokens["served"] = metered.cost.generated_tokens

        def run_direct() -> None:
            with direct_http.stream("POST", CHAT_PATH, json=body) as response:
                for _line in response.iter_lines():
                    pass

        def run_local() -> None:
            seen = []
            local.chat(MESSAGES, max_tokens=MAX_TOKENS, json_schema=SCHEMA, on_token=seen.append)
            tokens["local"] = seen[-1].generated_tokens

        for side in (run_served, run_direct, run_local):  # warm up: the server's first request, the in-process load
            side()
        for i in range(ROUNDS):  # the overhead: served and direct alone, alternating
            for name, side in (("served", run_served), ("direct", run_direct))[:: 1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                side()
                samples[name].append(time.perf_counter() - start)
        speed = {"served": [], "local": []}
        for i in range(SPEED_ROUNDS):  # tokens per second: served and in-process, alternating
            for name, side in (("served", run_served), ("local", run_local))[:: 1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                side()
                speed[name].append(time.perf_counter() - start)
        samples["local"] = speed["local"]
        direct_http.close()
        served.close()
        local.close()
    for name, values in samples.items():
        print(f"{name} rounds (ms): {' '.join(f'{v * 1000:.0f}' for v in values)}")
    median = {name: statistics.median(values) for name, values in samples.items()}
    # each round's served and direct calls ran back to back: the median of their ratios cancels the load's drift
    overhead = 100 * (statistics.median(a / b for a, b in zip(samples["served"], samples["direct"])) - 1)
    served_tps = tokens["served"] / statistics.median(speed["served"])
    local_tps = tokens["local"] / median["local"]
    print(publish("served", render, {
        "rounds": ROUNDS, "speed_rounds": SPEED_ROUNDS, "max_tokens": MAX_TOKENS, "target_pct": TARGET_PCT,
        "overhead_pct": overhead, "served_ms": median["served"] * 1000, "direct_ms": median["direct"] * 1000,
        "served_tps": served_tps, "served_tokens": tokens["served"], "local_tps": local_tps,
        "local_tokens": tokens["local"]}))
    return 0 if met(overhead, "<", TARGET_PCT) else 1


if __name__ == "__main__":
    sys.exit(main())
