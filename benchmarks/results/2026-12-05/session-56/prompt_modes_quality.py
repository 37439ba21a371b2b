"""Context for prompt_attention_quality.py: how far the int8 prompt twin (float32 or bf16 attention) already is
from the int4 model decoding with, teacher-forced over argparse.py: top-1 agreement, max |Δ logit|, NLL."""
import os, sys, sysconfig, torch
import specdec
from specdec.kernels.layers import CppLayers
torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b")
twin = target.backend.prompt_backend
std = sysconfig.get_paths()["stdlib"]
ids = target.tokenizer.encode(open(os.path.join(std, "argparse.py")).read())
for n in [512, 2048]:
    tokens = torch.tensor(ids[: n + 1])
    main = target.backend.forward(target.backend.new_state(n + 8), tokens[:n], num_logits=n).float()
    tw = twin.forward(twin.new_state(n + 8), tokens[:n], num_logits=n).float()
    d = twin.decoder; r = CppLayers(d); d.set_layer_runner(r, r.ragged)
    tw32 = twin.forward(twin.new_state(n + 8), tokens[:n], num_logits=n).float()
    r = CppLayers(d, prompt_passes=True); d.set_layer_runner(r, r.ragged)
    for name, x in (("int8 twin bf16-attn", tw), ("int8 twin fp32-attn", tw32)):
        print(n, f"int4 main vs {name}: top-1 agreement {(main.argmax(-1) == x.argmax(-1)).float().mean():.4f} max|Δ| {(main - x).abs().max():.3f} NLL {torch.nn.functional.cross_entropy(x, tokens[1:]):.4f}", flush=True)
    print(n, f"int4 main NLL {torch.nn.functional.cross_entropy(main, tokens[1:]):.4f}")
