"""llama.cpp as a peer (never a dependency): its own ``llama-server`` run as a subprocess on
127.0.0.1, fed the same token ids we decode, so both engines read identical prompts.

Build the binary from the ``llama-cpp-python`` sdist's bundled source (the registry has no wheel)::

    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/llamacpp-dl
    mkdir -p /tmp/llamacpp-src && tar xzf /tmp/llamacpp-dl/llama_cpp_python-0.3.36.tar.gz -C /tmp/llamacpp-src
    cmake -S /tmp/llamacpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llamacpp-build \\
          -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build /tmp/llamacpp-build -j2 --target llama-server

and pass ``--llama-bin /tmp/llamacpp-build/bin``. On a CPU with AMX (Sapphire Rapids and later) that build
segfaults in ``ggml_backend_amx_mul_mat`` on the Q4_K_M target (ggml-org/llama.cpp#20824): add
``-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"`` and the same ``CMAKE_CXX_FLAGS``, which keep
everything else ``-march=native`` gives. The server's own timings give decode tokens/s
(``predicted_per_second``) and, with a draft model, its acceptance counts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """One ``llama-server`` process (optionally with a draft model) for the lifetime of a benchmark."""

    def __init__(self, bin_dir: Path | str, model: Path, draft: Path | None = None, draft_max: int = 4,
                 threads: int = 2, context: int = 4096, startup_timeout_s: float = 300.0) -> None:
        binary = Path(bin_dir) / "llama-server"
        if not binary.exists():
            raise SpecdecError(f"{binary} not found: build llama.cpp's llama-server (see specdec/bench/llamacpp.py) "
                               "and pass its directory with --llama-bin")
        self.port = _free_port()
        args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                "-c", str(context), "-np", "1", "--no-webui"]
        if draft is not None:
            args += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max),
                     "--spec-draft-n-min", "0", "-td", str(threads)]  # flag names of llama.cpp as of 0.3.36
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise SpecdecError(f"llama-server exited ({self.process.returncode}): {self.process.stderr.read()[-1500:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SpecdecError(f"llama-server did not become healthy within {startup_timeout_s:.0f} s")
            time.sleep(0.5)

    def complete(self, ids: list[int], params: SamplingParams) -> dict:
        body = {"prompt": ids, "n_predict": params.max_tokens, "temperature": params.temperature,
                "top_k": params.top_k if params.top_k > 0 else 0, "top_p": params.top_p, "min_p": params.min_p,
                "repeat_penalty": 1.0, "ignore_eos": params.ignore_eos, "cache_prompt": False, "return_tokens": True,
                "seed": params.seed if params.seed is not None else -1}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=1800) as response:
            return json.loads(response.read())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def result_stats(reply: dict) -> dict:
    """Our stats names for the figures llama-server reports. ``ttft_s`` is its prompt time (the
    first token is sampled from the prompt pass's logits, as ours is). ``mean_accepted_len`` (τ,
    tokens per target forward) where it drafted: every decode forward commits its accepted drafts
    plus one token, so the forwards after the prompt's are ``generated - 1 - accepted``."""
    timings = reply.get("timings", {})
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    generated = len(reply.get("tokens", []))
    stats = {"generated_tokens": generated, "tokens_per_s": timings.get("predicted_per_second", 0.0),
             "prefill_tokens_per_s": timings.get("prompt_per_second", 0.0), "proposed_tokens": drafted,
             "accepted_tokens": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0}
    if timings.get("prompt_ms"):
        stats["ttft_s"] = timings["prompt_ms"] / 1000
    forwards = generated - 1 - accepted
    if drafted and forwards > 0:
        stats["mean_accepted_len"] = (generated - 1) / forwards
    return stats


def llamacpp_peers(bin_dir: Path | str, target_gguf: Path, draft_gguf: Path | None, params: SamplingParams,
                   num_tokens: int = 4, threads: int = 2, detokenize: Callable[[list[int]], str] = str,
                   ) -> tuple[dict[str, Callable[[list[int]], tuple[list[int], dict, str]]], Callable[[], None]]:
    """Runners ``llamacpp`` (plain) and ``llamacpp-draft`` (its speculative mode, needs a draft GGUF),
    and a function that stops the servers."""
    for path in (target_gguf, draft_gguf):
        if path is not None and path.suffix != ".gguf":
            raise SpecdecError(f"the llama.cpp peer needs GGUF files, got {path}")
    servers = {"llamacpp": LlamaServer(bin_dir, target_gguf, threads=threads)}
    if draft_gguf is not None:
        try:
            servers["llamacpp-draft"] = LlamaServer(bin_dir, target_gguf, draft_gguf, draft_max=num_tokens, threads=threads)
        except BaseException:
            servers["llamacpp"].close()  # do not leave the first server running
            raise

    def make(server: LlamaServer) -> Callable[[list[int]], tuple[list[int], dict, str]]:
        def generate_one(ids: list[int]) -> tuple[list[int], dict, str]:
            reply = server.complete(ids, params)
            tokens = list(reply.get("tokens", []))
            return tokens, result_stats(reply), reply.get("content", "") or detokenize(tokens)

        return generate_one

    def close() -> None:
        for server in servers.values():
            server.close()

    return {name: make(server) for name, server in servers.items()}, close
