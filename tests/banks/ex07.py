"""Implementations of exercise ex07 that a learner could plausibly write: wrong ones and right ones.

Every implementation uses only what the notebook's setup cell imports (``math``, ``torch``, ``F``, ``nn``),
and the classes of the cells above it (the reference's ``MultiHeadAttention``, as learner code). Expectations
name *exactly* the test cells that reject an implementation (``_bank.py``).
"""

import math

import torch
import torch.nn.functional as F

from tests.banks._bank import Row
from tests.banks.ex04 import MHA

BLOCK = """class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, dropout=0.0):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def attention(self, x, mask):
        return self.dropout(self.self_attn(x, x, x, mask)[0])

    def feed_forward(self, x):
        return self.dropout(self.linear2(self.dropout(torch.relu(self.linear1(x)))))

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.attention(self.norm1(x), mask)
            x = x + self.feed_forward(self.norm2(x))
        else:
            x = self.norm1(x + self.attention(x, mask))
            x = self.norm2(x + self.feed_forward(x))
        return x
"""

GENERATE = """def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    tokens = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(tokens)[:, -1, :]
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probabilities = torch.softmax(logits, dim=-1)
                next_token = torch.multinomial(probabilities, 1, generator=generator)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens
"""

BASES = {"MultiHeadAttention": MHA, "TransformerBlock": BLOCK, "generate": GENERATE}


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


MATCHES = "block_matches_torch"

ROWS = [
    Row(
        "MultiHeadAttention",
        "no_output_projection",
        "output = self.w_o(heads.transpose(1, 2).reshape(batch, q_len, self.d_model))",
        "output = heads.transpose(1, 2).reshape(batch, q_len, self.d_model)",
        {"mha_carried_over": "output projection"},
    ),
    Row(
        "TransformerBlock",
        "always_post_ln",
        "        if self.norm_first:\n",
        "        if False:\n",
        every((MATCHES, "block_dropout"), "although norm_first=True"),
    ),
    Row(
        "TransformerBlock",
        "norm_first_inverted",
        "        if self.norm_first:\n",
        "        if not self.norm_first:\n",
        {MATCHES: "the wrong way round", "block_dropout": "although norm_first=True"},
    ),
    Row(
        "TransformerBlock",
        "no_residual_around_attention",
        "            x = self.norm1(x + self.attention(x, mask))\n",
        "            x = self.norm1(self.attention(x, mask))\n",
        {MATCHES: "residual connection around self-attention"},
    ),
    Row(
        "TransformerBlock",
        "no_residual_around_the_feed_forward",
        "            x = x + self.feed_forward(self.norm2(x))\n",
        "            x = self.feed_forward(self.norm2(x))\n",
        every((MATCHES, "block_dropout"), "residual connection around the feed-forward"),
    ),
    Row(
        "TransformerBlock",
        "norms_swapped",
        "            x = x + self.attention(self.norm1(x), mask)\n"
        "            x = x + self.feed_forward(self.norm2(x))\n",
        "            x = x + self.attention(self.norm2(x), mask)\n"
        "            x = x + self.feed_forward(self.norm1(x))\n",
        every((MATCHES, "block_dropout"), "norms are swapped"),
    ),
    Row(
        "TransformerBlock",
        "gelu",
        "torch.relu(self.linear1(x))",
        "F.gelu(self.linear1(x))",
        every((MATCHES, "block_dropout"), "GELU"),
    ),
    Row(
        "TransformerBlock",
        "no_norm_after_the_feed_forward",
        "            x = self.norm2(x + self.feed_forward(x))\n",
        "            x = x + self.feed_forward(x)\n",
        {MATCHES: "norm2 after the feed-forward", "block_parameters": "norm2.weight gets no gradient"},
    ),
    Row(
        "TransformerBlock",
        "mask_inverted",
        "return self.dropout(self.self_attn(x, x, x, mask)[0])",
        "return self.dropout(self.self_attn(x, x, x, None if mask is None else ~mask)[0])",
        every((MATCHES, "block_dropout"), "the mask is inverted"),
    ),
    Row(
        "TransformerBlock",
        "functional_dropout_always",
        "        return self.dropout(self.self_attn(x, x, x, mask)[0])\n",
        "        return F.dropout(self.self_attn(x, x, x, mask)[0], self.dropout.p)\n",
        {"block_dropout": "applied in eval() mode too"},
    ),
    Row(
        "TransformerBlock",
        "no_dropout",
        "        self.dropout = nn.Dropout(dropout)\n",
        "        self.dropout = nn.Identity()\n",
        {"block_dropout": "not random"},
    ),
    Row(
        "TransformerBlock",
        "three_layer_norms",
        "        self.norm2 = nn.LayerNorm(d_model)\n",
        "        self.norm2 = nn.LayerNorm(d_model)\n        self.norm3 = nn.LayerNorm(d_model)\n",
        {"block_parameters": "three layer norms"},
    ),
    Row(
        "generate",
        "last_token_only",
        "logits = model(tokens)[:, -1, :]",
        "logits = model(tokens[:, -1:])[:, -1, :]",
        {"generate_greedy": "only the last token", "generate_sampling": "not one of the 3 most likely"},
    ),
    Row(
        "generate",
        "first_position",
        "logits = model(tokens)[:, -1, :]",
        "logits = model(tokens)[:, 0, :]",
        {"generate_greedy": "first position", "generate_sampling": "not one of the 3 most likely"},
    ),
    Row(
        "generate",
        "new_tokens_only",
        "    return tokens\n",
        "    return tokens[:, prompt.size(1) :]\n",
        every(("generate_greedy", "generate_sampling"), "only the new tokens"),
    ),
    Row(
        "generate",
        "no_greedy_branch",
        "            if temperature == 0:\n",
        "            if False:\n",
        every(("generate_greedy",), "temperature=0 is greedy"),
    ),
    Row(
        "generate",
        "temperature_multiplied",
        "logits = logits / temperature",
        "logits = logits * temperature",
        {"generate_sampling": "multiplied by the temperature"},
    ),
    Row(
        "generate",
        "temperature_ignored",
        "logits = logits / temperature",
        "logits = logits",
        {"generate_sampling": "temperature is ignored"},
    ),
    Row(
        "generate",
        "top_k_smallest",
        "kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]",
        "kth = torch.topk(logits, top_k, dim=-1, largest=False).values[:, -1:]",
        {"generate_sampling": "not one of the 3 most likely"},
    ),
    Row(
        "generate",
        "global_random_state",
        "torch.multinomial(probabilities, 1, generator=generator)",
        "torch.multinomial(probabilities, 1)",
        {"generate_sampling": "not from the global random state"},
    ),
]

