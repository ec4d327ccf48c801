"""ECOKV on keys captured from a PyTorch attention layer: the layer's K, V and its last queries go to ecokv.select as
they are (through numpy, no copy), and the kept tokens' K and V are gathered back with the returned indices; the
share of the window queries' attention that the kept tokens hold is printed beside a random choice's.
    python3 python/examples/torch_attention.py        (needs Debian's python3-torch: scripts/setup.sh --training)"""
import sys

import numpy as np
import torch

import ecokv

torch.manual_seed(1000001)
layers, heads, kv_heads, dim, tokens = 2, 4, 2, 32, 400


class Attention(torch.nn.Module):
    """A grouped-query attention layer that keeps its post-projection K, V and Q (RoPE left out for brevity)."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(128, heads * dim)
        self.k = torch.nn.Linear(128, kv_heads * dim)
        self.v = torch.nn.Linear(128, kv_heads * dim)

    def forward(self, x):
        t = x.shape[0]
        self.queries = self.q(x).view(t, heads, dim).transpose(0, 1)   # [heads, tokens, dim]
        self.keys = self.k(x).view(t, kv_heads, dim).transpose(0, 1)    # [kv_heads, tokens, dim]
        self.values = self.v(x).view(t, kv_heads, dim).transpose(0, 1)
        return self.keys


blocks = [Attention() for _ in range(layers)]
x = torch.randn(tokens, 128)
with torch.no_grad():
    for b in blocks:
        b(x)
        x = x + 0.1 * torch.randn_like(x)

window = 4
keys = torch.stack([b.keys for b in blocks]).contiguous()          # [layers, kv_heads, tokens, dim]
values = torch.stack([b.values for b in blocks]).contiguous()
queries = torch.stack([b.queries[:, -window:] for b in blocks]).contiguous()  # the window's queries


def mass(kept):
    """The share of the window queries' attention that falls on the kept tokens (1: nothing lost), averaged over heads;
    the kept K and V rows are gathered with the returned indices, as an engine would keep them."""
    shares = []
    for l in range(layers):
        for g in range(kv_heads):
            idx = torch.from_numpy(kept[l][g]).long()
            small_k, small_v = keys[l, g][idx], values[l, g][idx]  # what a compressed cache holds
            assert small_k.shape == (len(idx), dim) and small_v.shape == (len(idx), dim)
            for h in range(g * heads // kv_heads, (g + 1) * heads // kv_heads):
                p = torch.softmax(blocks[l].queries[h, -window:] @ keys[l, g].T / dim ** 0.5, -1)
                shares.append(float(p[:, idx].sum(-1).mean()))
    return sum(shares) / len(shares)


kept = ecokv.select(keys, queries, values=values, method="snapkv+ecokv", budget=64, window=window)
baseline = ecokv.select(keys, queries, method="random", budget=64, window=window, seed=1)
print(f"kept {sum(len(h) for layer in kept for h in layer)} of {layers * kv_heads * tokens} entries; the window "
      f"queries' attention on them: {100 * mass(kept):.1f}% with SnapKV + ECOKV, {100 * mass(baseline):.1f}% with "
      f"as many random tokens (random weights: attention is nearly uniform here, unlike a trained model's)")
sys.exit(0 if all(len(h) == 64 for layer in kept for h in layer) else 1)
