"""Does vdpbf16ps prompt attention change what the model predicts? Session 56's check (its
prompt_attention_quality.py) with the AVX-512 BF16 kernel: the default target's prompt twin (int8 layers)
over argparse.py, teacher-forced: next-token logits with float32 attention and with prompt_attention
(avx512-bf16), compared — mean NLL of the real next token, top-1 agreement, the largest |Δ logit|.
    .venv/bin/python prompt_attention_quality.py 512 2048"""
import os, sys, sysconfig, torch
import specdec
from specdec.cpu import cpu_description
from specdec.kernels.layers import CppLayers

torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b")
twin = target.backend.prompt_backend
decoder = twin.decoder
ops = decoder.layer_runner.ops
ops.set_prompt_attention_kind("avx512-bf16")
text = open(os.path.join(sysconfig.get_paths()["stdlib"], "argparse.py")).read()
ids = target.tokenizer.encode(text)
runners = {"float32 attention": CppLayers(decoder), "AVX512-BF16 prompt attention": CppLayers(decoder, prompt_passes=True)}
print(f"# {cpu_description()}")
for n in [int(a) for a in sys.argv[1:]] or [512, 2048]:
    tokens = torch.tensor(ids[: n + 1])
    logits = {}
    for name, runner in runners.items():
        decoder.set_layer_runner(runner, runner.ragged)
        state = twin.new_state(n + 8)
        logits[name] = twin.forward(state, tokens[:n], num_logits=n).float()
    (a, la), (b, lb) = logits.items()
    nll = {k: torch.nn.functional.cross_entropy(v, tokens[1:]).item() for k, v in logits.items()}
    agree = (la.argmax(-1) == lb.argmax(-1)).float().mean().item()
    print(f"{n} tokens: NLL {a} {nll[a]:.4f}, {b} {nll[b]:.4f}; top-1 agreement {agree:.4f}; "
          f"max |Δ logit| {(la - lb).abs().max().item():.3f}", flush=True)
