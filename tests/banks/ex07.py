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
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, dropout=0.0, activation="relu"):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"unknown activation {activation!r}")
        self.norm_first = norm_first
        self.act = F.gelu if activation == "gelu" else torch.relu
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def attention(self, x, mask):
        return self.dropout(self.self_attn(x, x, x, mask)[0])

    def feed_forward(self, x):
        return self.dropout(self.linear2(self.dropout(self.act(self.linear1(x)))))

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
    if temperature < 0 or max_new_tokens < 0 or (top_k is not None and top_k < 1):
        raise ValueError("need temperature >= 0, max_new_tokens >= 0 and top_k >= 1")
    tokens = prompt
    window = getattr(model, "max_len", None)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = tokens if window is None else tokens[:, -window:]
            logits = model(context)[:, -1, :]
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    k = min(top_k, logits.size(-1))
                    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probabilities = torch.softmax(logits, dim=-1)
                next_token = torch.multinomial(probabilities, 1, generator=generator)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens
"""

BASES = {"MultiHeadAttention": MHA, "TransformerBlock": BLOCK, "generate": GENERATE}


def every(cells, fragment):
    return dict.fromkeys(cells, fragment)


MATCHES, PARAMETERS, DROPOUT = "block_matches_torch", "block_parameters", "block_dropout"
GREEDY, SAMPLING = "generate_greedy", "generate_sampling"
CHECKED_ACTIVATION = """        if activation not in ("relu", "gelu"):
            raise ValueError(f"unknown activation {activation!r}")
"""
CHECKED_GENERATE = """    if temperature < 0 or max_new_tokens < 0 or (top_k is not None and top_k < 1):
        raise ValueError("need temperature >= 0, max_new_tokens >= 0 and top_k >= 1")
"""
CAUSAL = """    def forward(self, x, mask=None):
        causal = torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device).tril()
        mask = causal if mask is None else mask & causal
