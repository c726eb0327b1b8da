#!/usr/bin/env python3
"""torch_gpt2.py: the same GPT-2 as the trainers, trained by PyTorch, for
make bench-cuda's side-by-side table (and the cpu device's, where PyTorch is
installed). Same shapes: L layers, C channels, H heads, the vocabulary padded
to a multiple of 128, pre-layernorm blocks, GELU (tanh), tied embeddings,
learned positions, no dropout, AdamW with fp32 weights and bf16 autocast.
Attention is PyTorch's scaled_dot_product_attention (causal), which picks its
flash kernel on a GPU.

usage: torch_gpt2.py [--device cuda|cpu] [--compile] [--model gpt2-124m]
                     [--batch 16] [--seq-len 1024] [--steps 20] [--warmup 3]
Prints one JSON object: tokens/s over the median step after the warm-up,
the step times, and the peak memory PyTorch's allocator held (cuda).
Exit 2 with one line where PyTorch, or the device asked for, is missing.
"""
import argparse
import json
import math
import statistics
import sys
import time

PRESETS = {  # layers, channels, heads (the workbench's gpt2 presets)
    "gpt2-124m": (12, 768, 12),
    "gpt2-350m": (24, 1024, 16),
    "gpt2-774m": (36, 1280, 20),
}
VOCAB, CONTEXT = 50257, 1024


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if not (1 <= a.seq_len <= CONTEXT) or a.batch < 1 or a.steps <= a.warmup:
        print(f"torch_gpt2.py: error: need 1 <= --seq-len <= {CONTEXT}, --batch >= 1, --steps > --warmup",
              file=sys.stderr)
        sys.exit(2)
    return a


def build(torch, L, C, H, Vp):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)  # (B,H,T,hs)
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(CONTEXT, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied head over the padded rows
            logits = logits[..., :VOCAB]                 # the padding is not a token
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))

    return GPT()


def main():
    a = parse()
    try:
        import torch
    except ImportError:
        print("torch_gpt2.py: error: PyTorch is not installed (python3 -c 'import torch' fails)", file=sys.stderr)
        sys.exit(2)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpt2.py: error: no GPU visible to PyTorch; hint: --device cpu", file=sys.stderr)
        sys.exit(2)
    L, C, H = PRESETS[a.model]
    Vp = (VOCAB + 127) // 128 * 128
    dev = torch.device(a.device)
    torch.manual_seed(1337)
    model = build(torch, L, C, H, Vp).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=a.device == "cuda")
    step_fn = torch.compile(model) if a.compile else model
    gen = torch.Generator(device="cpu").manual_seed(7)
    tokens = torch.randint(0, VOCAB, (a.batch, a.seq_len + 1), generator=gen).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(a.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    measured = times[a.warmup:]
    step_ms = statistics.median(measured)
    tokens_per_s = a.batch * a.seq_len / (step_ms / 1e3)
    # the workbench's model FLOPs per token: 6 Psi_matmul + 12 L C T (gpt_flops_per_token)
    flops_per_token = 6 * (L * 12 * C * C + VOCAB * C) + 12 * L * C * a.seq_len
    out = {
        "trainer": "pytorch " + ("torch.compile" if a.compile else "eager"),
        "torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "model": a.model, "params": params, "batch": a.batch, "seq_len": a.seq_len,
        "steps_measured": len(measured), "step_ms_median": step_ms,
        "step_ms_range": [min(measured), max(measured)], "tokens_per_s": tokens_per_s,
        "gflops": flops_per_token * tokens_per_s / 1e9,
        "peak_device_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None,
        "final_loss": losses[-1] if all(math.isfinite(v) for v in losses) else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
