"""A tiny causal language model (token ids in, logits out) for the throughput tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        shape = (b, s, self.heads, d // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def lm_step(model: TinyLM, opt: torch.optim.Optimizer, batch: int = 4, seq: int = 16) -> None:
    ids = torch.randint(0, model.embed.num_embeddings, (batch, seq))
    logits = model(input_ids=ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