"""


def block(variant: str, find: str, replace: str, expected: dict[str, str]) -> Row:
    return Row("TransformerBlock", variant, find, replace, expected)


def generate(variant: str, find: str, replace: str, expected: dict[str, str]) -> Row:
    return Row("generate", variant, find, replace, expected)


ROWS = [
    Row(
        "MultiHeadAttention",
        "no_output_projection",
        "output = self.w_o(heads.transpose(1, 2).reshape(batch, q_len, self.d_model))",
        "output = heads.transpose(1, 2).reshape(batch, q_len, self.d_model)",
        {"mha_carried_over": "output projection"},
    ),
    block(
        "always_post_ln",
        "        if self.norm_first:\n",
        "        if False:\n",
        every((MATCHES, DROPOUT), "although norm_first=True"),
    ),
    block(
        "norm_first_inverted",
        "        if self.norm_first:\n",
        "        if not self.norm_first:\n",
        {MATCHES: "the wrong way round", DROPOUT: "although norm_first=True"},
    ),
    block(
        "no_residual_around_attention",
        "            x = self.norm1(x + self.attention(x, mask))\n",
        "            x = self.norm1(self.attention(x, mask))\n",
        every((MATCHES, DROPOUT), "residual connection around self-attention"),
    ),
    block(
        "no_residual_around_the_feed_forward",
        "            x = x + self.feed_forward(self.norm2(x))\n",
        "            x = self.feed_forward(self.norm2(x))\n",
        every((MATCHES, DROPOUT), "residual connection around the feed-forward"),
    ),
    block(
        "norms_swapped",
        "            x = x + self.attention(self.norm1(x), mask)\n"
        "            x = x + self.feed_forward(self.norm2(x))\n",
        "            x = x + self.attention(self.norm2(x), mask)\n"
        "            x = x + self.feed_forward(self.norm1(x))\n",
        every((MATCHES, DROPOUT), "norms are swapped"),
    ),
    block(
        "gelu",
        'self.act = F.gelu if activation == "gelu" else torch.relu',
        "self.act = F.gelu",
        every((MATCHES, DROPOUT), "uses GELU although activation='relu'"),
    ),
    block(
        "activation_ignored",
        'self.act = F.gelu if activation == "gelu" else torch.relu',
        "self.act = torch.relu",
        {MATCHES: "the activation argument is ignored"},
    ),
    block("unknown_activation_accepted", CHECKED_ACTIVATION, "", {MATCHES: "should raise ValueError"}),
    block(
        "heads_fall_back_to_one",
        "        self.self_attn = MultiHeadAttention(d_model, n_heads)\n",
        "        if d_model % n_heads:  # heads that do not divide d_model: one head instead\n"
        "            n_heads = 1\n"
        "        self.self_attn = MultiHeadAttention(d_model, n_heads)\n",
        {MATCHES: "exercise 4's class raises ValueError there"},
    ),
    block(
        "no_norm_after_the_feed_forward",
        "            x = self.norm2(x + self.feed_forward(x))\n",
        "            x = x + self.feed_forward(x)\n",
        {
            MATCHES: "norm2 after the feed-forward",
            PARAMETERS: "norm2.weight gets no gradient",
            DROPOUT: "norm2 after the feed-forward",
        },
    ),
    block(
        "mask_inverted",
        "return self.dropout(self.self_attn(x, x, x, mask)[0])",
        "return self.dropout(self.self_attn(x, x, x, None if mask is None else ~mask)[0])",
        every((MATCHES, DROPOUT), "the mask is inverted"),
    ),
    block(
        "always_causal",
        "    def forward(self, x, mask=None):\n",
        CAUSAL,
        {MATCHES: "applies a causal mask of its own"},
    ),
    block(
        "returns_float32",
        "        return x\n",
        "        return x.float()\n",
        {MATCHES: "must have x's dtype"},
    ),
    block(
        "linear_without_bias",
        "self.linear1 = nn.Linear(d_model, d_ff)",
        "self.linear1 = nn.Linear(d_model, d_ff, bias=False)",
        every((MATCHES, PARAMETERS, DROPOUT), "has no bias"),
    ),
    block(
        "functional_dropout_always",
        "        return self.dropout(self.self_attn(x, x, x, mask)[0])\n",
        "        return F.dropout(self.self_attn(x, x, x, mask)[0], self.dropout.p)\n",
        {DROPOUT: "applied in eval() mode too"},
    ),
    block(
        "no_dropout",
        "        self.dropout = nn.Dropout(dropout)\n",
        "        self.dropout = nn.Identity()\n",
        {DROPOUT: "not random"},
    ),
    block(
        "dropout_on_the_input",
        "    def forward(self, x, mask=None):\n",
        "    def forward(self, x, mask=None):\n        x = self.dropout(x)\n",
        {DROPOUT: "applied to the block's input"},
    ),
    block(
        "dropout_after_the_residual_sum",
        "            x = x + self.attention(self.norm1(x), mask)\n",
        "            h = self.norm1(x)\n            x = self.dropout(x + self.self_attn(h, h, h, mask)[0])\n",
        {DROPOUT: "after the residual sum"},
    ),
    block(
        "no_dropout_after_the_activation",
        "self.linear2(self.dropout(self.act(self.linear1(x))))",
        "self.linear2(self.act(self.linear1(x)))",
        {DROPOUT: "no dropout after the activation"},
    ),
    block(
        "no_attention_dropout_in_post_ln",
        "            x = self.norm1(x + self.attention(x, mask))\n",
        "            x = self.norm1(x + self.self_attn(x, x, x, mask)[0])\n",
        {DROPOUT: "no dropout on the self-attention's output"},
    ),
    block(
        "pytorch_default_dropout",
        "norm_first=False, dropout=0.0,",
        "norm_first=False, dropout=0.1,",
        {DROPOUT: "dropout left to its default"},
    ),
    block(
        "three_layer_norms",
        "        self.norm2 = nn.LayerNorm(d_model)\n",
        "        self.norm2 = nn.LayerNorm(d_model)\n        self.norm3 = nn.LayerNorm(d_model)\n",
        {PARAMETERS: "three layer norms"},
    ),
    generate(
        "last_token_only",
        "logits = model(context)[:, -1, :]",
        "logits = model(context[:, -1:])[:, -1, :]",
        {GREEDY: "only the last token", SAMPLING: "not one of the 3 most likely"},
    ),
    generate(
        "first_position",
        "logits = model(context)[:, -1, :]",
        "logits = model(context)[:, 0, :]",
        {GREEDY: "first position", SAMPLING: "not one of the 3 most likely"},
    ),
    generate(
        "new_tokens_only",
        "    return tokens\n",
        "    return tokens[:, prompt.size(1) :]\n",
        every((GREEDY, SAMPLING), "only the new tokens"),
    ),
    generate(
        "no_greedy_branch",
        "            if temperature == 0:\n",
        "            if False:\n",
        {GREEDY: "temperature=0 is greedy"},
    ),
    generate(
        "temperature_multiplied",
        "logits = logits / temperature",
        "logits = logits * temperature",
        {SAMPLING: "multiplied by the temperature"},
    ),
    generate(
        "temperature_ignored",
        "logits = logits / temperature",
        "logits = logits",
        {SAMPLING: "temperature is ignored"},
    ),
    generate(
        "top_k_smallest",
        "kth = torch.topk(logits, k, dim=-1).values[:, -1:]",
        "kth = torch.topk(logits, k, dim=-1, largest=False).values[:, -1:]",
        {SAMPLING: "not one of the 3 most likely"},
    ),
    generate(
        "top_k_keeps_k_minus_one",
        "logits.masked_fill(logits < kth,",
        "logits.masked_fill(logits <= kth,",
        {SAMPLING: "only k - 1 tokens are kept"},
    ),
    generate(
        "top_k_ties_dropped",
        "                    kth = torch.topk(logits, k, dim=-1).values[:, -1:]\n"
        '                    logits = logits.masked_fill(logits < kth, float("-inf"))\n',
        "                    values, indices = torch.topk(logits, k, dim=-1)\n"
        '                    logits = torch.full_like(logits, float("-inf")).scatter(-1, indices, values)\n',
        {SAMPLING: "tied with the k-th largest"},
    ),
    generate(
        "top_k_above_the_vocabulary",
        "k = min(top_k, logits.size(-1))",
        "k = top_k",
        {SAMPLING: "larger than the vocabulary"},
    ),
    generate(
        "global_random_state",
        "torch.multinomial(probabilities, 1, generator=generator)",
        "torch.multinomial(probabilities, 1)",
        {SAMPLING: "not from the global random state"},
    ),
    generate(
        "generator_required",
        "torch.multinomial(probabilities, 1, generator=generator)",
        "torch.multinomial(probabilities.to(generator.device), 1, generator=generator)",
        {SAMPLING: "generator may be None"},
    ),
    generate(
        "softmax_without_the_maximum",
        "probabilities = torch.softmax(logits, dim=-1)",
        "probabilities = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)",
        {SAMPLING: "overflows"},
    ),
    generate("no_checks", CHECKED_GENERATE, "", every((GREEDY, SAMPLING), "should raise ValueError")),
    generate(
        "window_ignored",
        "context = tokens if window is None else tokens[:, -window:]",
        "context = tokens",
        {GREEDY: "more than model.max_len tokens"},
    ),
    generate(
        "max_len_assumed",
        'window = getattr(model, "max_len", None)',
        "window = model.max_len",
        {GREEDY: "has no max_len attribute"},
    ),
]


def generate__int32_buffer(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    if temperature < 0 or max_new_tokens < 0 or (top_k is not None and top_k < 1):
        raise ValueError("bad arguments")
    batch, start = prompt.shape
    tokens = torch.zeros(batch, start + max_new_tokens, dtype=torch.int32, device=prompt.device)
    tokens[:, :start] = prompt
    window = getattr(model, "max_len", None) or start + max_new_tokens
    with torch.no_grad():
        for t in range(start, start + max_new_tokens):
            logits = model(tokens[:, max(0, t - window) : t])[:, -1]
            if temperature == 0:
                tokens[:, t] = logits.argmax(dim=-1)
                continue
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                logits[logits < logits.topk(top_k, dim=-1).values[:, -1:]] = -math.inf
            tokens[:, t] = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]
    return tokens


def generate__new_tokens_in_a_list(
    model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None
):
    if temperature < 0 or max_new_tokens < 0 or (top_k is not None and top_k < 1):
        raise ValueError("bad arguments")
    new = []
    window = getattr(model, "max_len", None)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            tokens = torch.cat([prompt, *new], dim=1)
            logits = model(tokens if window is None else tokens[:, -window:])[:, -1]
            if temperature == 0:
                new.append(logits.argmax(-1, keepdim=True))
                continue
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                logits = logits.masked_fill(logits < logits.topk(top_k).values[:, -1:], -math.inf)
            new.append(torch.multinomial(logits.softmax(-1), 1, generator=generator))
    return torch.cat([prompt, torch.cat(new, dim=1)], dim=1)


WHOLE = {
    generate__int32_buffer: {GREEDY: "stay in the prompt's dtype"},
    generate__new_tokens_in_a_list: {GREEDY: "with max_new_tokens=0 there is no new token"},
}


# --- correct implementations in other styles

BLOCK_SEPARATE_DROPOUTS = """class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, dropout=0.0, activation="relu"):
        super().__init__()
        self.act = {"relu": F.relu, "gelu": F.gelu}.get(activation)
        if self.act is None:
            raise ValueError("activation must be relu or gelu")
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, mask=None):
        sublayers = (
            (self.norm1, lambda y: self.dropout1(self.self_attn(y, y, y, mask=mask)[0])),
            (self.norm2, lambda y: self.dropout2(self.linear2(self.dropout3(self.act(self.linear1(y)))))),
        )
        for norm, sublayer in sublayers:
            x = x + sublayer(norm(x)) if self.norm_first else norm(x + sublayer(x))
        return x