WHOLE = {}


# --- correct implementations in other styles

BLOCK_SEPARATE_DROPOUTS = """class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, dropout=0.0):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, mask=None):
        sublayers = (
            (self.norm1, lambda y: self.dropout1(self.self_attn(y, y, y, mask=mask)[0])),
            (self.norm2, lambda y: self.dropout2(self.linear2(self.dropout3(F.relu(self.linear1(y)))))),
        )
        for norm, sublayer in sublayers:
            x = x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))
        return x
"""

RIGHT_CLASSES = {"separate_dropouts_in_a_loop": BLOCK_SEPARATE_DROPOUTS}


def generate__categorical_on_cpu(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    out = prompt.clone()
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(out)[:, -1].double()
        if temperature == 0:
            choice = torch.argmax(logits, dim=-1)
        else:
            scaled = logits / temperature
            if top_k:
                values, indices = scaled.topk(min(top_k, scaled.size(-1)), dim=-1)
                scaled = torch.full_like(scaled, float("-inf")).scatter(-1, indices, values)
            probabilities = F.softmax(scaled, dim=-1)
            device = generator.device if generator is not None else probabilities.device
            choice = torch.multinomial(probabilities.to(device), num_samples=1, generator=generator)[:, 0]
        out = torch.cat([out, choice.to(out.device)[:, None]], dim=-1)
    return out


def generate__inverse_cdf(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    tokens = prompt
    for _ in range(max_new_tokens):
        logits = model(tokens).detach()[:, -1]
        if temperature == 0:
            next_token = logits.argmax(-1, keepdim=True)
        else:
            if top_k is not None:
                threshold = logits.sort(dim=-1, descending=True).values[:, top_k - 1 : top_k]
                logits = torch.where(logits >= threshold, logits, -math.inf)
            cdf = torch.softmax(logits / temperature, dim=-1).cumsum(-1)
            u = torch.rand(cdf.size(0), 1, generator=generator, device=cdf.device, dtype=cdf.dtype)
            next_token = (cdf < u).sum(-1, keepdim=True).clamp_max(cdf.size(-1) - 1)
        tokens = torch.cat((tokens, next_token), 1)
    return tokens


RIGHT = [generate__categorical_on_cpu, generate__inverse_cdf]