"""

# the feed-forward network as nn.Sequential (its linear layers also the block's attributes), attention called
# by keyword, dropout drawn by hand with torch.rand_like and by F.dropout: other random numbers, same law
BLOCK_SEQUENTIAL = """class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, dropout=0.0, activation="relu"):
        super().__init__()
        activations = {"relu": nn.ReLU, "gelu": nn.GELU}
        if activation not in activations:
            raise ValueError(f"activation {activation} is neither relu nor gelu")
        self.norm_first, self.p = norm_first, dropout
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.ffn = nn.Sequential(self.linear1, activations[activation](), nn.Dropout(dropout), self.linear2)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def _sa(self, x, mask):
        out, _ = self.self_attn(query=x, key=x, value=x, mask=mask)
        if self.training and self.p > 0:
            out = out * (torch.rand_like(out) >= self.p) / (1 - self.p)
        return out

    def _ff(self, x):
        return F.dropout(self.ffn(x), self.p, training=self.training)

    def forward(self, x, mask=None):
        if not self.norm_first:
            x = self.norm1(x + self._sa(x, mask))
            return self.norm2(x + self._ff(x))
        x = x + self._sa(self.norm1(x), mask)
        return x + self._ff(self.norm2(x))
"""

RIGHT_CLASSES = {
    "separate_dropouts_in_a_loop": BLOCK_SEPARATE_DROPOUTS,
    "sequential_by_hand": BLOCK_SEQUENTIAL,
}


def generate__categorical_on_cpu(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be >= 1")
    out = prompt.clone()
    for _ in range(max_new_tokens):
        context = out[:, -model.max_len :] if hasattr(model, "max_len") else out
        with torch.no_grad():
            logits = model(context)[:, -1].double()
        if temperature == 0:
            choice = torch.argmax(logits, dim=-1)
        else:
            scaled = logits / temperature
            if top_k:
                values = scaled.topk(min(top_k, scaled.size(-1)), dim=-1).values
                scaled = scaled.masked_fill(scaled < values[:, -1:], float("-inf"))
            probabilities = F.softmax(scaled, dim=-1)
            device = generator.device if generator is not None else probabilities.device
            choice = torch.multinomial(probabilities.to(device), num_samples=1, generator=generator)[:, 0]
        out = torch.cat([out, choice.to(out.device)[:, None]], dim=-1)
    return out


def generate__inverse_cdf(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    if not (temperature >= 0 and max_new_tokens >= 0 and (top_k is None or top_k >= 1)):
        raise ValueError(f"invalid arguments: {temperature=}, {max_new_tokens=}, {top_k=}")
    tokens = prompt
    for _ in range(max_new_tokens):
        start = max(0, tokens.size(1) - getattr(model, "max_len", tokens.size(1)))
        logits = model(tokens[:, start:]).detach()[:, -1]
        if temperature == 0:
            next_token = logits.argmax(-1, keepdim=True)
        else:
            if top_k is not None:
                k = min(top_k, logits.size(-1))
                threshold = logits.sort(dim=-1, descending=True).values[:, k - 1 : k]
                logits = torch.where(logits >= threshold, logits, -math.inf)
            cdf = torch.softmax(logits / temperature, dim=-1).cumsum(-1)
            u = torch.rand(cdf.size(0), 1, generator=generator, device=cdf.device, dtype=cdf.dtype)
            next_token = (cdf < u).sum(-1, keepdim=True).clamp_max(cdf.size(-1) - 1)
        tokens = torch.cat((tokens, next_token), 1)
    return tokens


RIGHT = [generate__categorical_on_cpu, generate__inverse_cdf]
